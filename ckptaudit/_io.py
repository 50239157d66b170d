"""The one atomic write: bytes to a temp name in the same folder, then renamed over the target.

:func:`atomic_write` is what every "write temp, rename" in ckptaudit calls.  The temp
name is :func:`tmp_name`'s ``.ckptaudit-tmp-<host8>-<pid>-<rand8>-<name>``, which the
audit reads as a save in progress (``ckptaudit.units.IN_PROGRESS_PATTERNS``) and
``ckptaudit prune --sweep-stale`` removes once its writer is gone.  With
``durable=True`` the data is fsynced before the rename (a rename orders names, not data:
after a power loss ext4, XFS and btrfs can show the new name over unwritten blocks) and
the folder after it (``fsync(2)``: the entry "has also reached disk" only once the folder
is fsynced); ``docs/publish-protocol.md`` says why each one matters.  Stdlib only; every
system call goes through the ``os`` module, so a test that wraps ``os.write`` sees them.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import secrets
import socket
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO, Callable, ContextManager, Optional, Union

__all__ = ["TMP_PREFIX", "atomic_symlink", "atomic_write", "dead_writer", "fsync_dir", "host_tag", "tmp_name",
           "unlink_quiet", "write_all"]

log = logging.getLogger("ckptaudit.publish")  # the writer side's logger, where this warning has always been

TMP_PREFIX = ".ckptaudit-tmp-"
#: The folder of a run that holds units a publish of the same name moved aside (:mod:`ckptaudit.publish.supersede`);
#: the inventory never walks it, so nothing in it is a unit or a rollback point.
SUPERSEDED_DIR = ".ckptaudit-superseded"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)

#: ``clock("fsync_seconds")`` is entered around every fsync (``ckptaudit.publish`` adds
#: up the seconds per key); None times nothing.
Clock = Optional[Callable[[str], ContextManager[None]]]
Data = Union[bytes, bytearray, memoryview, Callable[[BinaryIO], None]]


def host_tag() -> str:
    """8 hex digits of the SHA-256 of this host's name (the ``<host8>`` of a temp name)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def tmp_name(final_name: str) -> str:
    """A temporary name for ``final_name``: ``.ckptaudit-tmp-<host8>-<pid>-<rand8>-<final_name>``."""
    return f"{TMP_PREFIX}{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}-{final_name}"


#: A temp name of :func:`tmp_name`: host tag, pid, random tag, final name.
TMP_RE = re.compile(r"^\.ckptaudit-tmp-([0-9a-f]{8})-(\d+)-([0-9a-f]{8})-(.+)$")


def dead_writer(name: str) -> Optional[int]:
    """The pid of the writer of temp name ``name`` (:func:`tmp_name`) when it ran on this host and is gone; None
    for any other name, another host's temp name (its liveness cannot be seen from here), a live process, or
    one of another user (``kill(pid, 0)`` refused)."""
    m = TMP_RE.match(name)
    if not m or m.group(1) != host_tag():
        return None
    pid = int(m.group(2))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except (PermissionError, OverflowError):
        return None
    return None


def write_all(fd: int, data) -> None:
    """``os.write`` until every byte of ``data`` (any buffer) is written.  Raises ``OSError``."""
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def unlink_quiet(path: Path) -> None:
    """``os.unlink``, ignoring any ``OSError`` (a cleanup that must not mask the real error)."""
    try:
        os.unlink(path)
    except OSError:
        pass


_DIR_FSYNC_WARNED = False


def fsync_dir(path: Path, clock: Clock = None) -> None:
    """fsync a folder so the renames inside it are durable.  A file system that cannot
    (EINVAL/ENOTSUP/EBADF: some FUSE mounts) is logged once and ignored; any other
    ``OSError`` is raised."""
    global _DIR_FSYNC_WARNED
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        with (clock or _untimed)("fsync_seconds"):
            os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
        if not _DIR_FSYNC_WARNED:
            log.warning("%s: this file system cannot fsync a folder (%s); renames are not made durable",
                        path, e.strerror)
            _DIR_FSYNC_WARNED = True
    finally:
        os.close(fd)


def atomic_write(path: Union[str, os.PathLike], data_or_writer: Data, *, durable: bool = False,
                 sync_dir: Optional[bool] = None, clock: Clock = None) -> None:
    """Make ``path`` hold ``data_or_writer`` or leave it as it was, never half-written.

    ``data_or_writer`` is a bytes-like object, or a callable given the temp file open for
    binary writing (``lambda f: json.dump(doc, f)`` needs a text wrapper; ``pq.write_table``
    takes it as is).  The temp file is created with ``O_EXCL`` (mode 0644) beside ``path``;
    ``durable``: fsync it before ``os.replace`` and fsync the folder after; ``sync_dir``
    (default: ``durable``) False leaves the folder fsync to a caller that renames several
    names before one fsync (the publish protocol).  Raises ``OSError`` (or whatever the
    writer raised) after removing the temp file; ``path`` is then untouched.
    """
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
    try:
        if callable(data_or_writer):
            with os.fdopen(fd, "wb", closefd=False) as f:  # flushed on leaving; fd stays open
                data_or_writer(f)
        else:
            write_all(fd, data_or_writer)
        if durable:
            with (clock or _untimed)("fsync_seconds"):
                os.fsync(fd)
    except BaseException:
        os.close(fd)
        unlink_quiet(tmp)
        raise
    os.close(fd)
    _replace(tmp, path)
    if durable if sync_dir is None else sync_dir:
        fsync_dir(path.parent, clock)


def atomic_symlink(path: Union[str, os.PathLike], target: str) -> None:
    """Point the symbolic link ``path`` at ``target`` by renaming a new link over it, so a
    reader sees the old link or the new one, never none.  The caller fsyncs the folder.
    Raises ``OSError`` (the temp link is removed)."""
    path = Path(path)
    tmp = path.with_name(tmp_name(path.name))
    os.symlink(target, tmp)
    _replace(tmp, path)


def _replace(tmp: Path, path: Path) -> None:
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_quiet(tmp)
        raise


def _untimed(key: str) -> ContextManager[None]:
    return nullcontext()
