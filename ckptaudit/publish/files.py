"""File operations of the protocol: durable atomic writes, folder fsyncs, the NFS-tolerant rename, removals.

The atomic write and the folder fsync are :mod:`ckptaudit._io`'s; this module binds them
to the protocol's needs (always durable, the folder fsynced by the caller once per step).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from .._io import atomic_write
from .._io import fsync_dir  # noqa: F401 - (path, clock): fsync a folder, see _io
from .._io import unlink_quiet  # noqa: F401 - used by the protocol's modules
from .clock import Clock

log = logging.getLogger("ckptaudit.publish")


def durable_write(path: Path, data: bytes, clock: Clock) -> None:
    """Write ``data`` to a temp name beside ``path``, fsync, ``os.replace`` onto ``path``.
    The caller fsyncs the folder.  Raises ``OSError`` (the temp file is removed)."""
    atomic_write(path, data, durable=True, sync_dir=False, clock=clock)


def remove_tree_quiet(path: Path) -> None:
    """Remove ``path`` (a folder with what it holds, or a file); a failure is logged, never raised."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("%s: could not remove (%s)", path, e.strerror)


def rename_nfs_safe(src: Path, dst: Path) -> None:
    """``os.rename`` that tolerates the NFS retry case (ENOENT although the rename happened)."""
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        if dst.exists() and not src.exists():
            log.warning("%s -> %s: rename reported ENOENT but the destination exists (NFS retry); "
                        "treating it as done", src, dst)
            return
        raise
