"""Where a stage's internal files go beside its table, and the bytes it read from audited files.

A stage writing ``<out>/tables/parts/<stage>/<part>.parquet`` (the workflow's layout) keeps its internal files
under ``<out>/work/<kind>/<part>.<ext>``; a table anywhere else (a test, the reader's own folder) keeps them
beside it.  The bytes a stage read (``<out>/work/bytes/<stage>/<part>.json``) feed the report's cost chart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict


def work_file(out: str, kind: str, part: str, ext: str) -> Path:
    """An internal file of ``part`` for a stage table ``out``: ``<out>/work/<kind>/<part>.<ext>`` for a table
    under ``<out>/tables/parts/``, else beside the table.  ``kind`` "bytefacts": the hash stage's facts;
    ``bytes/<stage>``: the bytes a stage read."""
    o = Path(out)
    if o.parent.parent.name == "parts" and o.parent.parent.parent.name == "tables":
        return o.parents[3] / "work" / kind / f"{part}.{ext}"
    return o.with_name(f"{o.stem}.{kind.replace('/', '.')}.{ext}")


def bytes_path(out: str, stage: str, part: str) -> Path:
    """Where a stage writes the bytes it read from audited files (``<out>/work/bytes/<stage>/<part>.json``)."""
    return work_file(out, f"bytes/{stage}", part, "json")


def write_bytes(out: str, stage: str, part: str, before: Dict[str, int], **extra) -> dict:
    """Write the bytes this stage read from audited files since ``before`` (:func:`ckptaudit.fs.stage_bytes`):
    ``local``, ``remote_ranged``, ``remote_streamed`` and ``total`` (bytes), plus ``extra``."""
    return _write_bytes_doc(bytes_path(out, stage, part), stage, part, before, extra)


def write_bytes_at(work: Path, stage: str, part: str, before: Dict[str, int], **extra) -> dict:
    """:func:`write_bytes` into the work folder ``work`` (``<work>/bytes/<stage>/<part>.json``)."""
    return _write_bytes_doc(Path(work) / "bytes" / stage / f"{part}.json", stage, part, before, extra)


def _write_bytes_doc(p: Path, stage: str, part: str, before: Dict[str, int], extra: dict) -> dict:
    from .. import fs
    from .._io import atomic_write

    now = fs.stage_bytes()
    doc = {"stage": stage, "part": part, **{k: now[k] - before.get(k, 0) for k in now}}
    doc["total"] = doc["local"] + doc["remote_ranged"] + doc["remote_streamed"]
    doc.update(extra)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, json.dumps(doc, indent=1).encode())
    return doc


def work_dir(out: str) -> Path:
    """The folder of a stage's internal files for a stage table ``out``: ``<out>/work`` for a table under
    ``<out>/tables/parts/``, else ``<table>.work`` beside the table."""
    o = Path(out)
    if o.parent.parent.name == "parts" and o.parent.parent.parent.name == "tables":
        return o.parents[3] / "work"
    return o.with_name(f"{o.stem}.work")
