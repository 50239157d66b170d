"""ultralytics: ``YOLO(ultralytics.last_good(run_dir)).train(resume=True)``.

``YOLO("runs/detect/train/weights/last.pt").train(resume=True)`` resumes ``last.pt`` whatever it holds, and
``save_model`` writes it in place (ultralytics 8.4.190 ``ultralytics/engine/trainer.py`` :832: ``Path.write_bytes``,
no temporary name): a kill inside that write leaves a cut ``last.pt`` that the resume cannot load, while
``best.pt`` (:833-834) still holds a full, resumable save of an earlier epoch.  :func:`last_good` names the newest
file of the run's ``weights/`` folder that ``train(resume=True)`` continues faithfully; a finished run (both files
stripped by ``strip_optimizer``, nothing to resume) raises, as its weights can only start a new training.
"""

from __future__ import annotations

import os
from typing import Optional

from . import last_good_unit

__all__ = ["last_good"]


def last_good(run_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None) -> Optional[str]:
    """The ``.pt`` path to give ``YOLO(...)`` before ``.train(resume=True)``, for the training run folder
    ``run_dir`` (the one holding ``weights/``, or that ``weights/`` folder itself); None when it holds no
    checkpoint yet.  Raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when it holds checkpoints and
    none resumes the run (a damaged one, or a finished run's stripped weights)."""
    ckpt = last_good_unit(run_dir, audit=audit)
    return str(ckpt.path) if ckpt is not None else None
