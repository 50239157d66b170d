"""What a unit holds besides checkpoint data: the one builder each of unit_in_progress, not_a_regular_file, file_unreadable, path_too_long.

The inventory names irregular files (:func:`ckptaudit.discovery.irregular_reason`) and in-progress saves
(``in_progress``); the adapters find temporary leftovers (DCP's ``.metadata.tmp``, an HF write-then-rename
temp file, a ``tmp-checkpoint-*`` folder) and a folder under a shard's name.  They decide; these build.
"""

from __future__ import annotations

import os
import stat as st_mod
from typing import Optional

from .. import confine
from .. import findings as F
from ..findings import Finding

#: :func:`ckptaudit.discovery.irregular_reason` of a regular file this process may not read (mode 000,
#: another owner): :func:`irregular` makes it ``file_unreadable``; any other reason is ``not_a_regular_file``.
UNREADABLE = "permission denied"
#: What :func:`ckptaudit.discovery._irregular_entry` puts in the kind of a pointer that is not a regular file (a FIFO or a
#: device named ``latest``), before the reason; :func:`ckptaudit.pointer_judgements.judge` makes
#: :func:`irregular` of it.
POINTER_NOT_READ = ", not read: "
#: Words in :func:`too_long`'s reason that :func:`irregular` makes ``path_too_long`` of.
_TOO_LONG = "bytes or more cannot be opened by name"


def too_long(path_bytes: int, limit: int) -> str:
    """The reason a path of ``path_bytes`` bytes is never read: this system's PATH_MAX is ``limit`` bytes (a
    folder under the limit is never read either when the paths of the files in it reach it)."""
    where = "over" if path_bytes >= limit else "and the paths of the files in it reach"
    return f"its path is {path_bytes:,} bytes, {where} this system's limit (PATH_MAX: a path of {limit:,} {_TOO_LONG})"


def mode_reason(path, mode: int) -> Optional[str]:
    """Why a file of ``mode`` (its ``stat`` mode: links followed) at ``path`` cannot be read as a checkpoint (a
    FIFO blocks an ``open``, a device never ends, a socket cannot be read, a regular file this process may not
    read), or None.  Judged from the mode and ``access`` alone: nothing is opened."""
    if st_mod.S_ISFIFO(mode):
        return "it is a FIFO (named pipe): opening it would block"
    if st_mod.S_ISCHR(mode) or st_mod.S_ISBLK(mode):
        return "it is a device, not a file"
    if st_mod.S_ISSOCK(mode):
        return "it is a socket, not a file"
    if st_mod.S_ISREG(mode) and not os.access(path, os.R_OK):
        return UNREADABLE
    return None


def in_progress(path: str, why: str) -> Finding:
    """``unit_in_progress``: ``path`` is a save that never finished (``why``: what was left over)."""
    return F.make("unit_in_progress", path=path, why=why)


def irregular(path: str, why: str) -> Finding:
    """The finding for a file the audit does not open: ``file_unreadable`` when ``why`` is :data:`UNREADABLE`,
    else ``not_a_regular_file`` (a FIFO, a device, a link out of the run, a folder under a file's name...)."""
    if why == UNREADABLE:
        return F.make("file_unreadable", path=path, why=why)
    if _TOO_LONG in why:
        return F.make("path_too_long", path=path, why=why, shown=_shorten(path))
    if why.startswith(confine.OUTSIDE_WORDS):  # a symbolic link out of the run: "… folder (<real path>)"
        return confine.path_outside_run(path, path, why[len(confine.OUTSIDE_WORDS):].strip(" ()"),
                                        "it is a symbolic link, and a resume that loads it reads that file")
    return F.make("not_a_regular_file", path=path, why=why)


def _shorten(path: str, keep: int = 60) -> str:
    """``path`` for a sentence: a path of thousands of bytes keeps its first and last ``keep`` characters."""
    return path if len(path) <= 2 * keep + 20 else f"{path[:keep]}…({len(path) - 2 * keep:,} characters)…{path[-keep:]}"
