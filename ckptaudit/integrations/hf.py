"""Hugging Face Trainer: ``trainer.train(resume_from_checkpoint=last_good(args.output_dir))``.

The Trainer's own ``resume_from_checkpoint=True`` takes ``trainer_utils.get_last_checkpoint(output_dir)``, the
``checkpoint-<N>`` folder with the largest N whatever it holds (a save cut short, a folder without
``scheduler.pt`` whose optimizer the resume then drops: :mod:`ckptaudit.producers.hf_trainer`).
"""

from __future__ import annotations

import os
from typing import Optional

from . import last_good_unit


def last_good(output_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None) -> Optional[str]:
    """The path of the ``checkpoint-<N>`` folder to pass as ``resume_from_checkpoint``: the newest that passes
    every check and resumes the run faithfully; None when ``output_dir`` holds no checkpoint yet (the
    Trainer then starts fresh).  Raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when it holds
    checkpoints and none can be resumed from."""
    ckpt = last_good_unit(output_dir, audit=audit)
    return str(ckpt.path) if ckpt is not None else None
