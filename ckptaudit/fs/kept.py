"""Bytes of remote objects that this audit already read: served from memory instead of fetched again.

The hash stage's one pass reads every byte of a remote object once; besides its digests and facts it
keeps the bytes a later stage will ask for again — everything but the long runs of tensor data whose
CRC32 and value statistics the pass already computed (:mod:`ckptaudit.onepass.facts`, kind "bytes").
A later stage gets them as a value, :class:`KeptBytes` (``ByteFacts.kept``, filled by
:func:`ckptaudit.onepass.facts.load`), and hands them down as a parameter: ``kept=`` of
:func:`ckptaudit.fs.reads.read_ranges`, :func:`~ckptaudit.fs.reads.read_bounded`,
:func:`~ckptaudit.fs.reads.open_binary` and :func:`~ckptaudit.fs.ops.download`, and of every check between
the stage and those reads; a check that receives the ``ByteFacts`` takes them from there (``facts.kept``).
A read given kept bytes fetches only the gaps (:func:`~ckptaudit.fs.reads.read_ranges`; the fetcher of
:func:`ckptaudit.fs.remote.open_object`, :class:`KeptFetcher`), so the scan's zip headers and pickle walk and
the load test's sparse copy cost no GET for bytes already read; a read given None (the hash stage, which reads
the objects themselves) fetches everything.  A file opened with kept bytes keeps them for its life; a thread
pool's task reads from the kept bytes it is passed.  Bytes served are not counted as remote reads (they are
not); :func:`served_bytes` says how many were.

Keys are object URLs (``s3://bucket/key``); :func:`ckptaudit.onepass.facts.load` leaves out a file whose
size or version changed since the pass, as it does the other facts.
"""

from __future__ import annotations

import bisect
import threading
from typing import Callable, Dict, List, Optional, Tuple

_served_lock = threading.Lock()
_served = {"bytes": 0}  # process counter, like those of .counters


class KeptBytes:
    """Pieces of remote objects, by URL: sorted, non-overlapping ``(offset, bytes)``, and each object's size.
    Safe to fill and read from threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pieces: Dict[str, List[Tuple[int, bytes]]] = {}  # url -> sorted, non-overlapping (offset, bytes)
        self._starts: Dict[str, List[int]] = {}
        self._sizes: Dict[str, int] = {}  # url -> object bytes when the pass kept its bytes

    def __len__(self) -> int:
        return sum(len(b) for ps in self._pieces.values() for _, b in ps)

    def put(self, url: str, offset: int, data: bytes, size: int) -> None:
        """Keep ``data`` as the bytes of ``url`` (an object of ``size`` bytes) from ``offset``; a piece
        overlapping one already kept is ignored."""
        if not data:
            return
        with self._lock:
            self._sizes[url] = int(size)
            ps, st = self._pieces.setdefault(url, []), self._starts.setdefault(url, [])
            i = bisect.bisect_left(st, offset)
            if (i > 0 and ps[i - 1][0] + len(ps[i - 1][1]) > offset) or \
                    (i < len(ps) and ps[i][0] < offset + len(data)):
                return
            ps.insert(i, (offset, bytes(data)))
            st.insert(i, offset)

    def has(self, url: str) -> bool:
        """True when some bytes of ``url`` are kept."""
        return url in self._pieces

    def pieces(self, url: str, start: int, end: int) -> List[Tuple[int, int, Optional[bytes]]]:
        """``[start, end)`` of ``url`` as consecutive ``(offset, length, bytes)``: ``bytes`` is the kept data,
        or None for a gap the caller must fetch.  One gap (the whole range) when nothing of it is kept."""
        return _pieces_of(self._pieces.get(url), self._starts.get(url), self._sizes.get(url), start, end)


def _pieces_of(ps, st, size, start: int, end: int) -> List[Tuple[int, int, Optional[bytes]]]:
    if ps and size is not None:
        end = min(end, max(start, size))  # nothing to fetch past the object's end
    if not ps or end <= start:
        return [(start, max(0, end - start), None)] if end > start else []
    out: List[Tuple[int, int, Optional[bytes]]] = []
    at = start
    i = max(0, bisect.bisect_right(st, start) - 1)
    while at < end and i < len(ps):
        o, b = ps[i]
        if o + len(b) <= at:
            i += 1
            continue
        if o > at:  # a gap before this piece
            g = min(o, end)
            out.append((at, g - at, None))
            at = g
            continue
        n = min(o + len(b), end) - at
        out.append((at, n, b[at - o:at - o + n]))
        at += n
        i += 1
    if at < end:
        out.append((at, end - at, None))
    return out


def served(nbytes: int) -> None:
    with _served_lock:
        _served["bytes"] += nbytes


def served_bytes() -> int:
    """Bytes this process answered from kept bytes instead of a GET, since it started."""
    return _served["bytes"]


class KeptFetcher:
    """A fetcher ``(start, end) -> bytes`` (fsspec's cache interface) that answers from ``kept`` and calls
    ``fetch`` only for the gaps (``kept`` None: every call is fetched)."""

    def __init__(self, url: str, fetch: Callable[[int, int], bytes], kept: Optional[KeptBytes]) -> None:
        self.url, self.fetch, self.kept = url, fetch, kept

    def __call__(self, start, end):
        if start is None:
            start = 0
        if end is None or self.kept is None or not self.kept.has(self.url):
            return self.fetch(start, end)
        parts = self.kept.pieces(self.url, int(start), int(end))
        if len(parts) == 1 and parts[0][2] is None:
            return self.fetch(start, end)
        out = []
        for o, n, b in parts:
            if b is None:
                b = self.fetch(o, o + n)
            else:
                served(len(b))
            out.append(b)
            if len(b) < n:  # the object ends here
                break
        return b"".join(out)
