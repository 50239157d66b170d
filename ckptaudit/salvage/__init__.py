"""Salvage: every tensor of a damaged checkpoint unit proven intact, as safetensors.

    from ckptaudit.salvage import salvage
    report = salvage("run/ckpt_000300.pt", "/scratch/salvaged-300", fill_from="run/ckpt_000200.pt")

Reads the unit without unpickling anything (the static walk of data.pkl names each tensor; its bytes are
copied from the file as they are), proves each tensor intact, lost, unproven or suspect (:mod:`ckptaudit.intact`:
its identity, the bytes that name it, and its bytes, by the zip record's CRC-32, a ckptaudit manifest's chunk
digests, a whole-file SHA-256; finite values never count as proof), and publishes into ``out`` (a new folder,
through :func:`ckptaudit.publish.publish`: sidecars, manifest, ``COMPLETE``) one safetensors file per data file
of the unit holding its tensors to write, under unique keys (:mod:`.keys`), each file reopened and checked
(:func:`.writer.check`) before the folder is published, and ``salvage.json``, the report: each tensor's path,
key, status and proof, where it came from and at which step.  ``fill_from``: an older unit of the same
structure; each tensor not salvaged is taken from it when it is intact there with the same path, dtype and
shape.  The result is a warm start, never a resume: the optimizer, scheduler and RNG state it holds, if any,
are a mix of two steps or incomplete.

The unit is only read; ``out`` may not lie inside the run folder or the unit.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..intact import FILLED, INTACT, LOST, SAFETENSORS_DTYPE, SUSPECT, UNPROVEN, TensorBytes, counts, unit_tensors
from .writer import WrittenFileDiffers
from ..units import step_from_name

__all__ = ["salvage", "SalvageRefused", "WrittenFileDiffers"]

SCHEMA = "ckptaudit.salvage/1"
REPORT_NAME = "salvage.json"


class SalvageRefused(ValueError):
    """The salvage was not started: a bad unit, or an output folder that is not allowed (inside the run
    folder or the unit, or already there)."""


def _check_unit(given: Path, run_dir: Optional[Path]) -> Tuple[Path, Path]:
    """``(unit, run folder)``, both resolved (a unit given through a symbolic link is the file it names); raises
    :class:`SalvageRefused` for a missing unit, a unit outside ``run_dir``, or a path that is no checkpoint unit
    of its folder (a run folder, a folder of other files): the inventory of the folder above decides."""
    from ..discovery import discover

    if not os.path.exists(given):
        raise SalvageRefused(f"{given}: no such file or folder")
    unit = given.resolve()
    run = run_dir.resolve() if run_dir else unit.parent
    if run_dir and not run.is_dir():
        raise SalvageRefused(f"--run {run_dir}: no such folder")
    if run != unit.parent and run not in unit.parents:
        raise SalvageRefused(f"{given}: not inside the run folder {run}")
    units = {u.unit for u in discover(unit.parent)[0]}
    if unit.name not in units:
        inside = sorted(u for u in discover(unit)[0] if u.unit != ".") if unit.is_dir() else []
        hint = (f": it holds {len(inside)} units ({', '.join(u.unit for u in inside[:3])}"
                f"{', …' if len(inside) > 3 else ''}); give one of them") if inside else ""
        raise SalvageRefused(f"{given}: not a checkpoint unit{hint}")
    return unit, run


def _check_out(unit: Path, out: Path, run: Path, given: Path) -> None:
    o = out.resolve()
    for inside, what in ((unit, "the unit"), (run, "the run folder"), (given.parent.resolve(), "the unit's folder")):
        if o == inside or inside in o.parents:
            raise SalvageRefused(f"{out}: inside {what} ({inside}); salvage never writes into what it audits, "
                                 "give an --out outside it")
    if os.path.lexists(out):
        link = " (a symbolic link)" if os.path.islink(out) else ""
        raise SalvageRefused(f"{out}: already exists{link}; salvage writes a new folder")


def _fill(tensors: List[TensorBytes], older: List[TensorBytes], older_unit: str, older_step) -> Dict[str, int]:
    """Replace each tensor not intact by the same tensor of ``older`` when it is intact there with the same dtype
    and shape, marked ``filled`` with its source; returns ``{"filled", "absent", "not_intact", "different"}``:
    how many were filled, and why the others were not (no such tensor there, not proven intact there, another
    dtype or shape).  "The same tensor": the same path (its components) in the same file, else the same path in
    one file, else the same joined name where that name is one tensor's in both units (``{"a.b": t}`` and
    ``{"a": {"b": t}}`` join alike and are never taken for each other)."""
    by_path = {(t.file, t.parts or (t.name,)): t for t in older}
    bare = Counter(t.parts or (t.name,) for t in older)
    by_bare = {t.parts or (t.name,): t for t in older if bare[t.parts or (t.name,)] == 1}
    names_old, names_new = Counter(t.name for t in older), Counter(t.name for t in tensors)
    by_name = {t.name: t for t in older if names_old[t.name] == 1}
    why = {"filled": 0, "absent": 0, "not_intact": 0, "different": 0}
    for i, t in enumerate(tensors):
        if t.status == INTACT:
            continue
        parts = t.parts or (t.name,)
        o = by_path.get((t.file, parts)) or by_bare.get(parts) or \
            (by_name.get(t.name) if names_new[t.name] == 1 else None)
        if o is None:
            why["absent"] += 1
        elif o.status != INTACT:
            why["not_intact"] += 1
        elif o.dtype != t.dtype or o.shape != t.shape:
            why["different"] += 1
        else:
            filled = TensorBytes(**{**o.__dict__, "file": t.file, "name": t.name, "parts": t.parts, "key": None})
            filled.status, filled.proof = FILLED, f"from {older_unit} (step {older_step}): {o.proof}"
            filled.source = {"unit": older_unit, "step": older_step, "file": o.file, "was": t.status,
                             "why_not_own": t.proof}
            tensors[i] = filled
            why["filled"] += 1
    return why


def _step(unit: Path, files: List[dict]):
    """The unit's step: from its name (``ckpt_000300.pt``), else the one its torch.save dict records (nanoGPT's
    ``iter_num`` in ``ckpt.pt``, Lightning's ``global_step`` in ``last.ckpt``), else None."""
    named = step_from_name(unit.name)
    if named is not None:
        return named
    return next((f["step"] for f in files if f.get("step") is not None), None)


