"""Resource sizing for the rules: memory (MiB) and runtime (minutes) of each stage's jobs.

Pure functions the rules' ``resources:`` call through ``rules/resources.smk``:
:func:`mem_mb_for`, :func:`runtime_for`, :func:`part_size`, :func:`hash_threads`.  Memory is MiB (Snakemake's
``mem_mb``), runtime is minutes (Snakemake's ``runtime``), both grow with the ``attempt``
number so a job killed for memory or time (an infrastructure failure, see
``config/profiles/slurm/config.yaml``) is retried with more.  Stdlib only.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

MIB = 1 << 20

#: Baseline memory (MiB) of one job of each stage, independent of the checkpoint's size.
#: Measured peak RSS on the demo and on a 1 GiB checkpoint (BENCHMARKS.md, "Memory"): every
#: stage streams, ≤ ~130 MiB without torch and ≤ ~310 MiB for ``load`` (it imports torch);
#: the figures below leave 2-4x headroom for Python/pyarrow differences between sites.
BASE_MEM_MB: Dict[str, int] = {
    "inventory": 512,
    "hash": 512,
    "scan": 512,
    "load": 1024,
    "configdiff": 512,
    "structure": 768,
    "state": 768,
    "report": 1024,
}

#: Extra memory per byte of the part's *largest* unit.  Only ``load`` holds a unit's data:
#: ``torch.load(mmap=True)`` maps a torch-zip file (file-backed pages are charged to the job's
#: cgroup on SLURM), and legacy (pre-1.6, non-zip) pickles cannot be mapped and are read whole
#: (the bytes, then the tensors built from them: up to ~2x).  The factor must not be tight: if
#: the job's cgroup limit kills the load child before its own ``RLIMIT_AS`` does, the unit is
#: recorded as ``load_memory_limit`` on the cluster but not locally.
MEM_PER_UNIT_BYTE: Dict[str, float] = {"load": 2.0}

#: Extra memory (MiB) per unit of the run for stages that hold every unit's rows at once: the
#: report joins all parts' tables (the tensor table has one row per tensor of every unit).
MEM_MB_PER_UNIT: Dict[str, float] = {"report": 0.25}

#: Sustained read rate (MiB/s) assumed per stage for the bytes it reads; deliberately low
#: (a busy parallel file system, not a local NVMe).  Stages absent here read metadata only.
READ_MIB_PER_S: Dict[str, float] = {"hash": 100.0, "scan": 100.0, "load": 100.0, "state": 100.0}

#: Per-unit fixed cost (seconds): opening, parsing headers, forking the load child; the
#: report's cost per unit is joining its rows.
SECONDS_PER_UNIT: Dict[str, float] = {"load": 5.0, "report": 0.1}
DEFAULT_SECONDS_PER_UNIT = 1.0

#: Minutes every job of a stage asks for on top of its bytes: Python start-up and imports
#: (seconds), plus, for the inventory, listing a run folder on a busy parallel file system
#: before its size is known.  Per-part stages run as groups (config/profiles/slurm), where
#: Snakemake adds up its members' runtimes, so their base is small.
BASE_RUNTIME_MIN: Dict[str, int] = {"inventory": 10, "report": 5}
DEFAULT_BASE_RUNTIME_MIN = 1

#: Bytes of a part per thread its hash job asks for: below ~256 MiB a unit's hashing is mostly Python
#: (planning, parsing, writing rows, under the GIL), so more threads would only reserve cores idle.
HASH_BYTES_PER_THREAD = 256 * MIB


def hash_threads(total_bytes: int, n_units: int) -> int:
    """Threads of a part's hash job: one per :data:`HASH_BYTES_PER_THREAD` of its ``total_bytes``, at most one
    per unit (``n_units``; the job hashes its units at once, ``ckptaudit.stages.cli.stage_hash``), at least 1.
    Snakemake caps it at ``--cores`` (the SLURM profile's ``cores: 1`` makes it 1 there)."""
    return max(1, min(int(n_units), int(total_bytes) // HASH_BYTES_PER_THREAD))


def _stage(stage: str) -> str:
    if stage not in BASE_MEM_MB:
        raise ValueError(f"unknown stage {stage!r}: expected one of {sorted(BASE_MEM_MB)}")
    return stage


def mem_mb_for(stage: str, unit_bytes: int = 0, attempt: int = 1, load_limit_mib: Optional[int] = None,
               n_units: int = 0) -> int:
    """Memory (MiB, Snakemake ``mem_mb``) for one job of ``stage``.

    ``unit_bytes`` is the size of the largest unit the job audits (units are audited one
    after the other inside a job, so the largest one sets the peak).  ``load_limit_mib`` is
    the load test's own address-space limit (``load.memory_limit_mib``): the load child
    cannot use more, so the request is capped at baseline + that limit.  ``n_units`` is the
    number of units whose rows the job holds at once (only the report's figure depends on
    it).  ``attempt`` (1, 2, …) multiplies the result: a retry after an out-of-memory kill
    asks for more.
    """
    base = BASE_MEM_MB[_stage(stage)]
    extra_mib = MEM_PER_UNIT_BYTE.get(stage, 0.0) * max(0, int(unit_bytes)) / MIB
    if load_limit_mib is not None and stage == "load":
        extra_mib = min(extra_mib, float(load_limit_mib))
    extra_mib += MEM_MB_PER_UNIT.get(stage, 0.0) * max(0, int(n_units))
    return int(math.ceil(base + extra_mib)) * max(1, int(attempt))


def runtime_for(stage: str, part_bytes: int = 0, n_units: int = 1, attempt: int = 1,
                load_timeout_s: float = 0.0) -> int:
    """Wall-time limit (minutes, Snakemake ``runtime``) for one job of ``stage``.

    ``part_bytes`` is the total size of the units the job audits, ``n_units`` their
    number.  The estimate is the stage's :data:`BASE_RUNTIME_MIN` plus reading ``part_bytes`` at
    :data:`READ_MIB_PER_S` plus a fixed cost per unit, then doubled for safety; for
    ``load``, one whole ``load_timeout_s`` (``load.timeout_seconds``) is added on top, so
    one hung unit per job is recorded as ``load_timeout`` as it is locally instead of
    the job hitting its limit.  A retry (``attempt`` ≥ 2) multiplies the result, since a
    job killed at its time limit is an infrastructure failure (slow or stalled storage).
    """
    _stage(stage)
    seconds = 0.0
    rate = READ_MIB_PER_S.get(stage)
    if rate:
        seconds += max(0, int(part_bytes)) / MIB / rate
    seconds += max(0, int(n_units)) * SECONDS_PER_UNIT.get(stage, DEFAULT_SECONDS_PER_UNIT)
    hung = max(0.0, float(load_timeout_s)) if stage == "load" else 0.0
    base = BASE_RUNTIME_MIN.get(stage, DEFAULT_BASE_RUNTIME_MIN)
    return (base + int(math.ceil((2 * seconds + hung) / 60))) * max(1, int(attempt))


def part_size(inventory: dict, part: str) -> Tuple[int, int, int]:
    """``(total bytes, largest unit's bytes, number of units)`` of one part of an inventory
    document (``work/inventory.json``: ``parts`` maps part ids to unit names, ``units`` holds
    each unit's ``size_bytes``).  An unknown part is ``(0, 0, 0)``."""
    wanted = set(inventory.get("parts", {}).get(part, []))
    sizes = [int(u.get("size_bytes") or 0) for u in inventory.get("units", []) if u.get("unit") in wanted]
    return sum(sizes), max(sizes, default=0), len(sizes)


def part_sizes(inventory: dict) -> Dict[str, Tuple[int, int, int]]:
    """:func:`part_size` of every part at once (one pass over the units)."""
    size = {u.get("unit"): int(u.get("size_bytes") or 0) for u in inventory.get("units", [])}
    out = {}
    for part, units in inventory.get("parts", {}).items():
        sizes = [size[u] for u in units if u in size]
        out[part] = (sum(sizes), max(sizes, default=0), len(sizes))
    return out


def run_size(inventory: dict) -> Tuple[int, int, int]:
    """``(total bytes, largest unit's bytes, number of units)`` of the whole run."""
    sizes = [int(u.get("size_bytes") or 0) for u in inventory.get("units", [])]
    return sum(sizes), max(sizes, default=0), len(sizes)
