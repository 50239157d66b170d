"""NeMo Automodel: the ``.incomplete`` file inside a checkpoint folder whose save has not been published.

Source: NVIDIA-NeMo/Automodel at commit 36044ad3d139363fb6c73c24af2e7c6b65ec52f6 (2026-08-22; the marker came
with #3261, "survive an interrupted save instead of hanging all ranks", 2026-08-04, also in r0.6.0):

* ``nemo_automodel/components/checkpoint/utils.py`` :44 ``_INCOMPLETE_CHECKPOINT_MARKER = ".incomplete"``;
  :133-145 ``mark_checkpoint_incomplete(checkpoint_dir)`` touches ``<checkpoint_dir>/.incomplete``; :148-154
  ``clear_checkpoint_incomplete`` unlinks it; :157-166 ``is_checkpoint_incomplete``: the file exists.
* ``nemo_automodel/components/checkpoint/lifecycle.py`` :124-144 ``reserve_local_directory``: the checkpoint
  folder (``epoch_<E>_step_<S>``, utils.py :42 ``_AUTOMODEL_CHECKPOINT_RE``) is made as a ``.reserving-<uuid>``
  staging folder holding the marker, renamed into place, and written; :299-303 ``_publish_checkpoint`` moves
  ``LATEST`` to it first and clears the marker after, so a kill between the two leaves ``LATEST`` on a folder that
  still holds the marker.
* utils.py :346-385 ``find_latest_checkpoint``: ``LATEST`` (a symlink, or ``LATEST.txt``) unless its target holds
  the marker, else the folder with the highest step among those (names ending ``step_<N>``, :43, :109-120) that do
  not hold it; ``resolve_restore_from_to_checkpoint_dir`` (:264) raises for an explicit marked folder.  The checkpoint's
  parts (``model/``, ``optim/``, ``dataloader/``, ``rng/`` …) sit below that folder, so the marker makes every unit
  the audit finds under it a save in progress.
"""

from __future__ import annotations

import re
from typing import Tuple

from .contract import Producer, UnfinishedMarker
from .paths import base, folders_up, join

#: ``_CHECKPOINT_STEP_RE``: the names ``find_latest_checkpoint`` takes for checkpoint folders
_CHECKPOINT_DIR = re.compile(r"step_\d+$")
#: ``_INCOMPLETE_CHECKPOINT_MARKER``
MARKER_NAME = ".incomplete"


def marker_paths(unit: str) -> Tuple[str, ...]:
    """Where the marker of run-relative ``unit`` would be: inside the unit itself or inside any folder above it,
    for each such folder named like an Automodel checkpoint (``…step_<N>``)."""
    return tuple(join(d, MARKER_NAME) for d in folders_up(unit) if _CHECKPOINT_DIR.search(base(d)))


MARKER = UnfinishedMarker(
    path_of=marker_paths,
    why="NeMo Automodel's in-progress marker {marker_path} is still there: the save was never published (the "
        "marker is cleared only after every part is written and LATEST moved); Automodel's find_latest_checkpoint "
        "skips this checkpoint and its next save of the same step replaces it",
)

PRODUCER = Producer(key="nemo-automodel", name="NeMo Automodel", layouts=(), unfinished_markers=(MARKER,))
