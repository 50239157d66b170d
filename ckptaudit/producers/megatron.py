"""Megatron-LM: ``iter_<N>/mp_rank_<tp>[_<pp>]/model_optim_rng.pt`` beside ``latest_checkpointed_iteration.txt``.

Source: Megatron-LM ``training/checkpointing.py`` (core_r0.x): one file per model-parallel rank holding the
model, optimizer, ``opt_param_scheduler``, ``rng_state``, ``args`` and ``iteration``, loaded with
``torch.load(weights_only=False)``.  The tracker file holds the iteration number, or ``release``
(``read_metadata``), and names the folder ``iter_<N:07d>`` (``get_checkpoint_name``).
"""

from __future__ import annotations

from .contract import UNSAFE, Contract, FileRole, PointerFile, Producer

CONTRACT = Contract(
    producer="megatron", framework="Megatron-LM", versions="Megatron-LM core_r0.x",
    layouts=("megatron",), match_files=("model_optim_rng.pt",),
    files=(FileRole("model_optim_rng.pt", "mixed", UNSAFE),),
    keys={"weights": ("model",), "optimizer": ("optimizer",), "scheduler": ("opt_param_scheduler",),
          "rng": ("rng_state",), "metadata": ("args",)},
    step_at=("*:iteration",),
    saves=frozenset({"weights", "optimizer", "step"}),
)

def parallel_findings(path: str, facts: dict, target: dict) -> list:
    """Tensor- and pipeline-parallel sizes saved (``mp_rank_<tp>[_<pp>]`` folders) against the resuming job's
    (``target``'s ``tensor_parallel`` and ``pipeline_parallel``): Megatron loads one file per model-parallel rank."""
    from .. import findings as F

    out = []
    for what, key in (("tensor_model_parallel_size", "tensor_parallel"),
                      ("pipeline_model_parallel_size", "pipeline_parallel")):
        saved, want = facts.get(key), target.get(key)
        if saved and want and saved != want:
            out.append(F.make("model_parallel_mismatch", path=path, what=what, saved=saved, target=want))
    return out


TRACKER = "latest_checkpointed_iteration.txt"


def tracker_unit(text: str) -> str:
    """The folder the tracker's text names: ``iter_<N:07d>`` for an iteration number, ``release`` as is."""
    return f"iter_{int(text):07d}" if text.isdigit() else text


def tracker_check(pointer: dict, suggestion: str):
    """``megatron_tracker_invalid`` for a tracker whose text is neither an iteration number nor ``release``
    (``read_metadata`` fails on it); ``suggestion``: the newest usable iteration's folder name."""
    from .. import findings as F

    text = pointer.get("target") or ""
    if text.isdigit() or text == "release":
        return None
    return F.make("megatron_tracker_invalid", path=pointer["path"], pointer=pointer["path"], content=text[:40],
                  suggestion=suggestion)


PRODUCER = Producer(key="megatron", name="Megatron-LM", layouts=("megatron",), folder_adapters=((20, "megatron:ADAPTER"),), contracts=(CONTRACT,),
                    parallel_findings=parallel_findings,
                    claim_files=("model_optim_rng.pt", "mp_rank_*"),
                    pointers=(PointerFile(TRACKER, "Megatron tracker file", tracker_unit, tracker_check),),
                    pip_names={"megatron": "megatron-core"})
