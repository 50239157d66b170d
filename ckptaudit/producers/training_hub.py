"""Red Hat training_hub's just-in-time checkpoints: the ``.incomplete-checkpoint-<step>`` file beside a Trainer's
``checkpoint-<step>`` folder while its save runs (and the older ``.incomplete`` inside the folder).

Source: Red-Hat-AI-Innovation-Team/training_hub at commit 4ccbeaeb3948698e62cfaf000f7c00098ef54bf8,
``src/training_hub/jit_checkpoint.py``: :12 ``INCOMPLETE_SENTINEL = ".incomplete"`` (the in-folder marker of
earlier versions, "still honored on read"); :13 ``INCOMPLETE_SIDECAR_PREFIX = ".incomplete-checkpoint-"``;
``incomplete_sidecar_path(output_dir, step)``: ``<output_dir>/.incomplete-checkpoint-<step>``, touched by
``mark_checkpoint_incomplete`` before the HF Trainer writes ``checkpoint-<step>`` and removed with the in-folder
one by ``mark_checkpoint_complete``; ``is_valid_checkpoint_dir`` refuses a folder holding ``.incomplete`` or whose
sidecar exists, and ``find_latest_valid_checkpoint`` resumes from the newest valid ``checkpoint-<N>`` (or the
native ``full_state_checkpoints/step_<N>`` and ``full_state/epoch_<N>`` folders, in-folder marker only).
"""

from __future__ import annotations

import re
from typing import Tuple

from .contract import Producer, UnfinishedMarker
from .paths import base, folders_up, join, parent

#: the checkpoint folders ``find_latest_valid_checkpoint`` considers (``_HF_CHECKPOINT_RE``,
#: ``_MINI_TRAINER_STEP_RE``, ``_INSTRUCTLAB_EPOCH_RE``)
_HF_DIR = re.compile(r"^checkpoint-(\d+)$")
_NATIVE_DIR = re.compile(r"^(step|epoch)_\d+$")
SIDECAR_PREFIX = ".incomplete-checkpoint-"
SENTINEL = ".incomplete"


def marker_paths(unit: str) -> Tuple[str, ...]:
    """Where a marker of run-relative ``unit`` would be: for each folder at or above it named ``checkpoint-<N>``,
    the sidecar beside that folder and the sentinel inside it; for ``step_<N>``/``epoch_<N>``, the sentinel."""
    out = []
    for d in folders_up(unit):
        if (m := _HF_DIR.match(base(d))) is not None:
            out += [join(parent(d), SIDECAR_PREFIX + m.group(1)), join(d, SENTINEL)]
        elif _NATIVE_DIR.match(base(d)):
            out.append(join(d, SENTINEL))
    return tuple(out)


MARKER = UnfinishedMarker(
    path_of=marker_paths,
    why="training_hub's in-progress marker {marker_path} is still there: the save never finished (the marker is "
        "removed by mark_checkpoint_complete once the Trainer's save returned); training_hub's "
        "find_latest_valid_checkpoint skips this checkpoint on resume",
)

PRODUCER = Producer(key="training-hub", name="training_hub", layouts=(), unfinished_markers=(MARKER,))
