"""The unit of a checkpoint folder: every file below it, each looked at once.

A folder unit (a layout's folder, :func:`ckptaudit.layouts.claim_dir`, or a save in progress) is its data files
with their total size, newest mtime and ``lstat`` snapshot, its sidecars, manifest and irregular entries, and
whether the ckptaudit.publish protocol calls it finished (ckptaudit/publish/: a top-level ``COMPLETE`` marker).
:mod:`ckptaudit.discovery` finds the folders; this module lists what one holds.
"""

from __future__ import annotations

import errno
import os
import stat as st_mod
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from .. import fs
from .irregular import irregular_reason, path_bytes, path_limit
from ..layouts.leftovers import UNREADABLE, too_long
from ..units import MANIFEST_NAMES, SIDECAR_SUFFIXES, Unit, step_from_name


def _rel(root: Path, p) -> str:
    return fs.relpath(p, root)


def stat_or_none(p: Path):
    """``p.stat()`` (links followed), or None when it cannot be taken."""
    try:
        return p.stat()
    except OSError:
        return None


def folder_unit(root: Path, path: Path, adapter, why) -> Unit:
    """The unit of folder ``path`` (claimed by ``adapter``, or in progress for ``why``): every file below it,
    each looked at once (its ``lstat`` gives the unit's size, mtime and snapshot)."""
    local = not fs.is_remote(root)
    got = _UnitFiles(root, local)

    def unlistable(e: OSError) -> None:  # a folder of the unit that cannot be listed (mode 000, another owner)
        where = _rel(root, Path(e.filename)) if e.filename else _rel(root, path)
        if e.errno == errno.ENAMETOOLONG:
            why_not = too_long(path_bytes(os.path.abspath(e.filename or path)), path_limit())
        else:
            why_not = UNREADABLE if isinstance(e, PermissionError) else f"it cannot be listed ({e.strerror})"
        got.irregular[_printable(where)] = why_not

    top_rel = _rel(root, path)
    for dirpath, entries in _unit_tree(path, unlistable):
        at_top = fs.path(dirpath) == path if not local else dirpath == str(path)
        drel = _rel(root, fs.path(dirpath)) if not local else (
            top_rel if at_top else f"{top_rel}/{os.path.relpath(dirpath, str(path))}".replace(os.sep, "/"))
        pre = "" if drel == "." else drel + "/"
        for fn, lst in entries:
            fp = os.path.join(dirpath, fn) if local else fs.path(dirpath) / fn  # a string: no Path per file
            got.add(pre + fn, fn, fp, lst, at_top)
    if got.our_manifest and not got.has_marker and not why:
        why = "manifest.json written but no COMPLETE marker: a ckptaudit publish or seal that did not finish"
    return Unit(
        unit=top_rel,
        layout=adapter.name if adapter else "in-progress",
        kind="folder",
        files=got.files,
        size_bytes=got.size,
        mtime_ns=got.mtime,
        step_from_name=step_from_name(path.name),
        in_progress=why or "",
        sidecars=got.sidecars,
        manifest=got.manifest,
        irregular=got.irregular,
        snapshot=got.snapshot if local else {},
    )


def _printable(rel: str) -> str:
    """``rel`` with bytes that are not UTF-8 (kept as surrogates) written as ``\\xNN``."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class _UnitFiles:
    """What the files below a folder unit make of it: its data files with their size, newest mtime and
    ``lstat`` snapshot, sidecars, manifest, irregular entries, and the ckptaudit.publish protocol's facts (see
    ckptaudit/publish/): a top-level ``COMPLETE`` marker is not a data file, and a ckptaudit manifest.json
    without it means the publish (or seal) never finished, so the folder is in progress.  The manifest is
    recognised from its first 64 bytes."""

    def __init__(self, root: Path, local: bool):
        self.root, self.local = root, local
        self.files: List[str] = []
        self.sidecars: List[str] = []
        self.snapshot: Dict[str, list] = {}
        self.irregular: Dict[str, str] = {}
        self.manifest = ""
        self.size = self.mtime = 0
        self.has_marker = self.our_manifest = False

    def add(self, rel: str, fn: str, fp, lst: Optional[os.stat_result], at_top: bool) -> None:
        """File ``fn`` at ``fp`` (``rel`` in the run; ``lst`` its lstat when listed locally)."""
        bad = irregular_reason(self.root, fp, lst) if self.local else None
        if bad:
            self.irregular[_printable(rel)] = bad
        elif lst is not None and st_mod.S_ISLNK(lst.st_mode) and os.path.isdir(fp):
            return  # a link to a folder inside the run: not a file of the unit
        elif at_top and fn == "COMPLETE":
            self.has_marker = True
        elif fn.endswith(SIDECAR_SUFFIXES):
            self.sidecars.append(rel)
        elif fn in MANIFEST_NAMES:
            self.manifest = rel
            if at_top and fn == "manifest.json":
                self.our_manifest = _is_our_manifest(fp)
        else:
            self._data(rel, fp, lst)

    def _data(self, rel: str, fp, lst: Optional[os.stat_result]) -> None:
        st = lst if lst is not None and st_mod.S_ISREG(lst.st_mode) else stat_or_none(fs.path(fp))
        if st is None:
            return
        self.files.append(rel)
        self.size += st.st_size
        self.mtime = max(self.mtime, st.st_mtime_ns)
        if lst is not None:
            self.snapshot[rel] = [lst.st_size, lst.st_mtime_ns, lst.st_ino]


def _is_our_manifest(fp) -> bool:
    """Whether the manifest at ``fp`` is ckptaudit.publish's (its first 64 bytes name the format)."""
    try:
        with fs.open_binary(fp) as fh:
            return b'"ckptaudit.manifest/' in fh.read(64)
    except OSError:
        return False


def _unit_tree(path: Path, onerror) -> Iterator[Tuple[object, List[Tuple[str, Optional[os.stat_result]]]]]:
    """(folder, [(file name, its lstat or None)] in name order) for ``path`` and every folder below it, top
    down, folders in name order, as ``os.walk`` walks them (a link to a folder is not followed, a folder that
    cannot be listed goes to ``onerror(OSError)``).  Locally each entry's ``lstat`` is taken once and handed
    on; remotely (from the listing) it is None."""
    if fs.is_remote(path):
        for dirpath, dirnames, filenames in fs.walk(path, onerror=onerror):
            dirnames.sort()
            yield dirpath, [(fn, None) for fn in sorted(filenames)]
        return
    stack = [str(path)]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            onerror(e)
            continue
        files, dirs = [], []
        for e in entries:
            try:
                is_dir = e.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                if not e.is_symlink():
                    dirs.append(e.path)
                else:  # a link to a folder: never walked; judged by irregular_reason (one out of the run)
                    files.append((e.name, lstat_of(e)))
            else:
                files.append((e.name, lstat_of(e)))
        yield top, files
        stack.extend(reversed(dirs))


def lstat_of(e) -> Optional[os.stat_result]:
    """The entry's ``lstat`` (taken once by ``os.DirEntry`` and kept), or None when it is gone."""
    try:
        return e.stat(follow_symlinks=False)
    except OSError:
        return None
