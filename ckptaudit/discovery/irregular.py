"""Paths the audit never opens, and why: FIFOs, devices, sockets, links out of the run, unreadable files, names
that are not UTF-8, and paths too long to open by name (PATH_MAX).

:func:`irregular_reason` judges one path.  The kernel refuses a path of PATH_MAX bytes or more
(``ENAMETOOLONG``, 4096 on Linux) whatever the file system holds, so no stage of the audit, and no training
job, can open such a file by its name.  The inventory (:func:`ckptaudit.discovery._walk`) measures each
entry's path before it looks at it and hands one too long to :func:`deep_units`: folders below it are
listed with ``openat``/``fdopendir`` (``os.open(name, dir_fd=…)``, ``os.scandir(fd)``), one descriptor per
level and no path ever formed, so a checkpoint 200 folders deep is found and reported as a unit of layout
``irregular`` (never read; its finding is ``path_too_long``), and the rest of the run is audited as usual.
"""

from __future__ import annotations

import errno
import os
import stat as st_mod
from pathlib import Path
from typing import List, Optional

from .. import confine, fs, layouts
from ..layouts.leftovers import mode_reason, too_long
from ..units import MANIFEST_NAMES, SIDECAR_SUFFIXES, Unit, in_progress_reason, names_a_save, step_from_name

__all__ = ["irregular_reason", "path_limit", "path_bytes", "deep_units", "DEEP_LEVELS"]

#: Folders below a path already too long to open that :func:`deep_units` still lists (each level holds one
#: directory descriptor open while it is listed); deeper, the folder itself is reported.
DEEP_LEVELS = 256


def irregular_reason(root: Path, path: Path, lst: Optional[os.stat_result] = None) -> Optional[str]:
    """Why ``path`` must not be opened as a checkpoint file, or None.

    FIFOs block an ``open``, devices (``/dev/zero``) never end, sockets cannot
    be read; a symbolic link is judged by what it resolves to, and one that
    leaves the run folder is refused (an audit reads what the run holds, not
    ``/etc/passwd``).  A name that is not UTF-8 cannot be written to the tables; a path of
    :func:`path_limit` bytes or more cannot be opened by name.  ``lst``: the path's ``lstat`` when the
    caller has it (a directory entry's), so it is not taken twice.
    """
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    if lst is None:
        try:
            lst = os.lstat(path)
        except OSError as e:
            if e.errno == errno.ENAMETOOLONG:
                return too_long(path_bytes(os.path.abspath(path)), path_limit())
            return f"it cannot be examined ({e.strerror})"
    mode = lst.st_mode
    if st_mod.S_ISLNK(mode):
        why, mode = _link_target(root, path)
        if mode is None:
            return why
    return mode_reason(path, mode)


def _link_target(root: Path, path: Path) -> tuple:
    """``(why, mode)`` of the symbolic link ``path``: why it is refused (it leaves the run folder) with mode
    None, ``(None, None)`` when it dangles (judged as a pointer), else ``(None, its target's mode)``."""
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    if os.path.commonpath([real, base]) != base:
        return f"{confine.OUTSIDE_WORDS} ({real})", None
    try:
        return None, os.stat(path).st_mode
    except OSError:
        return None, None  # dangling: judged as a pointer


def irregular_unit(root: Path, path: Path, why: str) -> Unit:
    """A unit at ``path`` of the run rooted at ``root`` that is never opened, for ``why``."""
    rel = fs.relpath(path, root).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return Unit(unit=rel, layout="irregular", kind="file", files=[], size_bytes=0, mtime_ns=0,
                step_from_name=step_from_name(path.name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")),
                irregular={rel: why})


def path_limit() -> int:
    """PATH_MAX of this system in bytes, the terminating NUL included (4096 on Linux): a path of this many
    bytes or more cannot be opened by name (``ENAMETOOLONG``), whatever the file system allows below it."""
    try:
        return int(os.pathconf("/", "PC_PATH_MAX"))
    except (OSError, ValueError, AttributeError):
        return 4096


def path_bytes(p: str) -> int:
    """Bytes of path ``p`` as the kernel sees it."""
    return len(os.fsencode(p))


def deep_units(root: Path, d: Path, e: os.DirEntry, rel: str, limit: int, stray: List[str]) -> List[Unit]:
    """The units of entry ``e`` of local folder ``d`` (``rel`` in the run rooted at ``root``), whose absolute
    path is ``limit`` bytes or longer, or a folder in which paths reach it; what is not a checkpoint goes to
    ``stray``.

    A checkpoint-named file is one unit.  A folder is listed through descriptors: it is one unit when its
    name marks a save (:func:`~ckptaudit.units.names_a_save`: ``checkpoint-500``, ``global_step300``,
    ``step-6``; or an in-progress name) and it holds a checkpoint, or when a layout claims it by its names
    alone (a DCP ``.metadata``);
    elsewhere each checkpoint below it is.  Every unit is ``irregular`` with a :func:`too_long` reason."""
    root_bytes = path_bytes(os.path.abspath(root)) + 1

    def why(unit_rel: str) -> str:  # the unit's own length: it may be under the limit, its files over it
        return too_long(root_bytes + path_bytes(unit_rel), limit)

    try:
        is_dir = e.is_dir(follow_symlinks=False)
    except OSError:
        is_dir = False
    if not is_dir:
        if layouts.is_checkpoint_file(e.name) and not e.is_symlink():
            return [_unit(rel, e.name, why(rel))]
        stray.append(rel)
        return []
    try:
        parent = os.open(os.path.abspath(d), os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        return [_unit(rel, e.name, f"{why(rel)}; its folder cannot be opened ({err.strerror})")]
    try:
        return _folder(parent, e.name, rel, why, stray, 0)
    finally:
        os.close(parent)


def _folder(parent_fd: int, name: str, rel: str, why, stray: List[str], depth: int) -> List[Unit]:
    """Units in folder ``name`` of the folder open as ``parent_fd`` (``rel`` in the run); ``why(rel)``: the
    reason a unit at ``rel`` is never read."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as err:
        return [_unit(rel, name, f"{why(rel)}; it cannot be listed ({err.strerror})")]
    try:
        if depth >= DEEP_LEVELS:
            return [_unit(rel, name, f"{why(rel)}; not listed more than {DEEP_LEVELS} folders further down")]
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda x: x.name)
        names = [x.name for x in entries]
        claimed = layouts.claims_names(names)
        found: List[Unit] = []
        for x in entries:
            xrel = f"{rel}/{x.name}"
            try:
                sub = x.is_dir(follow_symlinks=False)
            except OSError:
                sub = False
            if sub:
                found.extend(_folder(fd, x.name, xrel, why, stray, depth + 1))
            elif layouts.is_checkpoint_file(x.name) and not x.is_symlink():
                found.append(_unit(xrel, x.name, why(xrel)))
            elif not (x.name.endswith(SIDECAR_SUFFIXES) or x.name in MANIFEST_NAMES or claimed):
                stray.append(xrel)
        named = names_a_save(name) or in_progress_reason(name) is not None
        if claimed or (named and found):
            return [_unit(rel, name, why(rel))]
        return found
    finally:
        os.close(fd)


def _unit(rel: str, name: str, why: str) -> Unit:
    """A unit at ``rel`` (last component ``name``) that is never opened: its finding comes from ``irregular``."""
    return Unit(unit=rel, layout="irregular", kind="file", files=[], size_bytes=0, mtime_ns=0,
                step_from_name=step_from_name(name), irregular={rel: why})
