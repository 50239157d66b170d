"""torch.distributed.checkpoint (torchtitan's ``step-<N>`` folders): ``dcp.load(sd, checkpoint_id=last_good(d))``.

DCP has no fallback of its own: a folder whose ``.metadata`` names a rank file that is missing or short
fails the load, and the caller picks the folder.
"""

from __future__ import annotations

import os
from typing import Optional

from . import last_good_unit


def last_good(folder: str | os.PathLike, audit: Optional[str | os.PathLike] = None,
              must_exist: bool = False) -> Optional[str]:
    """The DCP checkpoint folder to pass as ``checkpoint_id``: the newest under ``folder`` that passes every
    check; None when there is none yet.  Raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when there
    are checkpoints and none can be resumed from."""
    ckpt = last_good_unit(folder, audit=audit, must_exist=must_exist)
    return str(ckpt.path) if ckpt is not None else None
