"""The hashing writer: a write-only binary file that hashes every byte, from memory, while ``torch.save`` writes it."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

from .._io import write_all as _write_all
from .clock import Clock
from .manifest import FileRecord
from .names import O_CLOEXEC

#: Writes at least this big (bytes) are hashed on ``pool`` while the calling thread writes
#: them to disk; smaller ones (torch's zip headers, the pickle) are hashed inline, where a
#: hand-off to a thread would cost more than the hash.
PARALLEL_BYTES = 1 << 20

_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait


@functools.lru_cache(maxsize=1)
def _libc_sync_file_range():
    """libc's ``sync_file_range(2)`` (Linux; the ``os`` module does not wrap it), or None.
    Looked up in the symbols the process already has (``CDLL(None)``): no library search."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes of ``fd`` from ``offset`` to disk, without
    waiting (``sync_file_range(2)`` with ``SYNC_FILE_RANGE_WRITE``).  Durability still comes only
    from the ``fsync`` that follows; this only moves the disk writes earlier, so they overlap
    the serialisation and hashing that follow instead of all waiting in the final ``fsync``
    (with Linux's default ``vm.dirty_background_ratio`` of 10 %, a 1 GiB file on a 23 GiB host
    would otherwise sit in the page cache until then).  A no-op where the call is missing or
    fails (it is advice)."""
    fn = _libc_sync_file_range()  # looked up once per process
    if fn is not None:
        fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


class HashingWriter:
    """Binary write-only file (what ``torch.save`` needs: ``write``, ``flush``) that hashes
    every byte it is handed, in memory, so the file is never read back: the whole-file
    SHA-256 and the SHA-256 of each ``chunk_bytes`` chunk (for the manifest) are computed
    from the buffer while the calling thread writes the same buffer to disk.  Chunk 0 is
    the whole-file hash's prefix and costs nothing extra, so a file of at most
    ``chunk_bytes`` is hashed once.

    A write of at least :data:`PARALLEL_BYTES` runs both digests on ``pool`` (hashlib and
    ``os.write`` release the GIL, so the three run at once on three cores) and returns only
    once all three are done: the caller's buffer is never used after ``write`` returns
    (torch hands over views of tensor storages and of its own temporary buffers).  The cost
    of a write is then the slowest of the three, not their sum.  After each such write the
    kernel is asked to start writing it to disk (:func:`start_writeback`), so the ``fsync``
    in ``close()`` waits only for the tail.

    ``close()`` fsyncs, closes the descriptor and sets ``record``.  ``abort()`` closes without
    fsync (the caller removes the file).  Creating it raises ``FileExistsError`` if ``path``
    exists (``O_EXCL``); ``write`` raises the ``OSError`` of a failed write (``ENOSPC``,
    ``EDQUOT``, ``EFBIG``) and keeps it in ``error``.
    """

    def __init__(self, path: Path, rel: str, chunk_bytes: int, pool: ThreadPoolExecutor, clock: Clock,
                 rank: int = 0):
        self.path, self.rel, self.chunk_bytes, self.rank = Path(path), rel, chunk_bytes, rank
        self._pool, self._clock = pool, clock
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_CLOEXEC, 0o644)
        self._full = hashlib.sha256()
        self._first: Optional[str] = None  # chunk 0's digest: the whole-file hasher's, copied at its end
        self._chunk = hashlib.sha256()  # the chunk (after chunk 0) being filled
        self._chunk_fill = 0  # bytes of it so far
        self._chunks: List[str] = []  # hex digests of the finished chunks after chunk 0
        self.written = 0
        self.closed = False
        self.record: Optional[FileRecord] = None
        self.role = ""  # what the file holds (set by Publication.save), recorded in the manifest
        self.error: Optional[OSError] = None  # the first failed write, if any

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        start = self.written
        if n < PARALLEL_BYTES:
            self._write(view)
            self._full_update(view, start)
            self._chunk_update(view, start)
        else:
            futs: List[Future] = [self._pool.submit(self._full_update, view, start),
                                  self._pool.submit(self._chunk_update, view, start)]
            try:
                self._write(view)
                start_writeback(self.fd, self.written, n)
            finally:  # never return (or raise) while a worker still reads the caller's buffer
                for f in futs:
                    f.exception()
            for f in futs:
                f.result()
        self.written += n
        return n

    def _write(self, view: memoryview) -> None:
        try:
            _write_all(self.fd, view)
        except OSError as e:  # ENOSPC, EDQUOT, EFBIG: kept, since torch.save masks it with its own error
            self.error = e
            raise

    def _full_update(self, view: memoryview, start: int) -> None:
        """The whole-file hash; on crossing ``chunk_bytes`` it also yields chunk 0's digest
        (the same bytes from the same start), so chunk 0 — a whole file up to ``chunk_bytes``
        — is hashed once, not twice."""
        k = self.chunk_bytes - start
        if self._first is None and 0 <= k <= len(view):
            self._full.update(view[:k])
            self._first = self._full.copy().hexdigest()
            view = view[k:]
        self._full.update(view)

    def _chunk_update(self, view: memoryview, start: int) -> None:
        """The digests of chunks 1, 2, … (chunk 0 comes from :meth:`_full_update`)."""
        cb = self.chunk_bytes
        if start < cb:
            view = view[cb - start:]
        while view:
            take = min(cb - self._chunk_fill, len(view))
            self._chunk.update(view[:take])
            self._chunk_fill += take
            view = view[take:]
            if self._chunk_fill == cb:
                self._chunks.append(self._chunk.hexdigest())
                self._chunk, self._chunk_fill = hashlib.sha256(), 0

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def close(self) -> FileRecord:
        if self.record is not None:
            return self.record
        if self.closed:
            raise ValueError(f"{self.path}: closed after a failure or abort; it has no record")
        try:
            with self._clock("fsync_seconds"):
                os.fsync(self.fd)
        finally:
            self._release()
        if self.written <= self.chunk_bytes:  # one chunk (or none): the whole file
            chunks = [self._full.hexdigest()] if self.written else []
        else:
            chunks = [self._first] + self._chunks + ([self._chunk.hexdigest()] if self._chunk_fill else [])
        self.record = FileRecord(self.rel, self.written, self._full.hexdigest(), self.chunk_bytes, chunks,
                                 self.rank, self.role)
        return self.record

    def abort(self) -> None:
        if not self.closed:
            self._release()

    def _release(self) -> None:
        """Close the descriptor exactly once.

        Safe to call again after a :class:`Preempted` raised part-way through it: the
        descriptor is taken out of ``self.fd`` before it is closed, so a second call never
        closes a number the process may have reused (at worst one descriptor leaks)."""
        fd, self.fd = self.fd, -1
        self.closed = True
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