def salvage(unit: str | os.PathLike, out: str | os.PathLike, *, fill_from: Optional[str | os.PathLike] = None,
            run_dir: Optional[str | os.PathLike] = None, include_unproven: bool = False) -> dict:
    """Salvage ``unit`` into the new folder ``out``; returns the report (also written as ``out/salvage.json``).

    ``include_unproven``: also write tensors whose bytes are all there but unchecked (``unproven``; never
    ``suspect`` or ``lost``).  ``run_dir``: the run folder ``out`` must stay out of (default: the unit's
    parent).  Raises :class:`SalvageRefused` before reading anything for a missing unit, an ``out`` inside
    the run folder or the unit, or one that exists; ``OSError`` when a file cannot be read; the publish
    errors of :func:`ckptaudit.publish.publish`; :class:`~.writer.WrittenFileDiffers` when a written file,
    reopened, is not what was written (nothing is published then)."""
    given, dest = Path(unit), Path(out)
    src, run = _check_unit(given, Path(run_dir) if run_dir else None)
    _check_out(src, dest, run, given)
    tensors, files = unit_tensors(src, run)
    step = _step(src, files)
    own = counts(tensors)
    keep_status = (INTACT, FILLED, UNPROVEN) if include_unproven else (INTACT, FILLED)
    filled, fill_step = {"filled": 0}, None
    if fill_from is not None:
        older_unit, older_run = _check_unit(Path(fill_from), Path(run_dir) if run_dir else None)
        older, older_files = unit_tensors(older_unit, older_run)
        fill_step = _step(older_unit, older_files)
        filled = _fill(tensors, older, str(older_unit), fill_step)
    by_file = _plan([t for t in tensors if t.status in keep_status], files)
    report = _report(src, step, tensors, files, own, filled, fill_from, by_file, include_unproven)
    _publish(dest, src, step, fill_step, report, by_file)
    return report


def _plan(chosen: List[TensorBytes], files: List[dict]) -> Dict[str, List[TensorBytes]]:
    """``{source file: the tensors written for it}``, each with its ``key`` (:func:`.keys.assign`); a tensor of
    a dtype no safetensors dtype holds, or whose key is refused, is left out and named in one ``files`` row
    per source file (``kind`` "not written")."""
    from . import keys

    out: Dict[str, List[TensorBytes]] = {}
    for file, ts in keys.by_file(chosen).items():
        why = [(t, f"{t.dtype} is no dtype safetensors holds") for t in ts if t.dtype not in SAFETENSORS_DTYPE]
        ok = [t for t in ts if t.dtype in SAFETENSORS_DTYPE]
        why += keys.assign(ok)
        kept = [t for t in ok if t.key is not None]
        if why:
            shown_ = "; ".join(f"{t.name!r}: {w}" for t, w in why[:5]) + ("; …" if len(why) > 5 else "")
            files.append({"file": file, "kind": "not written", "counts": {},
                          "problem": f"{len(why)} tensor(s) not written: {shown_}"})
        if kept:
            out[file] = kept
    return out


