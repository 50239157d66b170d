"""Megatron-LM: ``iter_<N>/mp_rank_<tp>[_<pp>]/model_optim_rng.pt`` beside ``latest_checkpointed_iteration.txt``.

Source: Megatron-LM ``training/checkpointing.py`` (core_r0.x): one file per model-parallel rank holding the
model, optimizer, ``opt_param_scheduler``, ``rng_state``, ``args`` and ``iteration``, loaded with
``torch.load(weights_only=False)``.
"""

from __future__ import annotations

from .contract import UNSAFE, Contract, FileRole, Producer

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


PRODUCER = Producer(key="megatron", name="Megatron-LM", layouts=("megatron",), contracts=(CONTRACT,),
                    parallel_findings=parallel_findings,
                    pointers={"latest_checkpointed_iteration.txt": "Megatron tracker file"},
                    pip_names={"megatron": "megatron-core"})
