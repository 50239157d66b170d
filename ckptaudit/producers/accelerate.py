"""Hugging Face Accelerate: ``Accelerator.save_state`` folders.

Sources (accelerate 1.15 ``checkpointing.py``; 1.16 read the same): ``save_accelerator_state`` writes the
models, ``optimizer*.bin``, ``scheduler*.bin``, ``sampler*.bin``/``dl_state_dict*.bin``, ``scaler.pt`` and
``random_states_<i>.pkl``; ``load_accelerator_state`` reads every one through ``accelerate.utils.load``
(``weights_only=True`` with ``accelerate.utils.other.TORCH_SAFE_GLOBALS`` added: numpy's array
reconstruction names, ``codecs.encode`` and ``numpy.dtypes.UInt32DType``); ``load_custom_state`` reads
``custom_checkpoint_<i>.pkl`` with ``weights_only=False``.  With automatic checkpoint naming the folders are
``checkpoints/checkpoint_<save count>`` (``ProjectConfiguration.iteration``), and ``Accelerator.load_state()``
without a folder takes the one with the largest trailing number.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from .contract import UNSAFE, WO, Contract, CountRule, FileRole, Producer, ResumeLoad
from .hf_trainer import NUMPY_RNG_GLOBALS
from .paths import base, parent

CONTRACT = Contract(
    producer="accelerate", framework="accelerate", versions="accelerate>=0.20,<2 (tested 1.15.0)",
    layouts=("accelerate",), match_files=("random_states_*.pkl", "optimizer.bin"),
    files=(
        FileRole("model*.safetensors", "weights", "safetensors.torch.load_file"),
        FileRole("pytorch_model*.bin", "weights", WO),
        FileRole("optimizer*.bin", "optimizer", WO + " (accelerate.utils.load)"),
        FileRole("scheduler*.bin", "scheduler", WO + " (accelerate.utils.load)"),
        FileRole("sampler*.bin", "sampler", "torch.load (accelerate.utils.load)"),
        FileRole("dl_state_dict*.bin", "sampler", WO + " (accelerate.utils.load)"),
        FileRole("scaler.pt", "scaler", WO + " (accelerate.utils.load)"),
        FileRole("random_states_*.pkl", "rng", WO + " with numpy globals (accelerate.utils.load)"),
        FileRole("custom_checkpoint_*.pkl", "custom", UNSAFE + " (load_custom_state)"),
    ),
    name_number="save_index",  # checkpoints/checkpoint_<save count> (ProjectConfiguration.iteration)
    saves=frozenset({"weights", "optimizer", "rng"}),
)

_TRAILING = re.compile(r"(\d+)$")  # load_state's sort key: the folder's trailing number

_LOAD = ResumeLoad("accelerate load_state: accelerate.utils.load, torch.load(weights_only=True) with "
                   "accelerate.utils.other.TORCH_SAFE_GLOBALS", NUMPY_RNG_GLOBALS | {"_codecs.encode"})


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """The Accelerate folder beside ``folder``'s units with the largest trailing number."""
    named = [(int(m.group(1)), u["unit"]) for u in v.get("units") or []
             if parent(u["unit"]) == folder and u.get("layout") == "accelerate"
             and (m := _TRAILING.search(base(u["unit"])))]
    return (max(named)[1] if named else None), bool(named)


PRODUCER = Producer(
    key="accelerate", name="accelerate", layouts=("accelerate",), folder_adapters=((50, "accelerate:ADAPTER"),), contracts=(CONTRACT,),
    roles=(
        ("weights", r"(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|.*\.index\.json)"),
        ("optimizer", r"optimizer(_\d+)?\.bin"),
        ("scheduler", r"scheduler(_\d+)?\.bin"),
        ("scaler", r"scaler\.pt"),
        ("sampler", r"(sampler(_\d+)?\.bin|dl_state_dict(_\d+)?\.bin)"),
        ("rng", r"random_states_\d+\.pkl"),
        ("custom", r"custom_checkpoint_\d+\.pkl"),
    ),
    resume_loads={**{r: _LOAD for r in ("weights", "optimizer", "scheduler", "scaler", "rng", "sampler")},
                  "custom": ResumeLoad("accelerate load_custom_state: torch.load(weights_only=False)",
                                       weights_only=False)},
    resume_call='accelerator.load_state("{path}")',
    file_counts=(CountRule(
        r"custom_checkpoint_\d+\.pkl", "object registered with accelerator.register_for_checkpointing",
        "accelerate accelerator.py, Accelerator.load_state: `if len(custom_checkpoints) != "
        "len(self._custom_objects)` raises RuntimeError (line 3821 in 1.16.0)"),),
    default_call="accelerator.load_state()",
    default_pick=default_pick,
    pip_names={"accelerate": "accelerate"},
    # pickled inside the HF Trainer's TrainingArguments (tests/frameworks fixtures)
    benign_globals={
        "accelerate.state.PartialState": (
            "accelerate.state.PartialState", "accelerate process-state holder pickled inside TrainingArguments "
            "(distributed_state field), rebuilt without calling __init__; accelerate 1.15.0, transformers 5.24.0"),
        "accelerate.utils.dataclasses.DistributedType": (
            "accelerate.utils.dataclasses.DistributedType", "accelerate enum (NO, MULTI_GPU, DEEPSPEED…) pickled "
            "inside TrainingArguments; accelerate 1.15.0"),
    },
    claim_files=("random_states_*.pkl",),
)
