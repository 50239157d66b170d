"""The hashing writer: a write-only binary file that hashes every byte, from memory, while ``torch.save`` writes it.

Two digests of every byte: the whole-file SHA-256 (the sidecar's, what ``sha256sum -c`` checks) and the
manifest's chunk digests, BLAKE3 (:mod:`ckptaudit.formats.chunk_digest`: ~3.6 × cheaper than a second SHA-256
pass, which had set the writer's floor at 1.05 × ``torch.save`` + fsync on two cores; issue 23).
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import hashlib
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, List, Optional, Tuple

from .._io import write_all as _write_all
from ..formats.chunk_digest import WRITTEN, new_hasher
from .clock import Clock
from .manifest import FileRecord
from .names import O_CLOEXEC

#: Writes at least this big (bytes) are hashed on the writer's two hashing threads while the
#: calling thread writes them to disk; smaller ones (torch's zip headers, the pickle) are hashed
#: inline, where a hand-off to a thread would cost more than the hash.
PARALLEL_BYTES = 1 << 20
#: Copies of small writes made while the hashing threads still work on held memory are handed to
#: them in batches of this many bytes; past :data:`MAX_TAIL_BYTES` queued, the writer waits.
TAIL_BATCH_BYTES = 4 << 20
MAX_TAIL_BYTES = 64 << 20

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
    SHA-256 and the BLAKE3 digest of each ``chunk_bytes`` chunk (for the manifest,
    :data:`ckptaudit.formats.chunk_digest.WRITTEN`) are computed from the buffer while the calling
    thread writes the same buffer to disk.

    A write of at least :data:`PARALLEL_BYTES` is hashed on two threads of the writer's own,
    one per digest, each taking buffers in file order (hashlib, ``blake3`` and ``os.write``
    release the GIL, so the three run at once).  Whether ``write`` waits for them depends on
    the buffer: torch hands over views of tensor storages and of its own temporary buffers
    (a GPU tensor's CPU copy, freed once written), so by default a write returns only once
    both digests of it are done, and its cost is the slowest of the three.  A buffer inside
    memory declared with :meth:`hold` (the CPU storages of the object being saved, which
    ``Publication.save`` declares) is left to the threads: ``write`` returns as soon as it is
    on disk, and the hashing overlaps torch's own work on the next records.  Small writes
    made meanwhile are copied and hashed after it, in order.  After each big write the
    kernel is asked to start writing it to disk (:func:`start_writeback`), so the ``fsync``
    in ``close()`` waits only for the tail.

    ``close()`` fsyncs, waits for the hashing threads, closes the descriptor and sets
    ``record``.  ``abort()`` waits for them and closes without fsync (the caller removes the
    file).  Creating it raises ``FileExistsError`` if ``path`` exists (``O_EXCL``); ``write``
    raises the ``OSError`` of a failed write (``ENOSPC``, ``EDQUOT``, ``EFBIG``) and keeps it
    in ``error``.
    """

    def __init__(self, path: Path, rel: str, chunk_bytes: int, clock: Clock, rank: int = 0):
        self.path, self.rel, self.chunk_bytes, self.rank = Path(path), rel, chunk_bytes, rank
        self._clock = clock
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | O_CLOEXEC, 0o644)
        self._full = hashlib.sha256()
        self._chunk = new_hasher(WRITTEN)  # the chunk being filled
        self._chunk_fill = 0  # bytes of it so far
        self._chunks: List[str] = []  # hex digests of the finished chunks
        self._lanes: Optional[Tuple[ThreadPoolExecutor, ThreadPoolExecutor]] = None  # SHA-256, chunks
        self._pending: List[Future] = []  # hashing tasks not yet collected, in submission order
        self._tail: List[bytes] = []  # copies of small writes made while tasks were pending
        self._tail_bytes = 0
        self._queued_tail = 0  # bytes of copies handed to the lanes and not yet collected
        self._held_starts: List[int] = []  # hold(): sorted starts, and the running maximum of the ends
        self._held_ends: List[int] = []
        self.written = 0
        self.closed = False
        self.record: Optional[FileRecord] = None
        self.role = ""  # what the file holds (set by Publication.save), recorded in the manifest
        self.error: Optional[OSError] = None  # the first failed write, if any

    def hold(self, ranges: Iterable[Tuple[int, int]]) -> None:
        """Declare memory, as ``(start address, end address)`` ranges, that the caller keeps
        allocated and unchanged until :meth:`close` or :meth:`abort` returns: big writes from
        inside one range are hashed after ``write`` returns.  If the memory changes meanwhile
        the digests disagree with the file and the unit fails verification; it is never
        called intact."""
        self._held_starts, self._held_ends, top = [], [], 0
        for start, end in sorted(ranges):
            top = max(top, end)
            self._held_starts.append(start)
            self._held_ends.append(top)

    def _is_held(self, view: memoryview) -> bool:
        if not self._held_starts:
            return False
        import numpy as np

        addr = np.frombuffer(view, np.uint8).ctypes.data
        i = bisect.bisect_right(self._held_starts, addr) - 1
        return i >= 0 and addr + len(view) <= self._held_ends[i]

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        if n < PARALLEL_BYTES:
            self._write(view)
            if self._pending and not self._tail and all(f.done() for f in self._pending[-2:]):
                self._collect()  # each lane is FIFO: its last task done means it is idle, so hash inline again
            if self._pending:  # keep file order: after what the threads still hash
                self._tail.append(bytes(view))
                self._tail_bytes += n
                if self._tail_bytes >= TAIL_BATCH_BYTES:
                    self._flush_tail()
            else:
                self._full.update(view)
                self._chunk_update(view)
        else:
            self._flush_tail()
            held = self._is_held(view)
            self._submit(view)
            try:
                self._write(view)
                start_writeback(self.fd, self.written, n)
            finally:  # never return (or raise) while a thread still reads a buffer the caller may free
                if not held:
                    self._wait()
            if not held:
                self._collect()
        self.written += n
        return n

    def _submit(self, view: memoryview) -> None:
        if self._lanes is None:
            self._lanes = (ThreadPoolExecutor(1, thread_name_prefix="ckptaudit-sha256"),
                           ThreadPoolExecutor(1, thread_name_prefix="ckptaudit-chunks"))
        self._pending += [self._lanes[0].submit(self._full.update, view),
                          self._lanes[1].submit(self._chunk_update, view)]

    def _flush_tail(self) -> None:
        if self._tail:
            data, self._tail = b"".join(self._tail), []
            self._queued_tail += self._tail_bytes
            self._tail_bytes = 0
            self._submit(memoryview(data))
            if self._queued_tail >= MAX_TAIL_BYTES:
                self._wait()
                self._collect()

    def _wait(self) -> None:
        """Wait until every submitted task has finished (raising nothing)."""
        for f in self._pending:
            f.exception()

    def _collect(self) -> None:
        """Wait for the submitted tasks and raise the first one's error, if any."""
        pending, self._pending, self._queued_tail = self._pending, [], 0
        for f in pending:
            f.result()

    def _write(self, view: memoryview) -> None:
        try:
            _write_all(self.fd, view)
        except OSError as e:  # ENOSPC, EDQUOT, EFBIG: kept, since torch.save masks it with its own error
            self.error = e
            raise

    def _chunk_update(self, view: memoryview) -> None:
        """The chunk digests: ``view`` continues the bytes hashed so far."""
        cb = self.chunk_bytes
        while view:
            take = min(cb - self._chunk_fill, len(view))
            self._chunk.update(view[:take])
            self._chunk_fill += take
            view = view[take:]
            if self._chunk_fill == cb:
                self._chunks.append(self._chunk.hexdigest())
                self._chunk, self._chunk_fill = new_hasher(WRITTEN), 0

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
            self._flush_tail()
            with self._clock("fsync_seconds"):  # the disk's wait overlaps the hashing threads' last work
                os.fsync(self.fd)
            self._wait()
            self._collect()
        finally:
            self._release()
        chunks = self._chunks + ([self._chunk.hexdigest()] if self._chunk_fill else [])
        self.record = FileRecord(self.rel, self.written, self._full.hexdigest(), self.chunk_bytes, chunks,
                                 self.rank, self.role)
        return self.record

    def abort(self) -> None:
        if not self.closed:
            self._release()

    def _release(self) -> None:
        """Wait for the hashing threads (they may read held memory), then close the descriptor
        exactly once.

        Safe to call again after a :class:`Preempted` raised part-way through it: the
        descriptor is taken out of ``self.fd`` before it is closed, so a second call never
        closes a number the process may have reused (at worst one descriptor leaks)."""
        lanes, self._lanes = self._lanes, None
        for lane in lanes or ():
            lane.shutdown(wait=True)
        self._pending, self._tail, self._tail_bytes = [], [], 0
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


def cpu_storage_ranges(obj: Any) -> List[Tuple[int, int]]:
    """``(start address, end address)`` of the storage of every plain CPU tensor in ``obj``,
    found through dicts, lists and tuples (what a state_dict and a training dict are made of;
    a tensor inside another object is not found, and its writes are then waited for).  For
    :meth:`HashingWriter.hold`: ``torch.save`` writes a CPU tensor's storage bytes straight
    from this memory.  Containers met twice are walked once."""
    import torch

    out: List[Tuple[int, int]] = []
    stack, seen = [obj], set()
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            if type(x) in (torch.Tensor, torch.nn.Parameter) and x.device.type == "cpu" \
                    and x.layout == torch.strided and not x.is_quantized:
                s = x.untyped_storage()
                if s.data_ptr() and s.nbytes():
                    out.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
        elif isinstance(x, (dict, list, tuple)) and id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.values() if isinstance(x, dict) else x)
    return out
