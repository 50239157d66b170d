"""Each part's share of the inventory, so that a part's stage job reads its own units, not the whole run's.

Why (issue 45): every per-part job (hash, scan, load, structure, configdiff, state) read ``inventory.json`` whole
and kept the part's units.  At 50,000 small units that document is 17 MB; parsing it cost each job 0.32 CPU-s
and 103 MiB (measured on 2026-12-07, ``json.load`` alone), 294 jobs in all on 49 parts: a per-job cost that grew
with the run's count, not the part's.  The inventory stage now also writes, beside ``inventory.json``, one
document per part under :data:`FOLDER`; a job reads its part's.

A part document holds what a part's stage reads of the inventory and nothing else: ``run_dir``, ``units`` (the
part's, in the inventory's order), ``parts`` (the part alone) and ``object_store`` (the part's units' entries);
the run's pointers and stray files stay in ``inventory.json`` for the report.  It records the size and SHA-256
of the ``inventory.json`` it was cut from: a job whose part document does not match the ``inventory.json`` beside
it (an inventory stopped between the two writes, a document left by an earlier inventory) reads
``inventory.json`` whole, as before, so the part documents change the cost, never the result.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Dict, List

from ..._io import atomic_write

#: the folder beside ``inventory.json`` that holds ``<part>.json``
FOLDER = "inventory_parts"


def _identity(json_path: str | os.PathLike) -> List:
    """``[size, SHA-256 hex]`` of the bytes of ``json_path``: by content, since Snakemake touches a job's outputs
    after it ends (a new mtime, the same bytes), and an inode can be reused.  ~10 ms for the 17 MB of 50,000
    units, against 320 ms to parse them."""
    with open(json_path, "rb") as f:
        data = f.read()
    return [len(data), hashlib.sha256(data).hexdigest()]


def part_doc_path(json_path: str | os.PathLike, part: str) -> Path:
    """Where the part document of ``part`` cut from ``json_path`` (``inventory.json``) lies."""
    return Path(json_path).parent / FOLDER / f"{part}.json"


def write_part_docs(doc: Dict, json_path: str | os.PathLike) -> None:
    """One document per part of ``doc`` under :data:`FOLDER` beside ``json_path``, after ``json_path`` is
    written (each records its identity); documents of parts ``doc`` no longer has are removed (the audit's own
    work folder, never the run's)."""
    ident = _identity(json_path)
    folder = part_doc_path(json_path, "-").parent
    folder.mkdir(parents=True, exist_ok=True)
    at = {u["unit"]: i for i, u in enumerate(doc["units"])}
    osd = doc.get("object_store") or {}
    for part, names in doc["parts"].items():  # the part's units in the inventory's order, as part_units gives them
        units = [doc["units"][i] for i in sorted(at[n] for n in set(names) if n in at)]
        one = {"inventory": ident, "run_dir": doc["run_dir"], "units": units, "parts": {part: list(names)},
               "object_store": {u["unit"]: osd[u["unit"]] for u in units if u["unit"] in osd}}
        atomic_write(part_doc_path(json_path, part), json.dumps(one, sort_keys=True, separators=(",", ":")).encode())
    for p in folder.glob("*.json"):
        if p.stem not in doc["parts"]:
            p.unlink(missing_ok=True)


def read_part_inventory(json_path: str | os.PathLike, part: str) -> Dict:
    """The inventory as ``part``'s stage job needs it: its part document when that was cut from the
    ``inventory.json`` at ``json_path`` as it is now, else ``inventory.json`` whole.  Raises ``OSError`` or
    ``ValueError`` when ``inventory.json`` cannot be read or parsed."""
    from .parts import read_inventory

    try:
        with open(part_doc_path(json_path, part)) as f:
            one = json.load(f)
        cut_from = one.pop("inventory", None)
        if isinstance(cut_from, list) and cut_from[:1] == [os.stat(json_path).st_size] \
                and cut_from == _identity(json_path):
            return one
    except (OSError, ValueError):
        pass  # no document, or a torn one: the whole inventory answers
    return read_inventory(str(json_path))
