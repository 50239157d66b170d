"""Discovery: find every checkpoint unit, pointer and leftover of a run (the inventory stage's walk).

A *unit* is what a training job would resume from: one file
(``ckpt_000500.pt``, ``last.ckpt``, ``model.safetensors``), a folder
(``checkpoint-500/``, ``global_step300/``, ``iter_0000300/``, a
torch.distributed.checkpoint folder), or an index with the shards it names
(``model.safetensors.index.json``).  Inventory reads names, sizes, mtimes and
at most the first 64 bytes of a file; it never opens a checkpoint further.

Layouts are recognised by :mod:`ckptaudit.layouts` (one adapter per layout).
The result is plain data (lists of dicts) so that the Snakefile can read it
without pandas; :func:`ckptaudit.stages.inventory.write_inventory` writes the Parquet table; the inventory stage
(:mod:`ckptaudit.stages.inventory`) groups the units into parts.
"""

from __future__ import annotations

import errno
import os
import stat as st_mod
from pathlib import Path
from typing import Dict, List, Optional

from .. import confine, fs, layouts, producers
# reasons that file_unreadable, path_too_long and a pointer that is not read are made of
from ..layouts.leftovers import POINTER_NOT_READ
from .._io import SUPERSEDED_DIR, dead_writer
from .object_store import SMALL_OBJECT_BYTES, unit_objects  # noqa: F401 - re-exported
from .folders import folder_unit, lstat_of as _lstat_of, stat_or_none
from .irregular import irregular_unit, deep_units, irregular_reason, path_bytes, path_limit  # noqa: F401
from ..units import (
    IN_PROGRESS_PATTERNS,
    MANIFEST_NAMES,
    SIDECAR_SUFFIXES,
    Pointer,
    Unit,
    in_progress_reason,
    step_from_name,
)

#: Pointer files by base name -> what each is: the producers' own (:data:`ckptaudit.producers.POINTER_FILES`)
#: and a generic ``LATEST``.
POINTER_NAMES = {**{n: f.kind for n, f in producers.POINTER_FILES.items()}, "LATEST": "pointer file"}


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
    _unfinished_markers(units, stray)
    _incomplete_saves(units)
    names = {u.unit for u in units}
    for p in pointers:
        p.resolved = _resolve_pointer(root, p, names)
    units.sort(key=lambda u: (u.step_from_name if u.step_from_name is not None else -1, u.unit))
    return units, pointers, stray


def given_unit(run_dir: str | os.PathLike) -> Optional[tuple]:
    """``(its folder, [unit], [], [])`` when the local path ``run_dir`` is itself one unit — a checkpoint file, or a
    folder a layout claims (the HF Trainer's ``checkpoint-40/``, a DCP folder, a DeepSpeed tag) — else None.

    A user who points the audit (or :func:`ckptaudit.safe_load_checkpoint`, or an integration's ``last_good``) at
    one checkpoint means that checkpoint: walking inside it would judge its ``optimizer.pt`` and
    ``rng_state.pth`` as units of their own ("no model weights").  The unit is named as in its folder's audit
    (``checkpoint-40``), with its sidecars and its producer's markers beside it taken into account; the folder's
    other units and pointers are not looked at."""
    if fs.is_remote(run_dir):
        return None
    path = Path(os.path.abspath(run_dir))
    parent = path.parent
    if path == parent:
        return None
    if path.is_file():
        if not layouts.is_checkpoint_file(path.name):
            return None
        try:
            names = set(os.listdir(parent))
        except OSError:
            names = {path.name}
        unit = _file_unit(parent, path, names, stat_or_none(path), path.name)
    elif path.is_dir():
        adapter, why = layouts.claim_dir(path), in_progress_reason(path.name)
        if adapter is None and not why:
            return None
        unit = folder_unit(parent, path, adapter, why)
    else:
        return None
    try:  # a producer's marker beside it (training_hub's .incomplete-checkpoint-<step>)
        beside = sorted(n for n in os.listdir(parent) if n != path.name and (parent / n).is_file())
    except OSError:
        beside = []
    _unfinished_markers([unit], beside)
    return str(parent), [unit], [], []


