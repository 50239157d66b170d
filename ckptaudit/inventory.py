"""Inventory: find every checkpoint unit, pointer and leftover of a run.

A *unit* is what a training job would resume from: one file
(``ckpt_000500.pt``, ``last.ckpt``, ``model.safetensors``), a folder
(``checkpoint-500/``, ``global_step300/``, ``iter_0000300/``, a
torch.distributed.checkpoint folder), or an index with the shards it names
(``model.safetensors.index.json``).  Inventory reads names, sizes, mtimes and
at most the first 64 bytes of a file; it never opens a checkpoint further.

Layouts are recognised by :mod:`ckptaudit.layouts` (one adapter per layout).
The result is plain data (lists of dicts) so that the Snakefile can read it
without pandas; :func:`write_tables` writes the Parquet tables.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

from . import fs, layouts
from .layouts.leftovers import UNREADABLE  # the reason a file_unreadable finding is made of
from ._io import atomic_write
from .parts import SMALL_PART_BYTES, assign_parts, auto_units_per_job, listing_fingerprint  # noqa: F401 - re-exported
from .units import (  # noqa: F401 - re-exported: the unit model lives in units.py
    IN_PROGRESS_PATTERNS,
    Pointer,
    Unit,
    in_progress_reason,
    step_from_name,
)

POINTER_NAMES = {
    "latest": "DeepSpeed tag pointer",
    "latest_universal": "DeepSpeed universal-checkpoint pointer",
    "latest_checkpointed_iteration.txt": "Megatron tracker file",
    "last.ckpt": "Lightning last checkpoint",
    "LATEST": "pointer file",
}

SIDECAR_SUFFIXES = (".sha256", ".sha256sum")
MANIFEST_NAMES = ("manifest.json", "ckptaudit.manifest.json")

def _stat(p: Path):
    try:
        return p.stat()
    except OSError:
        return None


def discover(run_dir: str | os.PathLike) -> tuple[List[Unit], List[Pointer], List[str]]:
    """Walk ``run_dir`` and return (units, pointers, stray_files).

    Units are sorted by (step, name).  Raises ``NotADirectoryError`` /
    ``FileNotFoundError`` when ``run_dir`` is not a readable folder (an
    infrastructure failure, not a finding).
    """
    root = fs.path(run_dir)
    if fs.is_remote(root):
        fs.refresh(root)  # one LIST of every object under the prefix; later looks use it
    if not root.exists():
        raise FileNotFoundError(f"{root}: run folder does not exist")
    if not root.is_dir():
        raise NotADirectoryError(f"{root}: not a folder")
    units: List[Unit] = []
    pointers: List[Pointer] = []
    stray: List[str] = []
    _walk(root, root, units, pointers, stray)
    names = {u.unit for u in units}
    for p in pointers:
        p.resolved = _resolve_pointer(root, p, names)
    units.sort(key=lambda u: (u.step_from_name if u.step_from_name is not None else -1, u.unit))
    return units, pointers, stray


def _rel(root: Path, p: Path) -> str:
    return fs.relpath(p, root)


def _walk(root: Path, d: Path, units, pointers, stray):
    try:
        entries = sorted(fs.scandir(d), key=lambda e: e.name)
    except OSError as e:
        raise PermissionError(f"{d}: cannot list folder ({e.strerror})") from e
    names = [e.name for e in entries]
    claimed: set = set()
    # 1. index files claim their shards (the folder stays a plain folder)
    for adapter in layouts.INDEX_ADAPTERS:
        for u in adapter.claim_index(root, d, names):
            units.append(u)
            claimed.update(Path(f).name for f in u.files if Path(f).parent == Path(_rel(root, d)) or _rel(root, d) == ".")
    local = not fs.is_remote(root)
    for e in entries:
        path = fs.path(e.path)
        rel = _rel(root, path)
        if e.name in claimed:
            continue
        why = irregular_reason(root, path) if local else None
        if why and not e.is_symlink():
            if layouts.is_checkpoint_file(e.name) or "UTF-8" in why:
                units.append(_irregular_unit(root, path, why))
            else:
                stray.append(rel)
            continue
        if e.is_symlink():
            target = os.readlink(path)
            kind = POINTER_NAMES.get(e.name, "symbolic link")
            if why:
                kind = f"symbolic link, refused: {why}"
            pointers.append(Pointer(rel, kind, target, "", path.exists(), True))
            continue
        if e.name in POINTER_NAMES and e.is_file():
            try:
                target = fs.read_bounded(path, 4096).decode("utf-8", errors="replace").strip()
            except OSError:
                target = ""
            if e.name == "last.ckpt":
                # a pointer is a symbolic link or a small text file naming a unit; Lightning's save_last=True
                # writes last.ckpt as a second full save (model_checkpoint.py _save_last_checkpoint): a unit,
                # judged by its bytes; what ckpt_path="last" would do with it is ckptaudit.resume_entry's
                units.append(_file_unit(root, path, names))
            else:
                pointers.append(Pointer(rel, POINTER_NAMES[e.name], target, "", True, False))
            continue
        if e.is_dir():
            why = in_progress_reason(e.name)
            adapter = layouts.claim_dir(path)
            if adapter is not None or why:
                units.append(_dir_unit(root, path, adapter, why))
            elif layouts.is_checkpoint_file(e.name):
                units.append(_irregular_unit(root, path, "a folder where a checkpoint file of that name is expected"))
            else:
                _walk(root, path, units, pointers, stray)
            continue
        if e.name.endswith(SIDECAR_SUFFIXES) or e.name in MANIFEST_NAMES or e.name.endswith(".manifest.json"):
            continue
        if layouts.is_checkpoint_file(e.name):
            units.append(_file_unit(root, path, names))
        else:
            stray.append(rel)


def irregular_reason(root: Path, path: Path) -> Optional[str]:
    """Why ``path`` must not be opened as a checkpoint file, or None.

    FIFOs block an ``open``, devices (``/dev/zero``) never end, sockets cannot
    be read; a symbolic link is judged by what it resolves to, and one that
    leaves the run folder is refused (an audit reads what the run holds, not
    ``/etc/passwd``).  A name that is not UTF-8 cannot be written to the tables.
    """
    import stat as st_mod

    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    try:
        lst = os.lstat(path)
    except OSError as e:
        return f"it cannot be examined ({e.strerror})"
    mode = lst.st_mode
    if st_mod.S_ISLNK(mode):
        real = os.path.realpath(path)
        base = os.path.realpath(root)
        if os.path.commonpath([real, base]) != base:
            return f"it points outside the run folder ({real})"
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return None  # dangling: judged as a pointer
    if st_mod.S_ISFIFO(mode):
        return "it is a FIFO (named pipe): opening it would block"
    if st_mod.S_ISCHR(mode) or st_mod.S_ISBLK(mode):
        return "it is a device, not a file"
    if st_mod.S_ISSOCK(mode):
        return "it is a socket, not a file"
    if st_mod.S_ISREG(mode) and not os.access(path, os.R_OK):
        return UNREADABLE
    return None


def _irregular_unit(root: Path, path: Path, why: str) -> Unit:
    rel = _rel(root, path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return Unit(unit=rel, layout="irregular", kind="file", files=[], size_bytes=0, mtime_ns=0,
                step_from_name=step_from_name(path.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")),
                irregular={rel: why})


def _sidecars_for(path: Path, names) -> List[str]:
    return [path.name + s for s in SIDECAR_SUFFIXES if path.name + s in names]


def _file_unit(root: Path, path: Path, names) -> Unit:
    st = _stat(path)
    rel = _rel(root, path)
    parent = _rel(root, path.parent)
    pre = "" if parent == "." else parent + "/"
    manifest = next((n for n in (path.name + ".manifest.json",) if n in names), "")
    return Unit(
        unit=rel,
        layout=layouts.file_layout(path),
        kind="file",
        files=[rel],
        size_bytes=st.st_size if st else 0,
        mtime_ns=st.st_mtime_ns if st else 0,
        step_from_name=step_from_name(path.name),
        in_progress=in_progress_reason(path.name) or "",
        sidecars=[pre + s for s in _sidecars_for(path, names)],
        manifest=(pre + manifest) if manifest else "",
    )


def _dir_unit(root: Path, path: Path, adapter, why) -> Unit:
    files: List[str] = []
    sidecars: List[str] = []
    manifest = ""
    size = 0
    mtime = 0
    # ckptaudit.publish protocol (see ckptaudit/publish/): a top-level ``COMPLETE`` marker is not
    # a data file, and a ckptaudit manifest.json without it means the publish (or seal) never
    # finished, so the folder is in progress.  The manifest is recognised from its first 64 bytes.
    has_marker = False
    our_manifest = False
    irregular: Dict[str, str] = {}

    def unlistable(e: OSError) -> None:  # a folder of the unit that cannot be listed (mode 000, another owner)
        where = _rel(root, Path(e.filename)) if e.filename else _rel(root, path)
        irregular[where.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")] = (
            UNREADABLE if isinstance(e, PermissionError) else f"it cannot be listed ({e.strerror})")

    for dirpath, dirnames, filenames in fs.walk(path, onerror=unlistable):
        dirnames.sort()
        fn_set = set(filenames)
        at_top = fs.path(dirpath) == path
        for fn in sorted(filenames):
            fp = fs.path(dirpath) / fn
            bad = irregular_reason(root, fp) if not fs.is_remote(root) else None
            if bad:
                irregular[_rel(root, fp).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")] = bad
                continue
            rel = _rel(root, fp)
            if at_top and fn == "COMPLETE":
                has_marker = True
                continue
            if fn.endswith(SIDECAR_SUFFIXES):
                sidecars.append(rel)
                continue
            if fn in MANIFEST_NAMES:
                manifest = rel
                if at_top and fn == "manifest.json":
                    try:
                        with fs.open_binary(fp) as fh:
                            our_manifest = b'"ckptaudit.manifest/' in fh.read(64)
                    except OSError:
                        our_manifest = False
                continue
            st = _stat(fp)
            if st is None:
                continue
            files.append(rel)
            size += st.st_size
            mtime = max(mtime, st.st_mtime_ns)
        del fn_set
    if our_manifest and not has_marker and not why:
        why = "manifest.json written but no COMPLETE marker: a ckptaudit publish or seal that did not finish"
    layout = adapter.name if adapter else "in-progress"
    return Unit(
        unit=_rel(root, path),
        layout=layout,
        kind="folder",
        files=files,
        size_bytes=size,
        mtime_ns=mtime,
        step_from_name=step_from_name(path.name),
        in_progress=why or "",
        sidecars=sidecars,
        manifest=manifest,
        irregular=irregular,
    )


def _resolve_pointer(root: Path, p: Pointer, unit_names: set) -> str:
    base = Path(p.path).parent
    t = p.target.strip()
    if not t:
        return ""
    cands = [t]
    if p.kind == "Megatron tracker file":
        if t == "release":
            cands = ["release"]
        elif t.isdigit():
            cands = [f"iter_{int(t):07d}"]
    for c in cands:
        rel = os.path.normpath(str(base / c)).replace(os.sep, "/")
        if rel in unit_names:
            return rel
        if (root / rel).exists():
            return rel
    return ""


SMALL_OBJECT_BYTES = 1024  # a checkpoint-named object of 1 to 1023 bytes is suspicious (0 is empty_file)


def _object_store(run_dir, units: List[Unit]) -> Dict[str, dict]:
    """Object-storage facts per unit of an ``s3://`` run: ``objects`` {file: [size bytes, ETag]}
    (the part signature, so a replaced object re-runs its part), ``multipart_uploads`` that never
    completed under the unit's keys, ``small_objects`` {file: size bytes}.

    An unfinished upload whose key belongs to no unit becomes a unit of its own (layout
    ``in-progress``, no files): a save that never completed.  ``units`` is changed in place.
    """
    root = fs.path(run_dir)
    out: Dict[str, dict] = {}
    for u in units:
        d = out.setdefault(u.unit, {"objects": {}, "multipart_uploads": [], "small_objects": {}})
        for f in u.files + u.sidecars + ([u.manifest] if u.manifest else []):
            try:
                info = (root / f).info()
            except OSError:
                continue
            d["objects"][f] = [info["size"], info["etag"]]
            if f in u.files and 0 < info["size"] < SMALL_OBJECT_BYTES and layouts.is_checkpoint_file(Path(f).name):
                d["small_objects"][f] = info["size"]
    for m in fs.multipart_uploads(run_dir):
        key = m["key"]
        owner = next((u for u in units if key in u.files or key == u.unit or key.startswith(u.unit.rstrip("/") + "/")
                      or u.unit == "."), None)
        if owner is None:
            owner = Unit(unit=key, layout="in-progress", kind="file", files=[], size_bytes=0, mtime_ns=0,
                         step_from_name=step_from_name(Path(key).name),
                         in_progress="multipart upload started but never completed (no object exists)")
            units.append(owner)
            out[key] = {"objects": {}, "multipart_uploads": [], "small_objects": {}}
        out[owner.unit]["multipart_uploads"].append(m)
    units.sort(key=lambda u: (u.step_from_name if u.step_from_name is not None else -1, u.unit))
    return {k: v for k, v in out.items() if v["objects"] or v["multipart_uploads"]}


def run_inventory(run_dir: str, units_per_job="auto", part_bytes: Optional[int] = SMALL_PART_BYTES) -> Dict:
    """Discover units and pointers; return the plain-data inventory document (parts by
    :func:`assign_parts`: ``part_bytes`` None on one machine, packing by count only)."""
    from . import liveness

    units, pointers, stray = discover(run_dir)
    object_store = _object_store(run_dir, units) if fs.is_remote(run_dir) else {}
    for u in units:
        u.snapshot = liveness.snapshot(run_dir, u.files)
    parts = assign_parts(units, units_per_job, part_bytes)
    return {
        "object_store": object_store,
        "run_dir": str(run_dir),
        "units": [u.to_dict() for u in units],
        "pointers": [asdict(p) for p in pointers],
        "stray_files": stray,
        "parts": parts,
    }


def write_inventory(doc: Dict, parquet_path: str, json_path: str) -> None:
    """Write ``inventory.parquet`` (one row per unit) and the JSON the Snakefile reads."""
    from . import tables

    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    tables.write("inventory", [{k: v for k, v in u.items() if k not in ("snapshot", "irregular")}
                               for u in doc["units"]], parquet_path)
    atomic_write(json_path, json.dumps(doc, indent=1, sort_keys=True).encode())
