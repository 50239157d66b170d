"""Hugging Face accelerate ``save_state`` folders (``checkpoints/checkpoint_<n>/``).

Format facts (accelerate 1.15 ``checkpointing.py`` ``save_accelerator_state``,
``utils/constants.py``): a folder per ``Accelerator.save_state()`` holding the
weights of each prepared model (``model.safetensors`` / ``model_<i>.safetensors``,
or ``pytorch_model.bin`` with ``safe_serialization=False``), ``optimizer.bin`` /
``optimizer_<i>.bin``, ``scheduler.bin`` / ``scheduler_<i>.bin``, ``sampler.bin`` /
``dl_state_dict.bin`` for resumable dataloaders, ``scaler.pt`` with fp16,
``random_states_<rank>.pkl`` per process and ``custom_checkpoint_<i>.pkl`` per object
registered with ``register_for_checkpointing``.  With
``ProjectConfiguration(automatic_checkpoint_naming=True)`` the folders are
``checkpoints/checkpoint_<save count>``: the number counts saves, not steps.
"""

from __future__ import annotations

import re
from pathlib import Path

from .adapter import folder_names
from .base import UnitScan, scan_file

RNG_RE = re.compile(r"^random_states_\d+\.pkl$")
OPT_RE = re.compile(r"^optimizer(_\d+)?\.bin$")
MODEL_RE = re.compile(r"^(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|model(_\d+)?\.safetensors\.index\.json)$")


class Accelerate:
    """Claims a folder that lists a ``random_states_<rank>.pkl``, or an optimizer file and a model file
    without the ``trainer_state.json`` of a Trainer checkpoint."""

    name = "accelerate"

    def claim_dir(self, path: Path) -> bool:
        names = folder_names(path) or []
        if any(RNG_RE.match(n) for n in names):
            return True
        return any(OPT_RE.match(n) for n in names) and any(MODEL_RE.match(n) for n in names) and \
            "trainer_state.json" not in names

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        for f in unit["files"]:
            n = Path(f).name
            if n.endswith((".json", ".txt", ".md")):
                continue
            scan_file(run_dir, f, unit["unit"], scan, cfg, tree_key=n, byte_facts=byte_facts)
        scan.facts["accelerate_files"] = sorted(Path(f).name for f in unit["files"])
        return scan


ADAPTER = Accelerate()
