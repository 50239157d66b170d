"""DeepSpeed: ``engine.load_checkpoint(save_dir, tag=last_good_tag(save_dir))``.

``load_checkpoint(save_dir)`` without a tag reads the tag from ``save_dir/latest``, which DeepSpeed writes
after the save's files; a save cut short after it, or a ``latest`` naming a deleted tag, resumes from nothing
usable, and DeepSpeed has no fallback.
"""

from __future__ import annotations

import os
from typing import Optional

from . import last_good_unit


def last_good_tag(save_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None,
                  must_exist: bool = False) -> Optional[str]:
    """The tag (``global_step<N>``) to pass to ``load_checkpoint``: the newest tag folder under ``save_dir``
    that passes every check; None when there is none yet.  Raises
    :class:`ckptaudit.safe_load.NoUsableCheckpointError` when there are tags and none can be resumed from."""
    ckpt = last_good_unit(save_dir, audit=audit, must_exist=must_exist)
    return ckpt.path.name if ckpt is not None else None
