"""One line to resume safely in each framework: the unit its own resume call should load.

Every framework resumes from whatever its resume call is given, and most default to the newest checkpoint
folder whatever it holds (``get_last_checkpoint``, ``load_state()``, Lightning's ``"last"``). These functions
give that call the unit the audit names as its rollback point instead, through the reader
(:func:`ckptaudit.safe_load_checkpoint` with ``load=False``: every unit's metadata, then the newest candidate
byte by byte; nothing is unpickled or loaded here), in each framework's own terms:

- HF Trainer: ``trainer.train(resume_from_checkpoint=hf.last_good(args.output_dir))``;
- Lightning: ``trainer.fit(model, ckpt_path=lightning.last_good(dirpath))``;
- Accelerate: ``accelerate.load_last_good(accelerator)`` (``load_state`` of ``accelerate.last_good``, and the
  next save's number past every folder there);
- DeepSpeed: ``engine.load_checkpoint(save_dir, tag=deepspeed.last_good_tag(save_dir))``;
- DCP: ``dcp.load(state_dict, checkpoint_id=dcp.last_good(folder))``;
- torchtitan: ``--checkpoint.load_step $(python -m ckptaudit.integrations.torchtitan <dump>/checkpoint)``
  (``torchtitan.last_good_step(folder)``; ``-1`` when the folder holds no save yet);
- timm: ``python train.py ... --resume <timm.last_good(output_dir)>``;
- ultralytics: ``YOLO(ultralytics.last_good(run_dir)).train(resume=True)``.

Each returns None when the folder holds no checkpoint yet (a first start: the framework starts fresh), and
raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when it holds checkpoints but none the framework
can resume from faithfully (every one damaged, or only weights left: a warm start is a decision for a
person, not for a restart loop).  No framework is imported here.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from ..safe_load import LoadedCheckpoint, NoUsableCheckpointError

__all__ = ["last_good_unit", "NoUsableCheckpointError"]

_log = logging.getLogger("ckptaudit")


def last_good_unit(run_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None,
                   must_exist: bool = False) -> Optional[LoadedCheckpoint]:
    """The rollback unit of ``run_dir`` for a resume (``usable_for == "resume"``), as the reader finds it with
    ``load=False``; None when ``run_dir`` is missing or holds no checkpoint unit.  ``run_dir`` may also be one
    unit (a ``checkpoint-40/`` folder, a checkpoint file): that unit, judged alone.  ``audit``: a finished audit
    of the run to start from (:func:`ckptaudit.safe_load_checkpoint`).  Raises ``NoUsableCheckpointError``
    when units exist but none can be resumed from.

    A missing ``run_dir`` is a first start only if the path is right: a mistyped one would start training from
    step 0 without a word, so it is logged as a warning with its absolute path, and ``must_exist=True`` raises
    ``FileNotFoundError`` instead (for jobs that always resume)."""
    from ..safe_load import safe_load_checkpoint

    root = Path(run_dir)
    if not root.exists():
        where = os.path.abspath(root)
        if must_exist:
            raise FileNotFoundError(f"{where}: no such checkpoint folder (must_exist=True)")
        _log.warning("ckptaudit: %s does not exist: no checkpoint to resume from, the job starts from step 0 "
                     "(a first start, or a wrong path: pass must_exist=True to make a wrong path an error)", where)
        return None
    try:
        ckpt = safe_load_checkpoint(root, load=False, audit=audit)
    except NoUsableCheckpointError as e:
        if not e.reasons:  # nothing that is a checkpoint: a first start
            return None
        raise
    if ckpt.usable_for != "resume":
        raise NoUsableCheckpointError(str(root), {**ckpt.skipped, ckpt.unit: (
            f"usable for a warm start only ({ckpt.usable_for}): resuming from it would not continue the run; "
            f"load its weights yourself if a warm start is what you want")})
    return ckpt
