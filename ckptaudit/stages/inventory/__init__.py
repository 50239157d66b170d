"""The inventory stage: every unit, pointer and leftover of a run (:mod:`ckptaudit.discovery`), grouped into
the parts the other stages take (:mod:`.parts`)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Dict, Optional

from ... import fs
from ..._io import atomic_write
from .parts import SMALL_PART_BYTES, assign_parts, auto_units_per_job, listing_fingerprint  # noqa: F401 - re-exported


def run_inventory(run_dir: str, units_per_job="auto", part_bytes: Optional[int] = SMALL_PART_BYTES) -> Dict:
    """Discover units and pointers; return the plain-data inventory document (parts by
    :func:`assign_parts`: ``part_bytes`` None on one machine, packing by count only)."""
    from .. import liveness
    from ...discovery import discover, given_unit, unit_objects  # here: parts alone stays light

    given = given_unit(run_dir)
    if given is not None:  # the path is one unit (a checkpoint-40/ folder, a file): audited as that unit
        run_dir, units, pointers, stray = given
    else:
        units, pointers, stray = discover(run_dir)
    object_store = unit_objects(run_dir, units) if fs.is_remote(run_dir) else {}
    for u in units:
        if set(u.snapshot) != set(u.files):  # the walk's lstat of each file, else taken now
            u.snapshot = liveness.snapshot(run_dir, u.files)
    parts = assign_parts(units, units_per_job, part_bytes)
    return {
        "object_store": object_store,
        # absolute: the verdict, the report and the summary name it, and repairs run in it, wherever read
        "run_dir": str(run_dir) if fs.is_remote(run_dir) else os.path.abspath(run_dir),
        "units": [u.to_dict() for u in units],
        "pointers": [asdict(p) for p in pointers],
        "stray_files": stray,
        "parts": parts,
    }


def write_inventory(doc: Dict, parquet_path: str, json_path: str) -> None:
    """Write ``inventory.parquet`` (one row per unit) and the JSON the Snakefile reads."""
    from ... import tables

    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    tables.write("inventory", [{k: v for k, v in u.items() if k not in ("snapshot", "irregular")}
                               for u in doc["units"]], parquet_path)
    # compact: json's C encoder (an indent makes it the pure-Python one, ~2 s for 50,000 files)
    atomic_write(json_path, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