def _publish(dest: Path, src: Path, step, fill_step, report: dict, by_file: Dict[str, List[TensorBytes]]) -> None:
    """Write each output file and ``salvage.json`` into ``dest`` through :func:`ckptaudit.publish.publish`; each
    file is reopened and checked (:func:`.writer.check`: keys, dtypes, shapes, offsets) and every written byte
    re-read against the chunk digests of what was written (``verify=True``) before the folder is published."""
    from ..publish import publish
    from . import writer

    dest.parent.mkdir(parents=True, exist_ok=True)
    with publish(dest.parent, step or 0, name=dest.name, folder=True, rank=0, world_size=1, verify=True,
                 update_latest=False, config={"salvaged_from": str(src)}) as pub:
        for file, ts in by_file.items():
            meta = {"ckptaudit": SCHEMA, "source_unit": _text(src), "source_file": _text(file),
                    "source_step": str(step)}
            if any(t.status == FILLED for t in ts):
                meta.update(filled_from=_text(report["fill_from"]), filled_from_step=str(fill_step),
                            filled=str(sum(t.status == FILLED for t in ts)))
            name = report["outputs"][file]
            with pub.open(name) as w:
                placed = writer.write(w, ts, meta)
            writer.check(pub.tmp_path / name, ts, placed)
        with pub.open(REPORT_NAME) as w:
            w.write(json.dumps(report, indent=1).encode())


def _text(x) -> str:
    """``x`` as text a safetensors header holds (a path that is not UTF-8 keeps its bytes as ``\\x..``)."""
    return str(x).encode("utf-8", "backslashreplace").decode("utf-8")


def _outputs(files: List[str]) -> Dict[str, str]:
    """``{source file: output name}``: ``<file>.safetensors`` (a ``.safetensors`` source keeps its name), made
    unique (``<file>.2.safetensors``) where two sources would share one, and never ``salvage.json``."""
    out: Dict[str, str] = {}
    taken = {REPORT_NAME}
    for f in files:
        name = f if f.endswith(".safetensors") else f"{f}.safetensors"
        stem, n = name[: -len(".safetensors")], 2
        while name in taken:
            name, n = f"{stem}.{n}.safetensors", n + 1
        taken.add(name)
        out[f] = name
    return out


def _report(src: Path, step, tensors, files, own, filled, fill_from, by_file, include_unproven) -> dict:
    from ..salvage_option import shares

    total = sum(t.nbytes for t in tensors)
    written = sum(t.nbytes for ts in by_file.values() for t in ts)
    intact_own = sum(t.nbytes for t in tensors if t.status == INTACT and not t.source)
    return {
        "schema": SCHEMA, "unit": str(src), "step": step,
        "fill_from": str(Path(fill_from).resolve()) if fill_from else None,
        "include_unproven": include_unproven,
        "counts": own, "filled": filled["filled"], "not_filled": {k: v for k, v in filled.items() if k != "filled"},
        "written": sum(len(v) for v in by_file.values()),
        "bytes": {"named": total, "written": written, "intact_own": intact_own},
        "intact_share": round(intact_own / total, 6) if total else 0.0,
        "shares": shares([t for t in tensors if not t.source]),
        "files": files,
        "outputs": _outputs(list(by_file)),
        "keys": {"joined": "the tensor's path joined with '.'", "escaped": "where joined paths collide: in each "
                 "component '%' is '%25' and '.' is '%2E' (path lists the components)"},
        "usable_for": "warm start",
        "tensors": [t.row() for t in tensors],
        "statuses": {INTACT: "its bytes and the bytes that name it (name, dtype, shape, offsets) checked by "
                             "records made at save time (proven_by)",
                     LOST: "bytes missing or changed, or what names it changed",
                     UNPROVEN: "bytes present, nothing checks them or what names them",
                     SUSPECT: "unchecked and holds an all-zero page",
                     FILLED: "not intact here; the intact tensor of the same name, dtype and shape from --fill-from"},
    }
