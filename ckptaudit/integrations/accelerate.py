"""Accelerate: ``accelerator.load_state(last_good(project_dir))``.

``load_state()`` with automatic checkpoint naming takes the ``checkpoint_<i>`` folder with the largest
trailing number whatever it holds, and raises when a folder's ``custom_checkpoint_<i>.pkl`` files are not one
per registered object (:mod:`ckptaudit.producers.accelerate`).
"""

from __future__ import annotations

import os
from typing import Optional

from . import last_good_unit


def last_good(project_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None) -> Optional[str]:
    """The folder to pass to ``load_state``: the newest ``save_state`` folder under ``project_dir`` (its
    ``checkpoints/`` included) that passes every check and resumes the run faithfully; None when there is none
    yet.  Raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when there are folders and none can be
    resumed from."""
    ckpt = last_good_unit(project_dir, audit=audit)
    return str(ckpt.path) if ckpt is not None else None
