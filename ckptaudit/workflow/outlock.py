"""One audit at a time per output folder: an advisory lock on ``<out>/.ckptaudit.lock``, held by the process
that runs the workflow (``ckptaudit audit``, or ``snakemake … audit``'s main process) for as long as it runs.

Why our own lock and not Snakemake's: Snakemake's lock files (``.snakemake/locks/``) outlive a SIGKILL, so every
later audit into the same folder stopped with "Directory cannot be locked" until someone ran ``--unlock``.
``flock(2)`` locks belong to the open file, so the kernel drops this one when its process ends, however it ends;
with it held the workflow runs with Snakemake's own lock off and ``--rerun-incomplete`` on (an interrupted
audit's half-written outputs are redone, never trusted).  Two audits started at once into one folder: the second
stops at once with one line naming the holder (pid, host, start time) and exit 3.

``flock`` is advisory and local to one kernel on some network file systems (NFS before v4 emulates it with
``fcntl`` byte-range locks, which Linux's NFS client does forward to the server); two hosts auditing into one
shared folder at once are serialised only where the file system forwards locks.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Dict

__all__ = ["LOCK_NAME", "OutputBusy", "hold", "held", "release"]

LOCK_NAME = ".ckptaudit.lock"

_HELD: Dict[str, list] = {}  # resolved lock path -> [open fd, holds], for this process (re-entrant)


class OutputBusy(RuntimeError):
    """Another process holds the output folder's lock; ``str()`` is the one line to print."""


def _path(out_dir: str | os.PathLike) -> str:
    return str(Path(out_dir).resolve() / LOCK_NAME)


def hold(out_dir: str | os.PathLike) -> str:
    """Take ``<out_dir>/.ckptaudit.lock`` for this process (creating ``out_dir``) and keep it until
    :func:`release` or the process ends.  Re-entrant: a second call in the same process only counts, so the
    CLI and the Snakefile it runs in-process can both ask; each hold needs its :func:`release`.  Returns the
    lock file's path.

    Raises :class:`OutputBusy` (message: who holds it since when, and what to do) when another process holds
    it; ``OSError`` when the folder cannot be created or the lock file opened."""
    path = _path(out_dir)
    if path in _HELD:
        _HELD[path][1] += 1
        return path
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(fd)
        os.close(fd)
        raise OutputBusy(f"another audit is writing to {Path(out_dir)} ({holder}); wait for it to end, "
                         f"or give this audit another output folder") from None
    except BaseException:
        os.close(fd)
        raise
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "started_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    _HELD[path] = [fd, 1]
    return path


def held(out_dir: str | os.PathLike) -> bool:
    """True when this process holds ``out_dir``'s lock."""
    return _path(out_dir) in _HELD


def release(out_dir: str | os.PathLike) -> None:
    """Undo one :func:`hold`; the last one drops this process's lock on ``out_dir`` (no-op when not held).
    The file stays; without a holder its content means nothing."""
    path = _path(out_dir)
    entry = _HELD.get(path)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _HELD[path]
        os.close(entry[0])  # closing the only descriptor of the open file drops the flock


def _describe(fd: int) -> str:
    """The holder as written in the lock file: ``pid N on HOST since T`` (or "holder unknown")."""
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {doc['pid']} on {doc['host']} since {doc['started_utc']}"
    except (ValueError, KeyError, OSError, UnicodeDecodeError):
        return "holder unknown"
