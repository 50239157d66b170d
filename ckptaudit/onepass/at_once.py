"""How many file passes run at once in one process, which run on the calling thread, and whether a pass's digest
gets a thread of its own (:func:`spread`).

A pass over a big file spends its time in digests and scans that release the GIL (``hashlib``, ``blake3``,
``isal``, numpy), so the hash stage runs several on threads.  A pass over a small file is Python — its zip
records, the data.pkl walk, the values record by record — and such passes on threads convoy on the GIL: on a part
of 128 units of 87 KB (one ``torch.save`` file each, 72 zip records; issue 45) the hash job took 1.06 CPU-s and 1.1 s
with every unit on one thread, 1.6 CPU-s and 1.45 s with four at once (the job alone on two cores; in a 10,000-unit
audit, whose other jobs keep both cores busy, the hash jobs took 63.8 CPU-s either way).  At
:data:`SERIAL_UNIT_BYTES` the digests (SHA-256 ~2 GB/s a core on the project's VM) take about as long as that
Python.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Sequence, TypeVar

from .. import fs

T = TypeVar("T")
R = TypeVar("R")

#: Files of one unit read at once by the hash stage (each holds two read buffers: memory stays bounded).
FILES_AT_ONCE = 4
#: File passes in flight in one process, whatever the units hashed at once (the hash stage's threads) and their
#: files: each pass holds two buffers of ``onepass.stream.BUFFER_BYTES`` (8 MiB) plus the value scan's 1 MiB
#: temporaries, so the hash job stays within ~100 MiB over its baseline.
PASSES_AT_ONCE = 4
#: A unit of at most this many bytes (the inventory's ``size_bytes``) is passed on the calling thread, its files
#: one after another.
SERIAL_UNIT_BYTES = 8 << 20


class PassSlots:
    """At most ``n`` file passes in flight in this process (``with slots:`` around a pass), and how many are
    (:attr:`in_flight`: a pass decides from it whether its digest runs beside its other consumers, :func:`spread`)."""

    def __init__(self, n: int) -> None:
        self._free = threading.BoundedSemaphore(n)
        self._lock = threading.Lock()
        self._in_flight = 0

    def __enter__(self) -> "PassSlots":
        self._free.acquire()
        with self._lock:
            self._in_flight += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._in_flight -= 1
        self._free.release()

    @property
    def in_flight(self) -> int:
        """Passes inside a ``with`` of these slots now."""
        return self._in_flight


#: The process's pass slots (process state: passes in flight), taken by the hash stage around each file's pass.
PASS_SLOTS = PassSlots(PASSES_AT_ONCE)


def spread(cores: int) -> bool:
    """Whether a pass's whole-file digest should run on a thread of its own beside its other consumers (CRC32,
    value statistics) rather than in turn with them on the reading thread: while fewer passes are in flight
    than the process has ``cores``, a core would otherwise idle.  With as many passes as cores the cores are
    busy either way, and the hand-off only costs: three passes over 3 GiB files at once on two cores took
    8.05–8.60 CPU-s and 4.24–4.54 s with the digest on its own thread, 7.56–7.77 CPU-s and 3.87–4.06 s in
    turn (three rounds each, interleaved; issue 45's sidecar run, SHA-256)."""
    return PASS_SLOTS.in_flight < cores


def small_unit(unit: dict, run_dir) -> bool:
    """Whether ``unit`` (an inventory unit of the run at ``run_dir``) is passed on the calling thread: the run is
    local (a remote unit's pass waits on round trips, not on the GIL, and overlaps them on threads) and the unit's
    ``size_bytes`` is known and at most :data:`SERIAL_UNIT_BYTES`."""
    size = unit.get("size_bytes")
    return isinstance(size, int) and 0 <= size <= SERIAL_UNIT_BYTES and not fs.is_remote(run_dir)


def map_in_order(one: Callable[[T], R], items: Sequence[T], on_threads: Sequence[bool], workers: int) -> List[R]:
    """``[one(x) for x in items]``, in order: the items whose ``on_threads`` is true on up to ``workers`` threads,
    the others meanwhile on the calling thread.  An exception of ``one`` is raised here once the items already
    on threads have ended: at once from an item on the calling thread, after the calling thread's items from one
    on a thread."""
    threaded = [i for i, t in enumerate(on_threads) if t]
    if min(workers, len(threaded)) < 2:
        return [one(x) for x in items]
    done: List = [None] * len(items)
    with ThreadPoolExecutor(max_workers=min(workers, len(threaded))) as pool:
        running = {i: pool.submit(one, items[i]) for i in threaded}
        for i, x in enumerate(items):
            if i not in running:
                done[i] = one(x)
        for i, fut in running.items():
            done[i] = fut.result()
    return done
