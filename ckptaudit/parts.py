"""Parts: how a run's units are grouped into Snakemake jobs, and the inventory as the jobs read it back.

A *part* is a group of units (in (step, name) order) that one job of each per-unit rule
handles; :func:`ckptaudit.inventory.run_inventory` assigns them, and every stage job and the
Snakefile's input functions select their units with :func:`part_units`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List

from . import fs

if TYPE_CHECKING:  # pragma: no cover
    from .units import Unit


def auto_units_per_job(n_units: int) -> int:
    """One unit per job up to 16 units; beyond, the smallest power of two that keeps
    the part count at or under 16 (stable while a run grows: parts change only when
    the run crosses 16·2^k units).

    Each part costs ~7 Snakemake jobs of a fresh Python process (~0.25 s each, the
    load job ~1.5 s for ``import torch``), and Snakemake's own scheduling cost grows
    with the job count; 16 parts keep a 1,000-unit audit bounded by hashing and
    parsing, not by process start-up (docs/benchmarks-history.md, "1,000 small units").
    """
    if n_units <= 16:
        return 1
    return 1 << math.ceil(math.log2(math.ceil(n_units / 16)))


def assign_parts(units: List[Unit], units_per_job) -> Dict[str, List[str]]:
    """Group units (already in (step, name) order) into Snakemake jobs.

    Returns {part_id: [unit, ...]}; part ids are ``p0000``, ``p0001``…  The
    grouping depends only on the order, so new (later) units only touch the
    last part.
    """
    per = auto_units_per_job(len(units)) if units_per_job in (None, "auto") else int(units_per_job)
    parts: Dict[str, List[str]] = {}
    for i, u in enumerate(units):
        pid = f"p{i // per:04d}"
        u.part = pid
        parts.setdefault(pid, []).append(u.unit)
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
            h.update(f"{os.path.relpath(fp, root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def read_inventory(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


_INV_CACHE: Dict[tuple, dict] = {}


def read_inventory_cached(path: str) -> dict:
    """:func:`read_inventory`, cached on (path, size, mtime)."""
    st = os.stat(path)
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    if key not in _INV_CACHE:
        _INV_CACHE.clear()
        _INV_CACHE[key] = read_inventory(path)
    return _INV_CACHE[key]


def part_units(inv: dict, part: str) -> List[dict]:
    wanted = set(inv["parts"].get(part, []))
    return [u for u in inv["units"] if u["unit"] in wanted]
