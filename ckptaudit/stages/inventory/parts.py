"""Parts: how a run's units are grouped into Snakemake jobs, and the inventory as the jobs read it back.

A *part* is a group of units (in (step, name) order) that one job of each per-unit rule
handles; :func:`ckptaudit.stages.inventory.run_inventory` assigns them, and every stage job and the
Snakefile's input functions select their units with :func:`part_units`.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

from ... import fs

if TYPE_CHECKING:  # pragma: no cover
    from ...units import Unit


#: Most units "auto" gives one part.  A stage job holds a little per unit of its part (its scan rows, its
#: results): at 4,096 small units a part (a 50,000-unit run in 13 parts) the structure, configdiff and state jobs
#: peaked at 417–476 MiB, against 74–92 MiB at 128 (issue 45, docs/benchmarks-history.md), so past 16,384 units
#: a run gets more parts of this size instead of bigger ones, and a job's memory stops growing with the run.
MAX_AUTO_UNITS_PER_JOB = 1024


def auto_units_per_job(n_units: int) -> int:
    """The least units per part under "auto" (:func:`assign_parts` packs small units
    beyond it): one up to 16 units; beyond, the smallest power of two that keeps the
    part count at or under 16 (stable while a run grows: parts change only when the
    run crosses 16·2^k units), at most :data:`MAX_AUTO_UNITS_PER_JOB` (past 16,384 units
    the part count grows with the run instead, and parts no longer change).

    Each part costs ~7 Snakemake jobs of a fresh Python process (~0.25 s each, the
    load job ~1.5 s for ``import torch``), and Snakemake's own scheduling cost grows
    with the job count; 16 parts keep a 1,000-unit audit bounded by hashing and
    parsing, not by process start-up (docs/benchmarks-history.md, "1,000 small units").
    """
    if n_units <= 16:
        return 1
    return min(MAX_AUTO_UNITS_PER_JOB, 1 << math.ceil(math.log2(math.ceil(n_units / 16))))


#: "auto" on a cluster packs consecutive units into one part while the part stays within this many bytes
#: (and :data:`SMALL_PART_UNITS` units): a few units cost one set of jobs, not one set each, and units larger
#: than this keep a part each, so the cluster spreads them over nodes.  A part's fixed cost is ~7 fresh Python
#: processes and one ``import torch``, ~3.5 CPU-s, the SHA-256 of ~4 GiB at 1.2 GiB/s on one core
#: (docs/benchmarks-history.md, issue 15): below that, start-up outweighs the bytes.
SMALL_PART_BYTES = 4 << 30
SMALL_PART_UNITS = 16


def assign_parts(units: List[Unit], units_per_job, part_bytes: Optional[int] = SMALL_PART_BYTES
                 ) -> Dict[str, List[str]]:
    """Group units (already in (step, name) order) into Snakemake jobs.

    Returns {part_id: [unit, ...]}; part ids are ``p0000``, ``p0001``…  A number puts
    that many units in each part.  ``"auto"`` packs units greedily in order: a part
    takes at least :func:`auto_units_per_job` units (the count rule that bounds the
    part count of a large run) and keeps taking more, up to
    ``max(SMALL_PART_UNITS, that count)``, while its bytes stay within ``part_bytes``
    (default :data:`SMALL_PART_BYTES`, for a cluster: units of several GiB keep a part
    each and run on several nodes).  ``part_bytes`` None (a local run) packs by count
    only: the hash job hashes its part's units at once on every core it has
    (``rules/resources.smk``: ``get_hash_threads``), so one machine gains nothing from
    a part per big unit and would pay each one a chain of ~7 jobs and an ``import torch``
    (3 units of 3 GiB on 2 cores: 22 jobs, 0.66–0.74× the wall with one part; BENCHMARKS.md).
    The grouping depends only on the order, the unit count and the sizes of the units,
    so new (later) units only touch the last part.
    """
    if units_per_job not in (None, "auto"):
        per = int(units_per_job)
        groups = [units[i:i + per] for i in range(0, len(units), per)]
    else:
        least = auto_units_per_job(len(units))
        most = max(SMALL_PART_UNITS, least)
        budget = part_bytes if part_bytes is not None else float("inf")
        groups, cur, cur_bytes = [], [], 0
        for u in units:
            size = max(0, int(u.size_bytes or 0))
            if cur and (len(cur) >= most or (len(cur) >= least and cur_bytes + size > budget)):
                groups.append(cur)
                cur, cur_bytes = [], 0
            cur.append(u)
            cur_bytes += size
        if cur:
            groups.append(cur)
    parts: Dict[str, List[str]] = {}
    for i, group in enumerate(groups):
        pid = f"p{i:04d}"
        for u in group:
            u.part = pid
        parts[pid] = [u.unit for u in group]
    return parts


def listing_fingerprint(run_dir: str) -> str:
    """A cheap fingerprint of names, sizes and mtimes under ``run_dir``.

    The Snakefile passes it to the inventory rule as a param, so Snakemake
    re-runs inventory (and only inventory) when the folder's listing changes.
    """
    import hashlib

    if fs.is_remote(run_dir):  # names, sizes, ETags and unfinished multipart uploads
        return fs.listing_fingerprint(run_dir)
    h = hashlib.sha256()
    root = Path(run_dir)
    if not root.exists():
        return "missing"
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for fn in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            fp = os.path.join(dirpath, fn)
            try:
                st = os.lstat(fp)
            except OSError:
                continue
            # the name's own bytes (os.fsencode): a name that is not UTF-8 is a finding, not a crash here
            h.update(os.fsencode(os.path.relpath(fp, root)) + f"\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def read_inventory(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def read_inventory_cached(path: str) -> dict:
    """:func:`read_inventory`, cached on (path, size, mtime): the last one read (callers only read it)."""
    st = os.stat(path)
    return _read_inventory_once(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _read_inventory_once(path: str, size: int, mtime_ns: int) -> dict:
    return read_inventory(path)


def part_units(inv: dict, part: str) -> List[dict]:
    wanted = set(inv["parts"].get(part, []))
    return [u for u in inv["units"] if u["unit"] in wanted]