def _unfinished_markers(units: List[Unit], stray: List[str]) -> None:
    """A unit with its producer's unfinished marker beside it (NeMo's empty ``<name>-unfinished`` file, also for
    the ``-EMA`` copy and a checkpoint folder) or inside its checkpoint folder (NeMo Automodel's ``.incomplete``:
    :func:`ckptaudit.producers.unfinished_marker`) is a save or deletion in progress, never a rollback point; the
    marker is then no stray.  A marker beside no unit stays a stray: a file that is no checkpoint (the producer
    deletes those too)."""
    present = set(stray).union(*(u.files for u in units))
    taken = set()
    for u in units:
        hit = producers.unfinished_marker(u.unit, present)
        if hit is None:
            continue
        taken.add(hit[0])
        if not u.in_progress:
            u.in_progress = hit[1]
    if taken:
        stray[:] = [s for s in stray if s not in taken]


def _incomplete_saves(units: List[Unit]) -> None:
    """A unit of a save that another of its ranks has not finished (NVRx's per-rank file of an iteration some rank
    holds only as ``.dirty`` or not at all: :func:`ckptaudit.producers.incomplete_saves`) is a save in progress:
    the producer's resume never takes it."""
    why = producers.incomplete_saves([u.unit for u in units])
    for u in units:
        if u.unit in why and not u.in_progress:
            u.in_progress = why[u.unit]


def _rel(root: Path, p: Path) -> str:
    return fs.relpath(p, root)


def _walk(root: Path, d: Path, units, pointers, stray):
    """Units, pointers and strays of folder ``d``, then of the plain folders below it.

    Linear in the entries: each is looked at once (names in a set, its ``lstat`` taken once and kept for its
    unit's size, mtime and snapshot).  An entry whose path is :func:`path_limit` bytes or longer cannot be
    opened by name by any later stage: :func:`ckptaudit.long_paths.deep_units` lists it through directory
    descriptors and makes what it holds units that are never read."""
    try:
        entries = sorted(fs.scandir(d), key=lambda e: e.name)
    except OSError as e:
        raise PermissionError(f"{d}: cannot list folder ({e.strerror})") from e
    names = [e.name for e in entries]
    name_set = set(names)
    drel = _rel(root, d)
    claimed: set = set()
    local = not fs.is_remote(root)
    # why each entry must never be opened (a FIFO, a device, a link out of the run…), judged once from its lstat
    why_of = {e.name: irregular_reason(root, fs.path(e.path), _lstat_of(e)) for e in entries} if local else {}
    # 1. index files claim their shards (the folder stays a plain folder); an index never opened claims nothing
    readable = [n for n in names if not why_of.get(n)]
    for adapter in layouts.INDEX_ADAPTERS:
        for u in adapter.claim_index(root, d, readable):
            if local:
                _set_aside(root, u, why_of, drel)
            units.append(u)
            # its files and those it never opens (a FIFO shard): neither is a unit of its own
            claimed.update(Path(f).name for f in [*u.files, *u.irregular]
                           if Path(f).parent == Path(drel) or drel == ".")
    limit = path_limit() if local else 0
    dir_bytes = path_bytes(os.path.abspath(d)) + 1 if local else 0  # the folder's path and a "/"
    pre = "" if drel == "." else drel + "/"
    for e in entries:
        if e.name in claimed:
            continue
        if local and dir_bytes + path_bytes(e.name) >= limit:  # no stage could open it by name
            units.extend(deep_units(root, d, e, pre + e.name, limit, stray))
            continue
        _entry(root, d, e, pre, local, name_set, units, pointers, stray, why_of.get(e.name))


