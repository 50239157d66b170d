"""torchtitan: ``--checkpoint.load_step $(python -m ckptaudit.integrations.torchtitan <checkpoint folder>)``.

torchtitan's ``CheckpointManager.load()`` (``checkpoint.load_step = -1``) takes the highest ``step-N`` that holds
a ``.metadata`` (``_find_load_step``, torchtitan 0.3.0 ``components/checkpointer/dcp.py`` :640-684), whatever
is in it: a save missing a rank's file, or the model-only save of a finished run's last step
(``last_save_model_only=True``), makes the resume raise, and torchtitan has no fallback.
``--checkpoint.load_step N`` loads ``step-N`` instead (:554-567): :func:`last_good_step` is the N the audit
names (:mod:`ckptaudit.producers.torchtitan`).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from ..producers.torchtitan import step_of
from . import last_good_unit


def last_good_step(folder: str | os.PathLike, audit: Optional[str | os.PathLike] = None) -> Optional[int]:
    """The step to pass as ``--checkpoint.load_step``: that of the newest ``step-N`` under ``folder`` (torchtitan's
    ``checkpoint.folder`` under its dump folder) that passes every check; None when there is none yet (a first
    start: ``-1`` lets torchtitan start fresh).  Raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when
    there are checkpoints and none can be resumed from, and ``ValueError`` when the unit the audit names is no
    ``step-N`` folder (``--checkpoint.load_step`` cannot name it)."""
    ckpt = last_good_unit(folder, audit=audit)
    if ckpt is None:
        return None
    step = step_of(ckpt.unit)
    if step is None:
        raise ValueError(f"{ckpt.path}: the unit to resume from is not a step-<N> folder, so "
                         f"--checkpoint.load_step cannot name it")
    return step


def main(argv=None) -> int:
    """Print the ``--checkpoint.load_step`` value for the checkpoint folder given (``-1`` when it holds no save
    yet); exit 2 with the reasons on stderr when nothing there can be resumed from."""
    from ..safe_load import NoUsableCheckpointError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {__name__} <checkpoint folder>", file=sys.stderr)
        return 3
    try:
        step = last_good_step(args[0])
    except NoUsableCheckpointError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(-1 if step is None else step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
