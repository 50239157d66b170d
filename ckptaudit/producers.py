"""Producer contracts as data: what each framework's save writes and what its resume reads.

One :class:`Contract` per framework and version range.  A contract says which
files form a unit, what role each file plays (``weights``, ``optimizer``,
``scheduler``, ``rng``, ``metadata`` …), how the framework's resume loads it
(``loaded_by``; ``never`` for files the resume does not read, such as
``training_args.bin``), where the step and epoch live, whether the number in a
unit's name is a step or a save counter, and which components the producer
always saves (so that an absence is a finding) or never saves (so that it is
not).

Structural recognition (:mod:`ckptaudit.recognise`) is the fallback for every
producer without an entry and must reach the same verdict on its own; the
contracts name the producer and sharpen wording.  ``CKPTAUDIT_PRODUCER_CONTRACTS=0``
switches them off (the tests run every framework fixture both ways).

Sources (read from the frameworks' save and resume code, versions as tested):
transformers 5.24 ``trainer.py`` (``_save_checkpoint``, ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``, ``_load_rng_state``: every ``torch.load`` there
passes ``weights_only=True``); accelerate 1.15 ``checkpointing.py``
(``save_accelerator_state``/``load_accelerator_state``; ``utils.other.load`` defaults
to ``weights_only=True`` with numpy globals added; ``load_custom_state`` turns
weights-only off); lightning 2.6 ``fabric/utilities/cloud_io.py::_load``
(``torch.load`` with the caller's ``weights_only``, default None → torch's default)
and ``trainer/connectors/checkpoint_connector.py``; deepspeed 0.19
``runtime/checkpoint_engine/torch_checkpoint_engine.py`` (weights-only off: full unpickling);
torchtitan ``components/checkpoint.py`` (``step-N`` folders of
torch.distributed.checkpoint); nanoGPT ``train.py``; the PyTorch tutorial "Saving and
loading a general checkpoint"; Megatron-LM ``training/checkpointing.py``.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

__all__ = ["Contract", "FileRole", "CONTRACTS", "enabled", "identify", "role_of"]

WO = "torch.load(weights_only=True)"
UNSAFE = "torch.load(weights_only=False)"


@dataclass(frozen=True)
class FileRole:
    pattern: str  # fnmatch pattern on the file's base name
    role: str  # weights | optimizer | scheduler | scaler | rng | sampler | trainer_state | custom | metadata | mixed
    loaded_by: str  # how the producer's resume reads it; "never" when it does not


@dataclass(frozen=True)
class Contract:
    producer: str
    framework: str
    versions: str  # the range the facts hold for, with the version they were tested on
    layouts: Tuple[str, ...]  # inventory layouts this producer's units come as
    match_files: Tuple[str, ...] = ()  # a folder unit is this producer's when one of these is present
    match_keys: Tuple[str, ...] = ()  # a file unit is this producer's when its root has all of these keys
    files: Tuple[FileRole, ...] = ()
    keys: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # role -> dotted paths in a file's tree
    step_at: Tuple[str, ...] = ()  # "file pattern:dotted.path" where the global step lives
    epoch_at: Tuple[str, ...] = ()
    name_number: str = "step"  # "step" | "save_index" (the number in the unit's name)
    saves: FrozenSet[str] = frozenset()  # components every unit of this producer has
    never_saves: FrozenSet[str] = frozenset()  # components this producer does not write


_HF_META = (
    FileRole("training_args.bin", "metadata", "never"),
    FileRole("config.json", "metadata", "never"),
    FileRole("generation_config.json", "metadata", "never"),
    FileRole("tokenizer*", "metadata", "never"),
    FileRole("special_tokens_map.json", "metadata", "never"),
    FileRole("*.jinja", "metadata", "never"),
    FileRole("*.md", "metadata", "never"),
)

CONTRACTS: Tuple[Contract, ...] = (
    Contract(
        producer="hf-trainer", framework="transformers", versions="transformers>=4.36,<6 (tested 5.24.0)",
        layouts=("hf-trainer",), match_files=("trainer_state.json",),
        files=(
            FileRole("model.safetensors", "weights", "safetensors.torch.load_file"),
            FileRole("model-*-of-*.safetensors", "weights", "safetensors.torch.load_file"),
            FileRole("*.index.json", "weights", "json (shard index)"),
            FileRole("pytorch_model*.bin", "weights", WO),
            FileRole("adapter_model.*", "weights", "peft load"),
            FileRole("optimizer.pt", "optimizer", WO),
            FileRole("scheduler.pt", "scheduler", WO),
            FileRole("scaler.pt", "scaler", WO),
            FileRole("rng_state*.pth", "rng", WO + " with numpy globals allowed"),
            FileRole("trainer_state.json", "trainer_state", "json (TrainerState.load_from_json)"),
        ) + _HF_META,
        step_at=("trainer_state.json:global_step",), epoch_at=("trainer_state.json:epoch",),
        saves=frozenset({"weights", "optimizer", "scheduler", "rng", "step"}),
    ),
    Contract(
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
    ),
    Contract(
        producer="lightning", framework="lightning", versions="lightning>=2.0,<3 (tested 2.6.6)",
        layouts=("lightning", "torch-zip"), match_keys=("pytorch-lightning_version", "state_dict"),
        files=(FileRole("*.ckpt", "mixed", "torch.load (weights_only per Trainer.fit; torch's default)"),),
        keys={"weights": ("state_dict",), "optimizer": ("optimizer_states",), "scheduler": ("lr_schedulers",),
              "scaler": ("native_amp_scaling_state",), "sampler": ("loops",),
              "metadata": ("hyper_parameters", "callbacks", "datamodule_hyper_parameters")},
        step_at=("*:global_step",), epoch_at=("*:epoch",),
        saves=frozenset({"weights", "optimizer", "step"}), never_saves=frozenset({"rng"}),
    ),
    Contract(
        producer="deepspeed", framework="deepspeed", versions="deepspeed>=0.9,<1 (tested 0.19.8)",
        layouts=("deepspeed",), match_files=("*model_states.pt",),
        files=(
            FileRole("*model_states.pt", "mixed", UNSAFE + " (TorchCheckpointEngine.load)"),
            FileRole("*optim_states.pt", "optimizer", UNSAFE + " (TorchCheckpointEngine.load)"),
            FileRole("zero_to_fp32.py", "metadata", "never"),
        ),
        keys={"weights": ("module",), "scheduler": ("lr_scheduler",), "metadata": ("ds_config", "param_shapes")},
        step_at=("*model_states.pt:global_steps",),
        saves=frozenset({"weights", "optimizer", "step"}), never_saves=frozenset({"rng"}),
    ),
    Contract(
        producer="torchtitan", framework="torch.distributed.checkpoint", versions="torch>=2.4 (tested 2.13.0)",
        layouts=("dcp",), match_keys=("train_state",),
        files=(FileRole(".metadata", "metadata", "torch.distributed.checkpoint.load"),
               FileRole("*.distcp", "mixed", "torch.distributed.checkpoint.load")),
        keys={"weights": ("model",), "optimizer": ("optimizer",), "scheduler": ("lr_scheduler",),
              "sampler": ("dataloader",)},
        step_at=("*:train_state.step",),
        saves=frozenset({"weights", "optimizer", "step"}),
    ),
    Contract(
        producer="nanogpt", framework="nanoGPT", versions="nanoGPT train.py (2023-)",
        layouts=("torch-zip", "torch-legacy"), match_keys=("model", "optimizer", "model_args", "iter_num"),
        keys={"weights": ("model",), "optimizer": ("optimizer",), "metadata": ("model_args", "config")},
        step_at=("*:iter_num",),
        saves=frozenset({"weights", "optimizer", "step"}),
        # the learning rate is a function of iter_num (train.py get_lr), not a saved scheduler
        never_saves=frozenset({"scheduler", "rng"}),
    ),
    Contract(
        producer="torch-tutorial", framework="torch", versions="PyTorch tutorial 'general checkpoint'",
        layouts=("torch-zip", "torch-legacy"), match_keys=("model_state_dict", "optimizer_state_dict"),
        keys={"weights": ("model_state_dict",), "optimizer": ("optimizer_state_dict",)},
        step_at=("*:step", "*:global_step"), epoch_at=("*:epoch",),
        saves=frozenset({"weights", "optimizer"}),
    ),
    Contract(
        producer="megatron", framework="Megatron-LM", versions="Megatron-LM core_r0.x",
        layouts=("megatron",), match_files=("model_optim_rng.pt",),
        files=(FileRole("model_optim_rng.pt", "mixed", UNSAFE),),
        keys={"weights": ("model",), "optimizer": ("optimizer",), "scheduler": ("opt_param_scheduler",),
              "rng": ("rng_state",), "metadata": ("args",)},
        step_at=("*:iteration",),
        saves=frozenset({"weights", "optimizer", "step"}),
    ),
)


def enabled() -> bool:
    """False when ``CKPTAUDIT_PRODUCER_CONTRACTS`` is ``0``/``false``/``off`` (read at each call)."""
    return os.environ.get("CKPTAUDIT_PRODUCER_CONTRACTS", "1").strip().lower() not in ("0", "false", "off", "no")


def _base(f: str) -> str:
    return f.rsplit("/", 1)[-1]


def identify(layout: str, files: Sequence[str], tree: Optional[dict] = None) -> Optional[Contract]:
    """The contract of the producer that wrote a unit, or None (also when contracts are off).

    ``files`` are the unit's files (run-relative); ``tree`` its scan tree ({file key: pruned object}).
    """
    if not enabled():
        return None
    bases = [_base(f) for f in files]
    for c in CONTRACTS:
        if layout not in c.layouts:
            continue
        if c.match_files and any(fnmatch.fnmatch(b, p) for p in c.match_files for b in bases):
            return c
        if c.match_keys and tree:
            for sub in tree.values():
                if isinstance(sub, dict) and all(k in sub for k in c.match_keys):
                    return c
    return None


def role_of(contract: Optional[Contract], file: str) -> Optional[FileRole]:
    """The role a unit's file plays under ``contract`` (None when unknown)."""
    if contract is None:
        return None
    b = _base(file)
    for r in contract.files:
        if fnmatch.fnmatch(b, r.pattern):
            return r
    return None


def metadata_files(contract: Optional[Contract], files: Sequence[str]) -> List[str]:
    """The unit's files that the producer's resume never reads."""
    return [f for f in files if (r := role_of(contract, f)) is not None and r.loaded_by == "never"]
