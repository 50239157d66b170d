"""The reader of one pass: every byte of a file (or of one segment of it) read once, in order, into a bounded buffer.

Locally: ``os.preadv`` into two alternating buffers of :data:`BUFFER_BYTES` (the next read runs
while a digest on its own thread works on the last one), ``posix_fadvise(SEQUENTIAL)`` on the descriptor.  An
``s3://`` object: ranged GETs of :data:`BUFFER_BYTES`, :data:`REMOTE_PARALLEL` at once
(:func:`ckptaudit.fs.read_ranges_uncached`, counted as "streamed": the pass reads the object itself, never
bytes an earlier pass kept).  Each buffer goes to every consumer; the SHA-256 consumers of one buffer
run on threads (``hashlib`` releases the GIL on large buffers) while the reading thread feeds the others
(CRC32, value statistics, a data area's NUL runs: less work than a thread hand-off each), as long as fewer
passes are in flight than cores (:func:`ckptaudit.onepass.at_once.spread`; else all in turn on the reading
thread), and the pass waits for them before the buffer is reused, so memory is two buffers (local) or
``REMOTE_PARALLEL`` (remote) whatever the file size.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Optional, Sequence

from .. import fs

#: Bytes of one read (and of each of the two buffers of a local pass).
BUFFER_BYTES = 8 << 20
#: Ranged GETs of BUFFER_BYTES in flight at once while a remote object is streamed.
REMOTE_PARALLEL = 4
#: A remote object up to this size (bytes) is fetched whole first (one ranged GET), so its plan is made
#: from those bytes and costs no reads of its own.
SMALL_REMOTE_BYTES = BUFFER_BYTES


class PassStopped(OSError):
    """A pass was stopped by its caller (the ``stop`` event of :func:`run`) before its last byte."""


def _check_stop(stop: Optional[threading.Event], path) -> None:
    if stop is not None and stop.is_set():
        raise PassStopped(f"{fs.fspath(path)}: pass stopped by its caller")


def _feed_all(pool: Optional[ThreadPoolExecutor], consumers: Sequence, off: int, view) -> List:
    """Feed ``view`` to every consumer; the futures of those fed on ``pool`` (the SHA-256 ones, ``ON_POOL``),
    the rest fed here.  A hand-off per consumer and buffer cost more than the CRC32, value and NUL-run
    consumers' own work: on a 3 GiB torch.save file (8 MiB buffers, this project's 2-core VM) every consumer on
    the pool took 2.7–3.2 s wall and 3.3–4.0 CPU-s, SHA-256 on the pool and the rest here 2.4 s and 2.9–3.0
    CPU-s (``hashlib.file_digest``: 2.2 s)."""
    if pool is None or len(consumers) < 2:
        for c in consumers:
            c.feed(off, view)
        return []
    futures = [pool.submit(c.feed, off, view) for c in consumers if getattr(c, "ON_POOL", False)]
    for c in consumers:
        if not getattr(c, "ON_POOL", False):
            c.feed(off, view)
    return futures


def _wait(futures: List) -> None:
    for f in futures:
        f.result()


def run(path, consumers: Sequence, start: int = 0, end: Optional[int] = None, *,
        pool: Optional[ThreadPoolExecutor] = None, buffer_bytes: int = BUFFER_BYTES,
        stop: Optional[threading.Event] = None, spread: Optional[Callable[[], bool]] = None) -> int:
    """Feed bytes ``[start, end)`` of ``path`` (``end`` None: to the end of the file) to every consumer, in
    order; return the bytes read.  ``pool`` runs the consumers of one buffer concurrently (None: in turn);
    ``spread``, asked before each buffer of a local file, says whether this buffer's go on ``pool`` (None: yes).
    Once ``stop`` is set the pass stops at its next buffer, raising :class:`PassStopped` (an ``OSError``: the
    file's row says it was not read through); the reader uses it to abandon a pass it started ahead of need.
    Raises ``OSError`` when the file cannot be read."""
    if fs.is_remote(path):
        return _run_remote(path, consumers, start, end, pool, buffer_bytes, stop)
    fd = os.open(fs.fspath(path), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        end = size if end is None else min(end, size)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_SEQUENTIAL)
        bufs = [bytearray(min(buffer_bytes, max(end - start, 1))) for _ in range(2)]
        off, k, pending, done = start, 0, [], 0
        while off < end:
            _check_stop(stop, path)
            view = memoryview(bufs[k])[:min(len(bufs[k]), end - off)]
            n = fs.preadv(fd, [view], off)  # the other buffer is still with the consumers
            _wait(pending)
            if n <= 0:
                pending = []
                break
            pending = _feed_all(pool if spread is None or spread() else None, consumers, off, view[:n])
            off, done, k = off + n, done + n, 1 - k
        _wait(pending)
        return done
    finally:
        os.close(fd)


def fetch(path, size: int, buffer_bytes: int = BUFFER_BYTES) -> bytes:
    """All ``size`` bytes of remote object ``path`` (ranged GETs of ``buffer_bytes``, all at once, counted as
    "streamed"); for objects up to :data:`SMALL_REMOTE_BYTES`.  Raises ``OSError`` when a range fails."""
    ranges = [(o, min(buffer_bytes, size - o)) for o in range(0, size, buffer_bytes)]
    blobs = fs.read_ranges_uncached(path, ranges, purpose="streamed") if ranges else []
    if any(b is None for b in blobs):
        raise OSError(f"{fs.fspath(path)}: a ranged read failed")
    return blobs[0] if len(blobs) == 1 else b"".join(blobs)


def feed_bytes(data: bytes, consumers: Sequence, pool: Optional[ThreadPoolExecutor] = None,
               buffer_bytes: int = BUFFER_BYTES) -> int:
    """Feed bytes already in memory (the whole file) to every consumer, ``buffer_bytes`` at a time."""
    view = memoryview(data)
    for off in range(0, len(data), buffer_bytes):
        _wait(_feed_all(pool, consumers, off, view[off:off + buffer_bytes]))
    return len(data)


def _run_remote(path, consumers: Sequence, start: int, end: Optional[int], pool, buffer_bytes: int,
                stop: Optional[threading.Event] = None) -> int:
    size = fs.size(path)
    end = size if end is None else min(end, size)
    done, off = 0, start
    while off < end:
        _check_stop(stop, path)
        batch = [(o, min(buffer_bytes, end - o)) for o in range(off, min(end, off + REMOTE_PARALLEL * buffer_bytes),
                                                                buffer_bytes)]
        blobs = fs.read_ranges_uncached(path, batch, purpose="streamed")
        for (o, n), b in zip(batch, blobs):
            if b is None:  # a failed GET: once more on its own
                b = fs.read_ranges_uncached(path, [(o, n)], purpose="streamed")[0]
            if b is None:
                raise OSError(f"{fs.fspath(path)}: ranged read of {n} bytes at {o} failed")
            _wait(_feed_all(pool, consumers, o, memoryview(b)))
            done += len(b)
            if len(b) < n:
                return done
        off = batch[-1][0] + batch[-1][1]
    return done