def _set_aside(root: Path, u: Unit, why_of: Dict[str, Optional[str]], drel: str) -> None:
    """Move the files of index unit ``u`` that must never be opened (a FIFO or device as a shard: a FIFO blocks
    the hash job's ``open`` forever) from its ``files`` to its ``irregular`` map (``not_a_regular_file``, the
    index's own unit still judged).  ``why_of``: the reasons of the entries of the index's folder ``drel``."""
    keep = []
    for f in u.files:
        here = Path(f).parent == Path(drel)
        why = why_of.get(Path(f).name) if here else irregular_reason(root, root / f)
        if why:
            u.irregular[f] = why
        else:
            keep.append(f)
    u.files = keep


def _entry(root: Path, d: Path, e, pre: str, local: bool, name_set, units, pointers, stray,
           why: Optional[str]) -> None:
    """One entry ``e`` of folder ``d`` (``pre``: the folder's path in the run and a "/"): a unit, a pointer,
    a folder walked, a sidecar or manifest (taken by its unit), or a stray.  ``why``: why it must never be
    opened (:func:`irregular_reason`, local entries), else None."""
    path = fs.path(e.path)
    rel = pre + e.name if local else _rel(root, path)
    lst = _lstat_of(e) if local else None
    if why and not e.is_symlink():
        _irregular_entry(root, e.name, path, rel, why, units, pointers, stray)
    elif e.is_symlink():
        pointers.append(Pointer(rel, f"symbolic link, refused: {why}" if why else
                                POINTER_NAMES.get(e.name, "symbolic link"), os.readlink(path), "",
                                path.exists(), True))
    elif e.name in POINTER_NAMES and e.is_file():
        _pointer_file(root, e.name, path, rel if local else None, lst, name_set, units, pointers, rel)
    elif e.name == SUPERSEDED_DIR and e.is_dir():  # units a publish moved aside: never a unit, never walked
        stray.append(rel)
    elif e.is_dir():
        try:
            _folder(root, path, units, pointers, stray)
        except OSError as err:  # a path inside it reaches PATH_MAX: listed through descriptors instead
            if err.errno != errno.ENAMETOOLONG:
                raise
            units.extend(deep_units(root, d, e, rel, path_limit() if local else 0, stray))
    elif local and not layouts.is_checkpoint_file(e.name) and dead_writer(e.name) is not None:
        units.append(_dead_writer_temp(path, rel, lst))
    elif e.name.endswith(SIDECAR_SUFFIXES) or e.name in MANIFEST_NAMES or e.name.endswith(".manifest.json"):
        return
    elif layouts.is_checkpoint_file(e.name):
        units.append(_file_unit(root, path, name_set, lst, rel if local else None))
    else:
        stray.append(rel)


def _dead_writer_temp(path: Path, rel: str, lst) -> Unit:
    """The unit of a ``ckptaudit.publish`` temp that is no checkpoint file (a manifest's, a sidecar's, a pointer's:
    :func:`ckptaudit._io.atomic_write` beside the data temp) whose writer on this host is gone.  A save killed
    inside its manifest write leaves one beside its data temp; as a unit in progress (never read: layout
    ``in-progress``) it is one of :mod:`ckptaudit.dead_writers`' leftovers, listed with the data temp, not
    dropped as a manifest would be."""
    st = lst if lst is not None and st_mod.S_ISREG(lst.st_mode) else stat_or_none(path)
    return Unit(unit=rel, layout="in-progress", kind="file", files=[rel], size_bytes=st.st_size if st else 0,
                mtime_ns=st.st_mtime_ns if st else 0, step_from_name=None, in_progress=in_progress_reason(path.name),
                snapshot={rel: [st.st_size, st.st_mtime_ns, st.st_ino]} if st else {})


