"""Megatron-LM iteration folders and the tracker file.

Format facts (megatron/training/checkpointing.py ``get_checkpoint_name``,
``read_metadata``): ``latest_checkpointed_iteration.txt`` holds an iteration
number or ``release``; ``iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt``
holds one file per tensor (TT) and pipeline (PPP) rank, each recording
``iteration``, ``args`` (with ``tensor_model_parallel_size`` and
``pipeline_model_parallel_size``) and ``checkpoint_version``.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from .. import findings as F
from .base import UnitScan, scan_file

ITER_RE = re.compile(r"^(iter_\d{7}|release)$")
RANK_RE = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?$")


class Megatron:
    name = "megatron"

    def claim_dir(self, path: Path) -> bool:
        if not ITER_RE.match(path.name):
            return False
        try:
            return any(RANK_RE.match(p.name) for p in path.iterdir() if p.is_dir())
        except OSError:
            return False

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        iterations = {}
        ranks = set()
        tp = pp = None
        for f in unit["files"]:
            parts = Path(f).parts
            rank_dir = parts[-2] if len(parts) >= 2 else ""
            m = RANK_RE.match(rank_dir)
            if not m:
                continue
            ranks.add((int(m.group(1)), int(m.group(2) or 0)))
            info = scan_file(run_dir, f, unit["unit"], scan, cfg, tree_key=f"{rank_dir}/{Path(f).name}",
                             byte_facts=byte_facts)
            tp, pp = _rank_file_facts(info.get("obj"), rank_dir, iterations, tp, pp)
        scan.facts.update(iterations=iterations, ranks=sorted(ranks), tensor_parallel=tp, pipeline_parallel=pp)
        distinct = sorted(set(iterations.values()))
        if len(distinct) > 1:
            desc = ", ".join(f"{r}: {it}" for r, it in sorted(iterations.items()))
            scan.add(F.make("mixed_step_shards", path=unit["unit"], iterations=desc))
        if distinct:
            scan.facts["step"] = max(distinct) if len(distinct) == 1 else min(distinct)
        if ranks:
            _missing_ranks(scan, unit["unit"], ranks, tp, pp)
        return scan


def _rank_file_facts(obj, rank_dir: str, iterations: dict, tp, pp) -> tuple:
    """A rank file's ``iteration`` (into ``iterations`` by rank folder) and the tensor/pipeline parallel sizes
    its ``args`` declare (``(tp, pp)``, the ones given when it declares none)."""
    from .dcp import state_fields

    if not isinstance(obj, dict):
        return tp, pp
    it = obj.get("iteration")
    if isinstance(it, int):
        iterations[rank_dir] = it
    args = state_fields(obj.get("args"))
    if isinstance(args, dict):
        tp = args.get("tensor_model_parallel_size", tp)
        pp = args.get("pipeline_model_parallel_size", pp)
    return tp, pp


def _missing_ranks(scan: UnitScan, unit: str, ranks: set, tp, pp) -> None:
    """``megatron_rank_missing`` for every (tensor, pipeline) rank of the grid the args declare (else the grid
    the folders span) without a folder; Megatron adds the ``_PPP`` part only when
    pipeline_model_parallel_size > 1."""
    want_tp = tp if type(tp) is int and tp > 0 else max(r[0] for r in ranks) + 1
    want_pp = pp if type(pp) is int and pp > 0 else max(r[1] for r in ranks) + 1
    n_missing = want_tp * want_pp - sum(1 for t, q in ranks if t < want_tp and q < want_pp)
    if n_missing > 0:  # name at most 8 (the args of a hostile file may declare a billion ranks)
        names = itertools.islice((f"mp_rank_{t:02d}" + (f"_{q:03d}" if want_pp > 1 else "")
                                  for t in range(want_tp) for q in range(want_pp) if (t, q) not in ranks), 8)
        missing = ", ".join(names) + (f" and {n_missing - 8} more" if n_missing > 8 else "")
        scan.add(F.make("megatron_rank_missing", path=unit, missing=missing, found=len(ranks)))


ADAPTER = Megatron()
