"""DeepSpeed tag folders (``global_stepN/``) and the ``latest`` pointer.

Format facts (deepspeed/runtime/engine.py ``_get_ckpt_name`` /
``_get_zero_ckpt_name``; deepspeed/utils/zero_to_fp32.py): a tag folder holds
``mp_rank_XX_model_states.pt`` per model-parallel rank (with ``module``,
``dp_world_size``, ``mp_world_size``, ``global_steps``, ``ds_config``) and,
with ZeRO, ``[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt`` per
data-parallel rank D (with ``optimizer_state_dict.zero_stage`` and
``partition_count``).  ``latest`` (a text file beside the tags) names the tag
to resume.
"""

from __future__ import annotations

import re
from pathlib import Path

from .. import findings as F
from .adapter import folder_names
from .base import UnitScan, scan_file

MODEL_RE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
# ZeRO-3 writes one model-states file per data-parallel rank (engine._get_zero_ckpt_name)
ZERO3_MODEL_RE = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
OPTIM_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


class DeepSpeed:
    """Claims a ``global_step<N>`` folder, or one that lists a model-states or optim-states file."""

    name = "deepspeed"

    def claim_dir(self, path: Path) -> bool:
        if re.fullmatch(r"global_step\d+", path.name):
            return True
        names = folder_names(path) or []
        return any(MODEL_RE.match(n) or OPTIM_RE.match(n) or ZERO3_MODEL_RE.match(n) for n in names)

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        model_files, optim_files = _rank_files(unit["files"])
        facts = scan.facts
        seen = {"dp_sizes": set(), "stages": set(), "partition_counts": set(), "steps": set()}
        for mp, f in sorted(model_files.items()):
            info = scan_file(run_dir, f, unit["unit"], scan, cfg, tree_key=Path(f).name,
                             byte_facts=byte_facts)
            _zero3_shapes(scan.tree.get(Path(f).name))
            _model_states_facts(info.get("obj"), facts, seen)
        for (dp, mp), f in sorted(optim_files.items()):
            info = scan_file(run_dir, f, unit["unit"], scan, cfg, tree_key=Path(f).name,
                             byte_facts=byte_facts)
            _optim_states_facts(info.get("obj"), seen)
        dp_ranks = sorted({dp for dp, _ in optim_files})
        sizes, stages, steps = seen["dp_sizes"] | seen["partition_counts"], seen["stages"], seen["steps"]
        facts.update(dp_world_size=max(sizes) if sizes else None,
                     zero_stage=max(stages) if stages else None, optim_dp_ranks=dp_ranks,
                     mp_ranks=sorted({mp for _, mp in model_files}), global_steps=sorted(steps))
        if steps:
            facts["step"] = max(steps)
        if not model_files:
            from ..components.findings import missing_weights

            scan.add(missing_weights(unit["unit"], "no mp_rank_XX_model_states.pt"))
        _missing_partitions(scan, unit["unit"], optim_files, dp_ranks, facts["dp_world_size"])
        return scan


def _rank_files(files) -> tuple:
    """``(model_files, optim_files)``: the unit's model-states files by ``(dp rank, mp rank)`` (dp 0 outside
    ZeRO-3) and its optim-states files by ``(dp rank, mp rank)``."""
    model_files, optim_files = {}, {}
    for f in files:
        n = Path(f).name
        m = MODEL_RE.match(n)
        z = ZERO3_MODEL_RE.match(n)
        o = OPTIM_RE.match(n)
        if m:
            model_files[(0, int(m.group(1)))] = f
        elif z:
            model_files[(int(z.group(1)), int(z.group(2)))] = f
        elif o:
            optim_files[(int(o.group(1)), int(o.group(2)))] = f
    return model_files, optim_files


def _model_states_facts(obj, facts: dict, seen: dict) -> None:
    """What a model-states dict says: data-parallel size, step, ZeRO stage (into ``seen``), model-parallel
    size and DeepSpeed version (into ``facts``)."""
    if not isinstance(obj, dict):
        return
    if isinstance(obj.get("dp_world_size"), int):
        seen["dp_sizes"].add(obj["dp_world_size"])
    if isinstance(obj.get("global_steps"), int):
        seen["steps"].add(obj["global_steps"])
    zc = (obj.get("ds_config") or {}).get("zero_optimization") if isinstance(obj.get("ds_config"), dict) else None
    if isinstance(zc, dict) and isinstance(zc.get("stage"), int):
        seen["stages"].add(zc["stage"])
    facts["mp_world_size"] = obj.get("mp_world_size")
    facts["ds_version"] = obj.get("ds_version")


def _optim_states_facts(obj, seen: dict) -> None:
    """What an optim-states dict's ``optimizer_state_dict`` says: ZeRO stage and partition count."""
    osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
    if not isinstance(osd, dict):
        return
    if isinstance(osd.get("zero_stage"), int):
        seen["stages"].add(osd["zero_stage"])
    if isinstance(osd.get("partition_count"), int):
        seen["partition_counts"].add(osd["partition_count"])
    elif isinstance(osd.get("partition_count"), list):
        seen["partition_counts"].update(x for x in osd["partition_count"] if isinstance(x, int))


def _missing_partitions(scan: UnitScan, unit: str, optim_files: dict, dp_ranks: list, expected) -> None:
    """``ds_rank_files_missing`` when data-parallel ranks below ``expected`` have no optim-states file."""
    if not (optim_files and expected):
        return
    missing = sorted(set(range(expected)) - set(dp_ranks))
    if missing:
        # name the first missing partition file (same pattern as the ones present), so the
        # verdict can weigh it by role: an optimizer partition under ZeRO-1/2, weights under ZeRO-3
        present = optim_files[min(optim_files)]
        gone = re.sub(r"zero_pp_rank_\d+_", f"zero_pp_rank_{missing[0]}_", present)
        scan.add(F.make("ds_rank_files_missing", path=gone, ranks=missing, found=len(dp_ranks),
                        expected=expected, unit=unit))


def _zero3_shapes(tree) -> None:
    """Give ZeRO-3 placeholder weights their real shapes.

    Under ZeRO-3 each parameter in ``module`` is saved as an empty placeholder
    (shape ``[0]``); its shape is in ``param_shapes`` (a list of {name: shape}
    per parameter group) and its values in the optimizer files'
    ``fp32_flat_groups`` (deepspeed/runtime/engine.py ``_save_checkpoint``,
    utils/zero_to_fp32.py).  The pruned tree keeps the real shape and marks the
    tensor ``"partitioned": True`` so structure checks see the model as it is.
    """
    if not isinstance(tree, dict) or not isinstance(tree.get("module"), dict):
        return
    shapes = {}
    for group in tree.get("param_shapes") or []:
        if isinstance(group, dict):
            for name, shape in group.items():
                sh = shape.get("args", [None])[0] if isinstance(shape, dict) else shape
                if isinstance(sh, list):
                    shapes[name] = sh
    for name, t in tree["module"].items():
        if isinstance(t, dict) and t.get("shape") == [0] and name in shapes:
            t["shape"] = shapes[name]
            t["partitioned"] = True


ADAPTER = DeepSpeed()
