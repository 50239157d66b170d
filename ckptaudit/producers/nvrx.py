"""NVIDIA Resiliency Extension (NVRx) local checkpointing: ``LocalCheckpointManager``'s per-rank files.

Source: NVIDIA/nvidia-resiliency-ext ``src/nvidia_resiliency_ext/checkpointing/local/ckpt_managers/`` at commit
d8686d9c7015c39ce91dd01788c0ab111a24818b (v0.7.0-main-89); ``local_manager.py`` is the same file in the
nvidia-resiliency-ext 0.4.1 wheel that wrote the tests' run (``base_manager.py`` differs in one argument):

* ``local_manager.py`` :67-71 ``local_ckpt_dir``: ``<root_local_ckpt_dir>/<session_id>/<rank>/``;
  :158-166 ``_filename_from_template``: ``iter_{iteration:07d}_{rank}_local{extra_suffix}.pt``; :168-173
  ``_local_ckpt_path_from_id``: ``extra_suffix`` is ``.dirty`` for the name a save writes.
* :107-125 ``_save``: opens ``iter_…_local.dirty.pt`` with ``"bx"`` (fails if it exists), ``torch.save`` into it,
  then ``rename`` to ``iter_…_local.pt``.  A ``.dirty`` file is a save that never returned: killed, or failed.
* :79-88 ``_my_ckpt_ids``: a checkpoint is a name that fully matches ``iter_\\d+_\\d+_local\\.pt``, so a
  ``.dirty`` file is never loaded.  ``base_manager.py`` :156-203 ``find_latest``: the newest iteration whose
  files every rank of the group holds (the ids gathered from all ranks).  ``save`` (:236-317) ends in
  ``finalize_fn``: a save not complete on every rank is removed (``_cleanup_failed_save``, local_manager.py
  :146-156: every file of that iteration, ``.dirty`` or not) and raises; after a complete one ``_cleanup``
  (:132-144) deletes every file of an older iteration, ``.dirty`` ones too, so one iteration is kept.
* :90-99 ``_load``: ``torch.load(weights_only=False)`` of a pickled ``TensorAwareStateDict``:
  ``BasicTensorAwareStateDict`` (``basic_state_dict.py`` :75-90) holds the user's state dict in its
  ``state_dict`` attribute; its pickle is ``NEWOBJ`` of the class and ``BUILD`` of that ``__dict__`` (no
  ``__reduce__`` or ``__setstate__`` of its own).

The audit: a ``.dirty`` name is a save in progress; a finished file of an iteration that some rank of its
session (the ranks named by the files and their folders) does not hold finished is one too, as
``find_latest`` skips it.  The world size is not in the files: a rank whose whole folder is gone is not seen.
"""

from __future__ import annotations

import re
from typing import Dict, Sequence

from .contract import Producer, ResumeLoad
from .paths import base, parent

#: ``_filename_from_template`` with ``_my_ckpt_ids``'s digits, and the ``.dirty`` suffix of a save under way
_NAME = re.compile(r"^iter_(\d+)_(\d+)_local(\.dirty)?\.pt$")
DIRTY = r"^iter_\d+_\d+_local\.dirty\.pt$"
WHY_DIRTY = ("NVRx local checkpoint still being written: LocalCheckpointManager._save torch.saves into "
             "iter_<N>_<rank>_local.dirty.pt and renames it to iter_<N>_<rank>_local.pt when the save returns; "
             "NVRx's find_latest never lists a .dirty file, and its next finished save deletes it")
WHY_RANKS = ("NVRx local checkpoint of iteration {it} is not finished on every rank ({lacking} holds no "
             "iter_{it:07d}_<rank>_local.pt): NVRx's find_latest takes only an iteration every rank holds, so its "
             "resume skips this one")
_STATE_DICT = "nvidia_resiliency_ext.checkpointing.local.basic_state_dict.BasicTensorAwareStateDict"


def incomplete(units: Sequence[str]) -> Dict[str, str]:
    """``{unit: why}`` for the finished files (``iter_<N>_<rank>_local.pt`` in a rank folder ``<session>/<rank>/``)
    of an iteration that not every rank of their session holds finished (``find_latest``'s rule)."""
    sessions: Dict[str, dict] = {}
    for u in units:
        m, folder = _NAME.match(base(u)), parent(u)
        if m is None or not base(folder).isdigit():
            continue
        s = sessions.setdefault(parent(folder), {"ranks": set(), "done": {}})
        it, rank = int(m.group(1)), int(m.group(2))
        s["ranks"].update({rank, int(base(folder))})  # replicas: a folder may hold other ranks' files
        if not m.group(3):
            s["done"].setdefault(it, {})[u] = rank
    out: Dict[str, str] = {}
    for s in sessions.values():
        for it, files in s["done"].items():
            lacking = sorted(s["ranks"] - set(files.values()))
            if lacking:
                who = ("rank " if len(lacking) == 1 else "ranks ") + ", ".join(map(str, lacking))
                out.update({u: WHY_RANKS.format(it=it, lacking=who) for u in files})
    return out


WHY_SPOILED = ("NVRx local checkpoint of iteration {it}, whose rank {rank} file ({files}) is not usable: "
               "find_latest takes an iteration every rank holds, so NVRx resumes every rank from iteration {it} "
               "and rank {rank}'s load fails or restores damaged state")


def spoiled(usable: Dict[str, str]) -> Dict[str, str]:
    """``{unit: why}`` for the usable files of an iteration one of whose ranks has no usable copy (its file, or
    any replica of it in another rank's folder): NVRx would still pick that iteration (every rank *holds* it)
    and the damaged rank's load fails.  ``usable``: ``{unit: usable_for}`` of the run's units."""
    saves: Dict[tuple, Dict[int, list]] = {}
    for u, use in usable.items():
        m, folder = _NAME.match(base(u)), parent(u)
        if m is None or m.group(3) or not base(folder).isdigit():
            continue
        saves.setdefault((parent(folder), int(m.group(1))), {}).setdefault(int(m.group(2)), []).append((u, use))
    out: Dict[str, str] = {}
    for (_session, it), ranks in saves.items():
        bad = sorted(r for r, copies in ranks.items() if not any(use != "none" for _, use in copies))
        if not bad:
            continue
        files = ", ".join(base(u) for u, _ in ranks[bad[0]])
        why = WHY_SPOILED.format(it=it, rank=bad[0], files=files)
        out.update({u: why for copies in ranks.values() for u, use in copies if use != "none"})
    return out


PRODUCER = Producer(
    key="nvrx", name="NVRx local checkpointing", layouts=("nvrx-local",),
    unit_names=r"iter_\d+_\d+_local(\.dirty)?\.pt",
    in_progress_names=((DIRTY, WHY_DIRTY),),
    incomplete_saves=incomplete,
    spoiled_saves=spoiled,
    resume_loads={"mixed": ResumeLoad("NVRx LocalCheckpointManager._load: torch.load(weights_only=False)",
                                      weights_only=False)},
    pip_names={"nvidia_resiliency_ext": "nvidia-resiliency-ext"},
    benign_globals={_STATE_DICT: (_STATE_DICT, "NVRx's holder of the saved state dict (basic_state_dict.py "
                                               ":75): NEWOBJ of the class and BUILD of its __dict__, no code of "
                                               "its own runs; seen in nvidia-resiliency-ext 0.4.1")},
)
