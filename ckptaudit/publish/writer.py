"""The hashing writer: a write-only binary file that hashes every byte while ``torch.save`` writes it."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

from .._io import write_all as _write_all
from ..hashing import sha256_range
from .clock import _Clock
from .manifest import FileRecord
from .names import _O_CLOEXEC


class HashingWriter:
    """Binary write-only file (what ``torch.save`` needs: ``write``, ``flush``) that hashes
    every byte it writes: the whole-file SHA-256 inline, and each completed ``chunk_bytes``
    chunk from the page cache (``os.preadv``) on ``pool`` while writing continues.

    ``close()`` fsyncs, waits for the chunk digests, closes the descriptor and sets
    ``record``.  ``abort()`` closes without fsync (the caller removes the file).  Creating
    it raises ``FileExistsError`` if ``path`` exists (``O_EXCL``).
    """

    def __init__(self, path: Path, rel: str, chunk_bytes: int, pool: ThreadPoolExecutor, clock: _Clock,
                 rank: int = 0):
        self.path, self.rel, self.chunk_bytes, self.rank = Path(path), rel, chunk_bytes, rank
        self._pool, self._clock = pool, clock
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        self._full = hashlib.sha256()
        self.written = 0
        self._chunks: List[Future] = []
        self.closed = False
        self.record: Optional[FileRecord] = None
        self.role = ""  # what the file holds (set by Publication.save), recorded in the manifest
        self.error: Optional[OSError] = None  # the first failed write, if any

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        try:
            _write_all(self.fd, view)
        except OSError as e:  # ENOSPC, EDQUOT, EFBIG: kept, since torch.save masks it with its own error
            self.error = e
            raise
        self._full.update(view)
        self.written += n
        cb = self.chunk_bytes
        while (len(self._chunks) + 1) * cb <= self.written:
            self._chunks.append(self._pool.submit(sha256_range, self.fd, len(self._chunks) * cb, cb))
        return n

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
        cb = self.chunk_bytes
        if len(self._chunks) * cb < self.written:
            off = len(self._chunks) * cb
            self._chunks.append(self._pool.submit(sha256_range, self.fd, off, self.written - off))
        try:
            with self._clock("fsync_seconds"):
                os.fsync(self.fd)
            chunks = [f.result() for f in self._chunks]
        finally:
            self._release()
        self.record = FileRecord(self.rel, self.written, self._full.hexdigest(), cb, chunks, self.rank, self.role)
        return self.record

    def abort(self) -> None:
        if not self.closed:
            self._release()

    def _release(self) -> None:
        """Wait for the chunk workers, then close the descriptor exactly once.

        Safe to call again after a :class:`Preempted` raised part-way through it: the
        descriptor is taken out of ``self.fd`` before it is closed, so a second call never
        closes a number the process may have reused (at worst one descriptor leaks)."""
        for f in self._chunks:  # never close the fd while a worker may still read it
            f.cancel()
            if not f.cancelled():
                f.exception()
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
