"""Accelerate: ``load_last_good(accelerator)`` (or ``accelerator.load_state(last_good(project_dir))``).

``load_state()`` with automatic checkpoint naming takes the ``checkpoint_<i>`` folder with the largest
trailing number whatever it holds, and raises when a folder's ``custom_checkpoint_<i>.pkl`` files are not one
per registered object (:mod:`ckptaudit.producers.accelerate`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from . import last_good_unit

_NUMBERED = re.compile(r"checkpoint_(\d+)")  # automatic checkpoint naming's folders


def last_good(project_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None,
              must_exist: bool = False) -> Optional[str]:
    """The folder to pass to ``load_state``: the newest ``save_state`` folder under ``project_dir`` (its
    ``checkpoints/`` included) that passes every check and resumes the run faithfully; None when there is none
    yet.  Raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when there are folders and none can be
    resumed from."""
    ckpt = last_good_unit(project_dir, audit=audit, must_exist=must_exist)
    return str(ckpt.path) if ckpt is not None else None


def load_last_good(accelerator, project_dir: str | os.PathLike | None = None,
                   audit: Optional[str | os.PathLike] = None, must_exist: bool = False) -> Optional[str]:
    """``accelerator.load_state(last_good(project_dir))``, and, with automatic checkpoint naming, the next
    save's number set past every ``checkpoint_<i>`` folder there (``load_state`` leaves
    ``project_configuration.iteration`` at 0, and ``save_state`` refuses a folder that exists: accelerate
    ``accelerator.py`` ``save_state``; a damaged newer folder is kept, not overwritten).  Returns the folder
    loaded, or None (nothing loaded: a first start).  ``project_dir`` defaults to ``accelerator.project_dir``.
    Raises what :func:`last_good` raises."""
    root = Path(project_dir if project_dir is not None else accelerator.project_dir)
    path = last_good(root, audit=audit, must_exist=must_exist)
    if path is None:
        return None
    accelerator.load_state(path)
    config = accelerator.project_configuration
    if getattr(config, "automatic_checkpoint_naming", False):
        taken = [int(m.group(1)) for p in (root / "checkpoints").glob("checkpoint_*")
                 if (m := _NUMBERED.fullmatch(p.name))]
        config.iteration = max(taken, default=-1) + 1
    return path
