"""What each unit's last verification was: the ledger a ``verify_budget`` audit reuses and compares with.

In the output folder's ``work/``:

- ``verify_ledger.json`` (:data:`LEDGER`): per unit, the **strong key** its bytes were verified under (each of
  its files', sidecars' and manifest's ``[size_bytes, mtime_ns, ctime_ns, inode, device]``,
  :func:`ckptaudit.verification.reverify.stat_key`) and the hash rows of that verification:
  ``{"schema", "units": {unit: {"keys": {path: key}, "rows": [row], "recorded_utc"}}}``;
- ``verified/<part>.json`` (:data:`FRAGMENTS`): what each hash job adds (same shape), merged into the ledger,
  newest ``recorded_utc`` first, by the next budgeted audit's plan (:func:`load_ledger`, :func:`write_ledger`).

A unit's previous rows stand for tonight's only under the same strong key and with a digest of every file
(:func:`carried_rows`); a unit read again under the same strong key whose digest moved changed below the file
system (:func:`digest_changed`).  Nothing here reads or writes an audited file: it stats them only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

__all__ = ["LEDGER", "FRAGMENTS", "unit_keys", "load_ledger", "write_ledger", "write_fragment", "verified_utc",
           "carried_rows", "digest_changed", "read_json"]

LEDGER = "verify_ledger.json"
FRAGMENTS = "verified"
_SCHEMA = "ckptaudit.verification.ledger/1"


def unit_keys(root: str, unit: dict, object_store: Optional[dict] = None) -> Dict[str, object]:
    """The strong key of ``unit`` (an inventory unit): ``{path: [size_bytes, mtime_ns, ctime_ns, inode, device]
    or None}`` for each of its files, sidecars and manifest (run-relative paths); for an object-store run
    ``{"object_store": the inventory's sizes and ETags}`` (``object_store``)."""
    from .. import fs
    from .reverify import stat_key

    if fs.is_remote(root):
        return {"object_store": object_store}
    paths = list(unit["files"]) + list(unit.get("sidecars", [])) + ([unit["manifest"]] if unit.get("manifest") else [])
    return {p: stat_key(os.path.join(root, p)) for p in paths}


def read_json(path: Path) -> Optional[dict]:
    """The ledger document (or a hash job's addition) at ``path``; None when it is missing, cut short, or not a
    ``ckptaudit.verification.ledger/1`` document (nothing is known then, so its units are read)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):  # none yet, or one cut short: nothing is known, so the units are read
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == _SCHEMA else None


def load_ledger(work: str | os.PathLike) -> Dict[str, dict]:
    """``{unit: {"keys", "rows", "recorded_utc"}}``: the ledger in ``work`` with each hash job's additions
    (``work/verified/*.json``) merged in, the newest ``recorded_utc`` of each unit winning.  A missing or
    unreadable file adds nothing."""
    w = Path(work)
    units: Dict[str, dict] = {}
    docs = [read_json(w / LEDGER)] + [read_json(p) for p in sorted((w / FRAGMENTS).glob("*.json"))]
    for doc in docs:
        for name, e in ((doc or {}).get("units") or {}).items():
            if name not in units or str(e.get("recorded_utc", "")) > str(units[name].get("recorded_utc", "")):
                units[name] = e
    return units


def _write_doc(path: Path, units: Dict[str, dict]) -> None:
    from .._io import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({"schema": _SCHEMA, "units": units}, sort_keys=True).encode())


def write_ledger(work: str | os.PathLike, units: Dict[str, dict]) -> None:
    """Write ``units`` as ``work/verify_ledger.json`` (atomically), then remove the hash jobs' additions it
    holds (``work/verified/*.json``).  Only the process that runs the workflow calls it, under the output
    folder's lock."""
    w = Path(work)
    merged = sorted((w / FRAGMENTS).glob("*.json"))
    _write_doc(w / LEDGER, units)
    for p in merged:
        p.unlink(missing_ok=True)


def write_fragment(path: str | os.PathLike, units: Dict[str, dict]) -> None:
    """A hash job's additions to the ledger (``{unit: {"keys", "rows", "recorded_utc"}}``), atomically."""
    _write_doc(Path(path), units)


def verified_utc(entry: Optional[dict]) -> Optional[str]:
    """When the bytes of a ledger entry's unit were last verified: its least recently hashed file's
    ``hashed_at_utc``; None when a file of it has none (never verified, or unreadable)."""
    rows = [r for r in (entry or {}).get("rows", []) if r.get("file")]
    times = [r.get("hashed_at_utc") or "" for r in rows]
    if not times or not all(times):
        return None
    return min(times)


def carried_rows(entry: Optional[dict], keys_now: Dict[str, object], files: Sequence[str]) -> Optional[List[dict]]:
    """The previous hash rows of a unit, when they may stand for tonight's: its strong key ``keys_now`` equals
    the one they were verified under and each of its ``files`` has a row with a digest time (the previous
    digest).  None otherwise: the unit must be read."""
    if not entry or entry.get("keys") != keys_now:
        return None
    rows = entry.get("rows") or []
    timed = {r.get("file") for r in rows if r.get("hashed_at_utc")}
    if not rows or not set(files) <= timed:
        return None
    return [dict(r) for r in rows]

def digest_changed(row: dict, before: Optional[dict]):
    """A ``digest_changed_unseen`` finding when ``row`` (a hash row read now) has another digest than ``before``
    (its file's row at the last verification, whose strong key the caller found unchanged) at the same size;
    else None."""
    from .. import findings as F

    now, then = row.get("digest_hex") or "", (before or {}).get("digest_hex") or ""
    if not now or not then or now == then or row.get("size_bytes") != before.get("size_bytes") or \
            row.get("digest_algorithm") != before.get("digest_algorithm"):  # another algorithm is no comparison
        return None
    return F.make("digest_changed_unseen", path=row["file"], actual=now, expected=then,
                  verified_utc=str(before.get("hashed_at_utc") or "")[:19].replace("T", " ") + " UTC")
