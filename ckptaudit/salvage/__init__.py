"""Salvage: every tensor of a damaged checkpoint unit whose bytes are proven intact, as safetensors.

    from ckptaudit.salvage import salvage
    report = salvage("run/ckpt_000300.pt", "/scratch/salvaged-300", fill_from="run/ckpt_000200.pt")

Reads the unit without unpickling anything (the static walk of data.pkl names each tensor; its bytes are
copied from the file as they are), proves each tensor intact, lost, unproven or suspect
(:mod:`ckptaudit.intact`: the zip record's CRC-32, a ckptaudit manifest's chunk digests; finite values never count),
and publishes into ``out`` (a new folder, through :func:`ckptaudit.publish.publish`: sidecars, manifest,
``COMPLETE``) one safetensors file per data file of the unit holding its intact tensors, and
``salvage.json``, the report: each tensor's status and proof, where it came from and at which step.
``fill_from``: an older unit of the same structure; each tensor not salvaged is taken from it when it is
intact there with the same dtype and shape.  The result is a warm start, never a resume: the optimizer,
scheduler and RNG state it holds, if any, are a mix of two steps or incomplete.

The unit is only read; ``out`` may not lie inside the run folder or the unit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional

from ..intact import INTACT, LOST, SAFETENSORS_DTYPE, SUSPECT, UNPROVEN, TensorBytes, counts, unit_tensors
from ..units import step_from_name

__all__ = ["salvage", "SalvageRefused"]

SCHEMA = "ckptaudit.salvage/1"
REPORT_NAME = "salvage.json"
class SalvageRefused(ValueError):
    """The salvage was not started: a bad unit, or an output folder that is not allowed (inside the run
    folder or the unit, or already there)."""


def _check_out(unit: Path, out: Path, run_dir: Optional[Path]) -> None:
    run = (run_dir or (unit.parent if unit.is_file() else unit.parent)).resolve()
    o = out.resolve()
    for inside, what in ((unit.resolve(), "the unit"), (run, "the run folder")):
        if o == inside or inside in o.parents:
            raise SalvageRefused(f"{out}: inside {what} ({inside}); salvage never writes into what it audits, "
                                 "give an --out outside it")
    if os.path.lexists(out):
        raise SalvageRefused(f"{out}: already exists; salvage writes a new folder")


def _fill(tensors: List[TensorBytes], older: List[TensorBytes], older_unit: str, older_step) -> int:
    """Replace each tensor not intact by the same-named intact tensor of ``older`` (same dtype, shape);
    returns how many were filled."""
    by_name = {(t.file, t.name): t for t in older if t.status == INTACT}
    by_bare = {t.name: t for t in older if t.status == INTACT}
    n = 0
    for i, t in enumerate(tensors):
        if t.status == INTACT:
            continue
        o = by_name.get((t.file, t.name)) or by_bare.get(t.name)
        if o is None or o.dtype != t.dtype or o.shape != t.shape:
            continue
        filled = TensorBytes(**{**o.__dict__, "file": t.file, "name": t.name})
        filled.source = {"unit": older_unit, "step": older_step, "file": o.file, "was": t.status,
                         "why_not_own": t.proof}
        tensors[i] = filled
        n += 1
    return n


def salvage(unit: str | os.PathLike, out: str | os.PathLike, *, fill_from: Optional[str | os.PathLike] = None,
            run_dir: Optional[str | os.PathLike] = None, include_unproven: bool = False) -> dict:
    """Salvage ``unit`` into the new folder ``out``; returns the report (also written as ``out/salvage.json``).

    ``include_unproven``: also write tensors whose bytes are all there but unchecked (``unproven``; never
    ``suspect`` or ``lost``).  ``run_dir``: the run folder ``out`` must stay out of (default: the unit's
    parent).  Raises :class:`SalvageRefused` before reading anything for a missing unit, an ``out`` inside
    the run folder or the unit, or one that exists; ``OSError`` when a file cannot be read; the publish
    errors of :func:`ckptaudit.publish.publish`."""
    from ..publish import publish
    from . import writer

    src, dest = Path(unit), Path(out)
    _check_out(src, dest, Path(run_dir) if run_dir else None)
    step = step_from_name(src.name)
    try:
        tensors, files = unit_tensors(src, run_dir)
    except FileNotFoundError as e:
        raise SalvageRefused(str(e)) from None
    own = counts(tensors)
    keep_status = (INTACT, UNPROVEN) if include_unproven else (INTACT,)
    filled = 0
    if fill_from is not None:
        try:
            older, _ = unit_tensors(fill_from, run_dir)
        except FileNotFoundError as e:
            raise SalvageRefused(f"--fill-from: {e}") from None
        filled = _fill(tensors, older, str(Path(fill_from)), step_from_name(Path(fill_from).name))
    chosen = [t for t in tensors if t.status in keep_status and t.dtype in SAFETENSORS_DTYPE]
    by_file: Dict[str, List[TensorBytes]] = {}
    for t in chosen:
        by_file.setdefault(t.file, []).append(t)
    report = _report(src, step, tensors, files, own, filled, fill_from, by_file, include_unproven)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with publish(dest.parent, step or 0, name=dest.name, folder=True, rank=0, world_size=1,
                 update_latest=False, config={"salvaged_from": str(src.resolve())}) as pub:
        for file, ts in by_file.items():
            meta = {"ckptaudit": SCHEMA, "source_unit": str(src.resolve()), "source_file": file,
                    "source_step": str(step)}
            writer.write(pub.open(report["outputs"][file]), ts, meta)
        import json

        w = pub.open(REPORT_NAME)
        w.write(json.dumps(report, indent=1).encode())
    return report


def _output_name(file: str) -> str:
    return file if file.endswith(".safetensors") else f"{file}.safetensors"


def _report(src: Path, step, tensors, files, own, filled, fill_from, by_file, include_unproven) -> dict:
    total = sum(t.nbytes for t in tensors)
    written = sum(t.nbytes for ts in by_file.values() for t in ts)
    intact_own = sum(t.nbytes for t in tensors if t.status == INTACT and not t.source)
    return {
        "schema": SCHEMA, "unit": str(src.resolve()), "step": step,
        "fill_from": str(Path(fill_from).resolve()) if fill_from else None,
        "include_unproven": include_unproven,
        "counts": own, "filled": filled,
        "written": sum(len(v) for v in by_file.values()),
        "bytes": {"named": total, "written": written, "intact_own": intact_own},
        "intact_share": round(intact_own / total, 6) if total else 0.0,
        "files": files,
        "outputs": {f: _output_name(f) for f in by_file},
        "usable_for": "warm start",
        "tensors": [t.row() for t in tensors],
        "statuses": {INTACT: "bytes checked by a record made at save time", LOST: "bytes missing or changed",
                     UNPROVEN: "bytes present, nothing checks them", SUSPECT: "unchecked and holds an all-zero page"},
    }
