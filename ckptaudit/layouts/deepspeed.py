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
from .base import UnitScan, scan_file

MODEL_RE = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
OPTIM_RE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
LAYER_RE = re.compile(r"^layer_(\d+)-model_(\d+)-model_states\.pt$")


class DeepSpeed:
    name = "deepspeed"

    def claim_dir(self, path: Path) -> bool:
        if re.fullmatch(r"global_step\d+", path.name):
            return True
        try:
            return any(MODEL_RE.match(p.name) or OPTIM_RE.match(p.name) for p in path.iterdir())
        except OSError:
            return False

    def scan(self, run_dir: Path, unit: dict, cfg: dict) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        model_files, optim_files = {}, {}
        for f in unit["files"]:
            n = Path(f).name
            m = MODEL_RE.match(n)
            o = OPTIM_RE.match(n)
            if m:
                model_files[int(m.group(1))] = f
            elif o:
                optim_files[(int(o.group(1)), int(o.group(2)))] = f
        facts = scan.facts
        dp_sizes, stages, partition_counts, steps = set(), set(), set(), set()
        for mp, f in sorted(model_files.items()):
            info = scan_file(run_dir, f, unit["unit"], scan, cfg, tree_key=Path(f).name)
            obj = info.get("obj")
            if isinstance(obj, dict):
                if isinstance(obj.get("dp_world_size"), int):
                    dp_sizes.add(obj["dp_world_size"])
                if isinstance(obj.get("global_steps"), int):
                    steps.add(obj["global_steps"])
                zc = (obj.get("ds_config") or {}).get("zero_optimization") if isinstance(obj.get("ds_config"), dict) else None
                if isinstance(zc, dict) and isinstance(zc.get("stage"), int):
                    stages.add(zc["stage"])
                facts["mp_world_size"] = obj.get("mp_world_size")
                facts["ds_version"] = obj.get("ds_version")
        for (dp, mp), f in sorted(optim_files.items()):
            info = scan_file(run_dir, f, unit["unit"], scan, cfg, tree_key=Path(f).name)
            obj = info.get("obj")
            osd = obj.get("optimizer_state_dict") if isinstance(obj, dict) else None
            if isinstance(osd, dict):
                if isinstance(osd.get("zero_stage"), int):
                    stages.add(osd["zero_stage"])
                if isinstance(osd.get("partition_count"), int):
                    partition_counts.add(osd["partition_count"])
                elif isinstance(osd.get("partition_count"), list):
                    partition_counts.update(x for x in osd["partition_count"] if isinstance(x, int))
        dp_ranks = sorted({dp for dp, _ in optim_files})
        facts.update(dp_world_size=max(dp_sizes | partition_counts) if (dp_sizes | partition_counts) else None,
                     zero_stage=max(stages) if stages else None, optim_dp_ranks=dp_ranks,
                     mp_ranks=sorted(model_files), global_steps=sorted(steps))
        if steps:
            facts["step"] = max(steps)
        if not model_files:
            scan.add(F.make("missing_model_weights", path=unit["unit"], keys="no mp_rank_XX_model_states.pt"))
        expected = facts["dp_world_size"]
        if optim_files and expected:
            missing = sorted(set(range(expected)) - set(dp_ranks))
            if missing:
                scan.add(F.make("ds_rank_files_missing", path=unit["unit"], ranks=missing, found=len(dp_ranks),
                                expected=expected))
        return scan


ADAPTER = DeepSpeed()
