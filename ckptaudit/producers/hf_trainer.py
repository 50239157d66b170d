"""The Hugging Face Trainer (transformers): ``checkpoint-<N>`` folders.

Sources (transformers 5.24 ``trainer.py``): ``_save_checkpoint`` writes the weights, ``optimizer.pt``,
``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth`` and ``trainer_state.json``; ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler`` and ``_load_rng_state`` read them, every ``torch.load`` with
``weights_only=True``.  ``_load_rng_state`` runs inside ``transformers.trainer_pt_utils.safe_globals()``,
which allows ``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``, ``numpy.dtype`` and
``type(numpy.dtype(numpy.uint32))``; ``training_args.bin`` is never unpickled by the resume (the Trainer
takes its arguments from the training script).  transformers 4.57 calls ``torch.load(rng_file)`` with no
``weights_only``: torch's default decides (True from torch 2.6 on); the table assumes torch >= 2.6.
``Trainer.train(resume_from_checkpoint=True)`` takes ``trainer_utils.get_last_checkpoint(output_dir)``:
the ``checkpoint-<N>`` folder with the largest N (``_re_checkpoint``), whatever it holds.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from .contract import WO, Contract, FileRole, Producer, RestoreRule, ResumeLoad
from .paths import base, parent

NUMPY_RNG_GLOBALS = frozenset({"numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
                               "numpy.dtypes.UInt32DType"})

META = (
    FileRole("training_args.bin", "metadata", "never"),
    FileRole("config.json", "metadata", "never"),
    FileRole("generation_config.json", "metadata", "never"),
    FileRole("tokenizer*", "metadata", "never"),
    FileRole("special_tokens_map.json", "metadata", "never"),
    FileRole("*.jinja", "metadata", "never"),
    FileRole("*.md", "metadata", "never"),
)

CONTRACT = Contract(
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
    ) + META,
    step_at=("trainer_state.json:global_step",), epoch_at=("trainer_state.json:epoch",),
    saves=frozenset({"weights", "optimizer", "scheduler", "rng", "step"}),
)

_ARGS = ("Hugging Face transformers training arguments: a dataclass whose fields are data (numbers, "
         "strings, enums), rebuilt with __dict__.update; saved as training_args.bin by Trainer")
_ENUM = "Hugging Face transformers enum pickled inside TrainingArguments; rebuilt as cls(value)"
#: The Trainer's data classes inside training_args.bin (seen in tests/frameworks fixtures)
BENIGN_GLOBALS = {
    "transformers.training_args.TrainingArguments": _ARGS,
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments": _ARGS,
    **{f"transformers.{n}": _ENUM for n in (
        "training_args.OptimizerNames", "trainer_utils.IntervalStrategy", "trainer_utils.SaveStrategy",
        "trainer_utils.HubStrategy", "trainer_utils.SchedulerType", "trainer_utils.FSDPOption",
        "debug_utils.DebugOption")},
    "transformers.trainer_pt_utils.AcceleratorConfig": _ARGS + " (accelerator_config field; transformers 5.24.0)",
}

_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")  # transformers trainer_utils._re_checkpoint


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """The ``checkpoint-<N>`` folder with the largest N beside ``folder``'s units (get_last_checkpoint)."""
    named = [(int(m.group(1)), u["unit"]) for u in v.get("units") or []
             if parent(u["unit"]) == folder and (m := _CHECKPOINT_DIR.match(base(u["unit"])))]
    return (max(named)[1] if named else None), True


PRODUCER = Producer(
    key="hf-trainer", name="the HF Trainer", layouts=("hf-trainer",), folder_adapters=((40, "hf:TRAINER"),),
    index_adapters=("hf:INDEX",), contracts=(CONTRACT,),
    roles=(
        ("weights", r"(model(-\d+-of-\d+)?\.safetensors|pytorch_model.*\.bin|.*\.index\.json|adapter_model\..*)"),
        ("optimizer", r"optimizer\.pt"),
        ("scheduler", r"scheduler\.pt"),
        ("scaler", r"scaler\.pt"),
        ("rng", r"rng_state.*\.pth"),
        ("trainer_state", r"trainer_state\.json"),
        ("metadata", r"(training_args\.bin|config\.json|generation_config\.json|tokenizer.*|special_tokens_map\.json"
                     r"|.*\.jinja|.*\.md|.*\.txt|vocab\..*|merges\.txt)"),
    ),
    resume_loads={
        "rng": ResumeLoad("transformers Trainer._load_rng_state: torch.load(weights_only=True) inside "
                          "transformers.trainer_pt_utils.safe_globals()", NUMPY_RNG_GLOBALS),
        "metadata": ResumeLoad("transformers' Trainer takes its TrainingArguments from the training script",
                               never=True),
    },
    resume_call='trainer.train(resume_from_checkpoint="{path}")',
    default_call="trainer.train(resume_from_checkpoint=True)",
    default_pick=default_pick,
    reader_kinds=("folder",),
    not_state={"training_args.bin": "the Trainer's arguments: a whole pickled TrainingArguments, which "
                                    "torch.load(weights_only=True) refuses; load it with transformers if you need it"},
    loss_log=("trainer_state.json", "log_history"),  # TrainerState.log_history: one dict per logging step
    complete_marker="trainer_state.json",  # _save_checkpoint: after the weights, optimizer, scheduler and RNG
    version_keys={"transformers_version": "transformers"},
    pip_names={"transformers": "transformers"},
    benign_globals={n: (n, why) for n, why in BENIGN_GLOBALS.items()},
    claim_files=("trainer_state.json",),
    restores_together=(RestoreRule(
        "optimizer", ("scheduler",),
        "transformers trainer.py, Trainer._load_optimizer_and_scheduler: the optimizer and the scheduler are "
        "loaded only under `if checkpoint_file_exists and os.path.isfile(os.path.join(checkpoint, "
        "SCHEDULER_NAME))` (line 3975 in 5.25.0, line 3524 in 4.57.6)"),),
)
