"""NeMo: the unfinished-checkpoint marker ``NeMoModelCheckpoint`` keeps beside a checkpoint it saves or deletes.

Source: NVIDIA/NeMo ``nemo/utils/callbacks/nemo_model_checkpoint.py``, ``NeMoModelCheckpoint`` (read in
nemo_toolkit 3.0.0), and ``nemo/utils/model_utils.py`` ``uninject_model_parallel_rank``:

* ``UNFINISHED_CHECKPOINT_SUFFIX = "-unfinished"``; ``format_checkpoint_unfinished_marker_path(checkpoint_path)``
  is the path with the model-parallel rank folder un-injected (when ``mp_rank``, ``tp_rank`` or ``fsdp_shard`` is
  in the path, the file's folder is dropped), then ``.nemo``, ``.ckpt`` and ``-EMA`` removed as suffixes, plus
  ``-unfinished``: ``epoch=0-step=10.ckpt`` and its EMA copy ``epoch=0-step=10-EMA.ckpt`` share the marker
  ``epoch=0-step=10-unfinished``, and so does the distributed-checkpoint folder ``epoch=0-step=10/``
  (``model_utils.ckpt_to_dir``: the ``.ckpt`` name without its suffix).
* ``_save_checkpoint``: ``set_checkpoint_unfinished_marker`` (rank 0 touches the marker, an empty file, then a
  barrier) before the save; ``remove_checkpoint_unfinished_marker`` after every rank finished (a barrier first;
  for an async save in the finalize callback).  ``_remove_checkpoint`` sets it before deleting a checkpoint and
  removes it after.
* ``is_checkpoint_unfinished(p)``: the marker exists.  ``_saved_checkpoint_paths`` and ``exp_manager.check_resume``
  (``_filter_out_unfinished_checkpoints``) leave such checkpoints out; ``setup`` → ``_remove_unfinished_checkpoints``
  deletes them (``.ckpt`` files found by ``rglob``, folders directly in the checkpoint folder) and every marker,
  those with no checkpoint beside them too.

NeMo's checkpoints themselves are Lightning ``.ckpt`` files (``NeMoModelCheckpoint`` is Lightning's
``ModelCheckpoint``) or a distributed-checkpoint folder, judged as those layouts' units: this producer has no
layout, contract or resume call of its own, only the marker.  Where the audit differs from NeMo: the rank words
are looked for in the unit's path inside the run (NeMo looks at the whole absolute path).
"""

from __future__ import annotations

from .contract import Producer, UnfinishedMarker
from .paths import base, join, parent

#: ``NeMoModelCheckpoint.UNFINISHED_CHECKPOINT_SUFFIX``
UNFINISHED_SUFFIX = "-unfinished"
#: what ``uninject_model_parallel_rank`` looks for in a path: a rank folder NeMo injected
_RANK_WORDS = ("mp_rank", "tp_rank", "fsdp_shard")


def marker_of(unit: str) -> str:
    """``format_checkpoint_unfinished_marker_path`` of a unit's run-relative path, run-relative
    (``checkpoints/mp_rank_00/epoch=0-step=10.ckpt`` → ``checkpoints/epoch=0-step=10-unfinished``)."""
    folder, name = parent(unit), base(unit)
    if any(w in unit for w in _RANK_WORDS):
        folder = parent(folder)
    for suffix in (".nemo", ".ckpt", "-EMA"):
        name = name.removesuffix(suffix)
    return join(folder, name + UNFINISHED_SUFFIX)


MARKER = UnfinishedMarker(
    path_of=marker_of,
    why="NeMo unfinished marker {marker} beside it: the save (or deletion) never finished; NeMo's resume skips "
        "and deletes it",
)

PRODUCER = Producer(key="nemo", name="NeMo", layouts=(), unfinished_markers=(MARKER,))