def _irregular_entry(root: Path, name: str, path: Path, rel: str, why: str, units, pointers, stray) -> None:
    """An entry that is no regular file or folder one may read (:func:`irregular_reason` says ``why``): a unit
    never read when a checkpoint's or an index's name (or a name that is not UTF-8), a pointer never read when a
    pointer's name, else a stray."""
    if layouts.is_checkpoint_file(name) or layouts.is_index_file(name) or "UTF-8" in why:
        units.append(irregular_unit(root, path, why))
    elif name in POINTER_NAMES:  # a FIFO or device named `latest`: a pointer never read
        pointers.append(Pointer(rel, f"{POINTER_NAMES[name]}{POINTER_NOT_READ}{why}", "", "", True, False))
    else:
        stray.append(rel)


def _pointer_file(root: Path, name: str, path: Path, unit_rel: Optional[str], lst, name_set, units, pointers,
                  rel: str) -> None:
    """A regular file with a pointer's name: the pointer and the unit name its text holds; Lightning's
    ``last.ckpt`` is a unit."""
    if name == "last.ckpt":
        # a pointer is a symbolic link or a small text file naming a unit; Lightning's save_last=True
        # writes last.ckpt as a second full save (model_checkpoint.py _save_last_checkpoint): a unit,
        # judged by its bytes; what ckpt_path="last" would do with it is ckptaudit.resume_entry's
        units.append(_file_unit(root, path, name_set, lst, unit_rel))
        return
    try:
        target = fs.read_bounded(path, 4096).decode("utf-8", errors="replace").strip()
    except OSError:
        target = ""
    pointers.append(Pointer(rel, POINTER_NAMES[name], target, "", True, False))


def _folder(root: Path, path: Path, units, pointers, stray) -> None:
    """Folder ``path``: one unit when a layout claims it or its name marks a save in progress, else walked."""
    why = in_progress_reason(path.name)
    adapter = layouts.claim_dir(path)
    if adapter is not None or why:
        units.append(folder_unit(root, path, adapter, why))
    elif layouts.is_checkpoint_file(path.name):
        units.append(irregular_unit(root, path, "a folder where a checkpoint file of that name is expected"))
    else:
        _walk(root, path, units, pointers, stray)


def _sidecars_for(path: Path, names) -> List[str]:
    return [path.name + s for s in SIDECAR_SUFFIXES if path.name + s in names]


def _file_unit(root: Path, path: Path, names, lst: Optional[os.stat_result] = None,
               rel: Optional[str] = None) -> Unit:
    """The unit of checkpoint file ``path``; ``names``: the names in its folder (a set: looked up, never
    searched); ``lst``: its ``lstat`` when the caller took it (then kept as its snapshot); ``rel``: its path
    in the run when the caller knows it."""
    regular = lst is not None and st_mod.S_ISREG(lst.st_mode)
    st = lst if regular else stat_or_none(path)
    rel = rel if rel is not None else _rel(root, path)
    pre = rel[: -len(path.name)]
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
        snapshot={rel: [lst.st_size, lst.st_mtime_ns, lst.st_ino]} if regular else {},
    )


def _resolve_pointer(root: Path, p: Pointer, unit_names: set) -> str:
    """The unit (or path inside the run) pointer ``p`` names, "" when none.  A name that resolves outside the
    run (``../outside/global_step900`` in DeepSpeed's ``latest``; :func:`ckptaudit.confine.resolved_outside`)
    is never looked at: its ``kind`` then says where it points, for ``path_outside_run``."""
    base = Path(p.path).parent
    t = p.target.strip()
    if not t:
        return ""
    pf = producers.pointer_file({"path": p.path, "kind": p.kind})
    cands = [pf.target_unit(t) if pf is not None and pf.target_unit is not None else t]
    for c in cands:
        if not p.is_symlink and (out := confine.resolved_outside(root, c, str(base))):
            p.kind = f"{p.kind}{confine.POINTER_OUTSIDE}{out}"
            return ""
        rel = os.path.normpath(str(base / c)).replace(os.sep, "/")
        if rel in unit_names:
            return rel
        if (root / rel).exists():
            return rel
    return ""
