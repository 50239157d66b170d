"""timm: ``--resume "$(python -c 'from ckptaudit.integrations import timm; print(timm.last_good(OUT))')"``.

That is, train.py's ``--resume`` given the file :func:`last_good` names in its output folder ``OUT``.

train.py's ``--resume PATH`` (huggingface/pytorch-image-models train.py :120, :985-1005) loads whatever file it is
given, and the documented practice is ``last.pth.tar``; ``resume_task_checkpoint`` returns the saved epoch + 1 and
train.py starts there.  ``CheckpointSaver`` (timm 1.0.31 ``timm/utils/checkpoint_saver.py`` :188-221) replaces
``last.pth.tar`` atomically, but nothing in timm checks what it holds: a run whose loss went NaN keeps saving, and
``--resume last.pth.tar`` continues from NaN weights.  :func:`last_good` names the newest ``*.pth.tar`` of the
output folder that resumes the run faithfully (intact, finite, never a ``tmp.pth.tar`` left by a killed save), the
same epoch's ``checkpoint-<epoch>.pth.tar`` rather than its ``last.pth.tar`` link.
"""

from __future__ import annotations

import os
from typing import Optional

from . import last_good_unit

__all__ = ["last_good"]


def last_good(output_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None) -> Optional[str]:
    """The ``*.pth.tar`` path to pass to train.py's ``--resume`` (or to ``resume_checkpoint``) for the run
    ``CheckpointSaver`` writes into ``output_dir``; None when it holds no checkpoint yet.  Raises
    :class:`ckptaudit.safe_load.NoUsableCheckpointError` when it holds checkpoints and none resumes the run."""
    ckpt = last_good_unit(output_dir, audit=audit)
    return str(ckpt.path) if ckpt is not None else None
