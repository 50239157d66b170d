"""timm (pytorch-image-models): ``CheckpointSaver``'s epoch-numbered ``*.pth.tar`` files, resumed at the next epoch.

Sources: the timm 1.0.31 wheel (which wrote the tests' runs) for ``timm/``; ``train.py`` (not in the wheel) from
huggingface/pytorch-image-models at commit aa4b5850 (the newest in the mirror, 1.0.29.dev0; its calls of the
functions below exist unchanged in 1.0.31).

* ``timm/utils/checkpoint_saver.py``: ``save_checkpoint(epoch, metric)`` (:188-221) ``torch.save``\\ s into
  ``tmp.pth.tar`` (``_save`` :99-121), ``os.replace``\\ s it onto ``last.pth.tar`` (``_replace`` :78-85), then, while
  it ranks among ``max_history`` (default 10), hard-links ``last.pth.tar`` as ``checkpoint-<epoch>.pth.tar``
  (``_checkpoint_path`` :171, ``_duplicate`` :87-97, ``shutil.copy2`` where links fail) and, for the best metric
  yet, as ``model_best.pth.tar`` (:242-247).  A kill inside the save leaves ``tmp.pth.tar`` cut and ``last.pth.tar``
  on the save before.  ``save_recovery`` (:264-280) writes ``recovery_tmp.pth.tar`` then renames it
  ``recovery-<epoch>-<batch>.pth.tar``; ``save_milestone`` (:249-262) links ``milestone-<completed epochs>.pth.tar``.
* What a file holds (``_save`` :99-121): ``epoch`` (the epoch just trained, 0-based), ``arch``, ``optimizer``
  (``optimizer.state_dict()``), ``version`` 2 ("version < 2 increments epoch before save"), ``args`` (train.py's
  ``argparse.Namespace``), the loss scaler's state under its ``state_dict_key`` (``NativeScaler``: ``amp_scaler``,
  ``ApexScaler``: ``amp``; ``timm/utils/cuda.py`` :18, :47), ``state_dict`` and ``state_dict_ema`` (the model and
  its EMA, through the task's ``get_checkpoint_state``, ``timm/task/task.py`` :197-214, with ``task_state`` /
  ``task_state_ema`` when the task has state of its own), ``metric`` and the saver's bookkeeping ``saver``.
  No LR scheduler and no RNG state: train.py rebuilds the scheduler and steps it to the start epoch
  (train.py :1080-1095).
* The resume: train.py ``--resume PATH`` (:120; no default, the documented practice is ``last.pth.tar``) calls
  ``resume_task_checkpoint(task, path, optimizer, loss_scaler)`` (:985-993; ``timm/task/_helpers.py`` :23-80) and
  ``load_task_ema_checkpoint`` (:1004-1005; :83-105); ``timm.models.resume_checkpoint`` (``timm/models/_helpers.py``
  :261-315) is the older same logic.  It loads ``state_dict`` (required), then ``optimizer`` and the scaler's key
  when present, and returns ``epoch + 1`` when ``version`` > 1, else ``epoch`` (the ImageNet example's files,
  which saved ``epoch + 1`` already); train.py starts at that epoch (:1089-1090).  The load is
  ``torch.load(weights_only=True)`` inside ``torch.serialization.safe_globals([argparse.Namespace])``
  (``_load_train_checkpoint`` :15-20; ``_torch_load`` ``timm/models/_helpers.py`` :41-75).

The audit: a unit's step is the epoch that resume continues at (``checkpoint-4.pth.tar`` holds epoch 4 and resumes
at 5), from the saved ``epoch`` and ``version`` and, for the name, the number plus one; ``tmp.pth.tar`` and
``recovery_tmp.pth.tar`` are saves in progress.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .contract import WO, Contract, FileRole, Producer, ResumeLoad
from .paths import base, join

#: ``CheckpointSaver``'s file names (``extension = '.pth.tar'``, :71), in-progress ones included
UNIT_NAMES = r"(?:checkpoint-\d+|last|model_best|tmp|recovery-\d+-\d+|recovery_tmp|milestone-\d+)\.pth\.tar"
#: the epoch in ``checkpoint-<epoch>.pth.tar``; the resume continues at the next epoch
NAME_STEP = r"^checkpoint-(\d+)\.pth\.tar$"
WHY_TMP = ("timm CheckpointSaver's save in progress: it torch.saves into {name} and renames it ({to}) once written; "
           "a file left under this name is a save that never returned")
IN_PROGRESS = ((r"^tmp\.pth\.tar$", WHY_TMP.format(name="tmp.pth.tar", to="os.replace onto last.pth.tar")),
               (r"^recovery_tmp\.pth\.tar$",
                WHY_TMP.format(name="recovery_tmp.pth.tar", to="to recovery-<epoch>-<batch>.pth.tar")))
#: what ``resume_task_checkpoint`` / ``resume_checkpoint`` add to the saved ``epoch`` when ``version`` > 1
RESUME_NEXT = 1
_LAST = "last.pth.tar"

CONTRACT = Contract(
    producer="timm", framework="timm", versions="timm 1.x (tested 1.0.31)",
    layouts=("timm",), match_keys=("epoch", "arch", "state_dict", "optimizer"),
    files=(FileRole("*.pth.tar", "mixed", WO + " with argparse.Namespace allowed (resume_task_checkpoint)"),),
    keys={"weights": ("state_dict",), "optimizer": ("optimizer",), "scaler": ("amp_scaler", "amp"),
          "metadata": ("args", "arch", "saver", "metric", "version", "task_state", "task_state_ema")},
    epoch_at=("*:epoch",),
    saves=frozenset({"weights", "optimizer", "step"}), never_saves=frozenset({"scheduler", "rng"}),
)


def resume_step(tree: dict) -> Optional[Tuple[int, str]]:
    """``(epoch the resume continues at, "epoch")`` of a file's tree that holds ``state_dict`` and an integer
    ``epoch``: ``epoch + 1`` when ``version`` > 1, else ``epoch`` (``resume_checkpoint`` :301-304); None else."""
    if not isinstance(tree, dict) or "state_dict" not in tree:
        return None
    epoch, version = tree.get("epoch"), tree.get("version")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    newer = isinstance(version, int) and not isinstance(version, bool) and version > 1
    return epoch + (RESUME_NEXT if newer else 0), "epoch"


def is_entry(unit: str) -> bool:
    """True for ``last.pth.tar``, the file ``--resume`` is given by the documented practice."""
    return base(unit) == _LAST


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """``last.pth.tar`` of ``folder`` (what ``--resume <output dir>/last.pth.tar`` loads), None when absent."""
    want = join(folder, _LAST)
    return (want if any(u["unit"] == want for u in v.get("units") or []) else None), True


PRODUCER = Producer(
    key="timm", name="timm", layouts=("timm",), contracts=(CONTRACT,),
    unit_names=UNIT_NAMES, name_step=NAME_STEP, name_step_offset=RESUME_NEXT, resume_step=resume_step,
    in_progress_names=IN_PROGRESS,
    resume_loads={"mixed": ResumeLoad("timm resume_task_checkpoint: torch.load(weights_only=True) with "
                                      "argparse.Namespace allowed (timm 1.0.31 timm/task/_helpers.py :15-20)",
                                      allows=frozenset({"argparse.Namespace"}))},
    resume_call='python train.py <your arguments> --resume "{path}"',
    default_call='python train.py <your arguments> --resume <output dir>/last.pth.tar',
    default_pick=default_pick,
    entry=is_entry, entry_call='python train.py <your arguments> --resume <output dir>/last.pth.tar',
    reader_kinds=("file",),
    model_prefixes=("module.", "_orig_mod."),  # clean_state_dict strips both (timm/models/_helpers.py :127-142)
)
