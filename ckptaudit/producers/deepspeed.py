"""DeepSpeed: ``engine.save_checkpoint`` tag folders beside a ``latest`` file.

Sources (deepspeed 0.19 ``runtime/engine.py`` and ``runtime/checkpoint_engine/torch_checkpoint_engine.py``):
each tag folder holds ``*model_states.pt`` (module weights, ``global_steps``, ``lr_scheduler``, ``ds_config``)
and, under ZeRO, ``*optim_states.pt`` per data-parallel rank; ``TorchCheckpointEngine.load`` calls
``torch.load(weights_only=False)`` (no allowlist at all).  Under ZeRO-3 the fp32 weights are partitioned into
the optimizer files.  ``engine.load_checkpoint(load_dir)`` reads the tag named in ``load_dir/latest``.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .contract import UNSAFE, Contract, FileRole, PointerFile, Producer, ResumeLoad
from .paths import base, join, parent

CONTRACT = Contract(
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
)

_LOAD = ResumeLoad("deepspeed TorchCheckpointEngine.load: torch.load(weights_only=False)", weights_only=False)


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """The tag ``folder/latest`` names (no default without that pointer)."""
    latest = next((p for p in v.get("pointers") or [] if base(p["path"]) == "latest"
                   and parent(p["path"]) == folder), None)
    if latest is None:
        return None, False
    tag = (latest.get("target") or "").strip()
    return (join(folder, tag) if folder else tag) if tag else None, True


def adjust_role(role: str, facts: dict) -> str:
    """ZeRO-3 (``zero_stage`` ≥ 3 in the scan's facts): the optimizer files hold the fp32 weights."""
    return "weights" if role == "optimizer" and (facts.get("zero_stage") or 0) >= 3 else role


def parallel_findings(path: str, facts: dict, target: dict) -> list:
    """ZeRO partitioning against the resuming job (``target``'s ``world_size`` and ``zero_stage``): ZeRO
    optimizer state saved over ``dp_world_size`` ranks cannot be re-partitioned on load (``engine.load_checkpoint``
    reads ``zero_pp_rank_<r>_*`` per rank; the universal checkpoint converts it)."""
    from .. import findings as F

    out = []
    dp, stage = facts.get("dp_world_size"), facts.get("zero_stage")
    tws, tst = target.get("world_size"), target.get("zero_stage")
    if tws and dp and stage and tws != dp and stage >= 1:
        out.append(F.make("zero_dp_world_size_mismatch", path=path, stage=stage, saved=dp, target=tws))
    if tst is not None and stage is not None and tst != stage:
        out.append(F.make("zero_stage_mismatch", path=path, saved=stage, target=tst))
    return out


PRODUCER = Producer(
    key="deepspeed", name="DeepSpeed", layouts=("deepspeed",), folder_adapters=((10, "deepspeed:ADAPTER"),), contracts=(CONTRACT,),
    roles=(("weights", r".*model_states\.pt"), ("optimizer", r".*optim_states\.pt"),
           ("metadata", r"zero_to_fp32\.py")),
    resume_loads={r: _LOAD for r in ("weights", "optimizer", "mixed")},
    resume_call='engine.load_checkpoint("{dir}", tag="{tag}")',
    default_call="engine.load_checkpoint(load_dir)",
    default_pick=default_pick,
    adjust_role=adjust_role,
    parallel_findings=parallel_findings,
    pointers=(PointerFile("latest", "DeepSpeed tag pointer"),
              PointerFile("latest_universal", "DeepSpeed universal-checkpoint pointer")),
    version_keys={"ds_version": "deepspeed"},
    pip_names={"deepspeed": "deepspeed"},
    # in ZeRO optim_states files (tests/frameworks fixtures), each rebuilt from constants with NEWOBJ/REDUCE + BUILD
    benign_globals={n: (n, why) for n, why in {
        "deepspeed.runtime.fp16.loss_scaler.LossScaler":
            "DeepSpeed static loss-scaler state (cur_scale, dynamic=False) in ZeRO optim_states files; deepspeed 0.19.8",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler":
            "DeepSpeed dynamic loss-scaler state (cur_scale, scale_window, hysteresis counters) in fp16 ZeRO "
            "optim_states files; deepspeed 0.19.8",
        "deepspeed.runtime.zero.config.ZeroStageEnum": "DeepSpeed ZeRO stage enum in optim_states files; deepspeed 0.19.8",
        "deepspeed.utils.tensor_fragment.fragment_address":
            "DeepSpeed dataclass (numel, start) of a parameter's slice in a flat ZeRO partition "
            "(param_slice_mappings); deepspeed 0.19.8",
    }.items()},
    claim_files=("*model_states.pt", "*optim_states.pt"),
)
