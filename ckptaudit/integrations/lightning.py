"""Lightning: ``trainer.fit(model, ckpt_path=last_good(checkpoint_callback.dirpath))``.

``ckpt_path="last"`` loads ``last.ckpt`` (or the newest ``*.ckpt`` by mtime) whatever it holds; a
``last.ckpt`` that is a damaged second copy, or a symlink to a cut save, resumes from nothing usable.
"""

from __future__ import annotations

import os
from typing import Optional

from . import last_good_unit


def last_good(dirpath: str | os.PathLike, audit: Optional[str | os.PathLike] = None) -> Optional[str]:
    """The ``.ckpt`` path to pass as ``ckpt_path``: the newest that passes every check and resumes the run
    faithfully; None when ``dirpath`` holds no checkpoint yet.  Raises
    :class:`ckptaudit.safe_load.NoUsableCheckpointError` when it holds checkpoints and none can be resumed
    from."""
    ckpt = last_good_unit(dirpath, audit=audit)
    return str(ckpt.path) if ckpt is not None else None
