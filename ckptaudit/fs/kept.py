"""Bytes of remote objects that this audit already read: served from memory instead of fetched again.

The hash stage's one pass reads every byte of a remote object once; besides its digests and facts it
keeps the bytes a later stage will ask for again — everything but the long runs of tensor data whose
CRC32 and value statistics the pass already computed (:mod:`ckptaudit.onepass.facts`, kind "bytes").
A later stage loads them here (:func:`put`), and every remote read of this package goes through
:func:`pieces` first: :func:`ckptaudit.fs.reads.read_ranges` and the fetcher of
:func:`ckptaudit.fs.remote.open_object` fetch only the gaps, so the scan's zip headers and pickle walk
and the load test's sparse copy cost no GET for bytes already read.  Bytes served from here are not
counted as remote reads (they are not); :func:`served_bytes` says how many were.

Keys are object URLs (``s3://bucket/key``); the caller drops a file's bytes when its size changed
since the pass (:func:`ckptaudit.onepass.facts.load`), as it does the other facts.
"""

from __future__ import annotations

import bisect
import threading
from typing import Callable, Dict, List, Optional, Tuple

_lock = threading.Lock()
_pieces: Dict[str, List[Tuple[int, bytes]]] = {}  # url -> sorted, non-overlapping (offset, bytes)
_starts: Dict[str, List[int]] = {}
_sizes: Dict[str, int] = {}  # url -> object bytes when the pass kept its bytes
_served = {"bytes": 0}


def clear() -> None:
    """Forget every kept byte (:func:`served_bytes` keeps counting, like the I/O counters of :mod:`.counters`)."""
    with _lock:
        _pieces.clear()
        _starts.clear()
        _sizes.clear()


def put(url: str, offset: int, data: bytes, size: int) -> None:
    """Keep ``data`` as the bytes of ``url`` (an object of ``size`` bytes) from ``offset``; a piece overlapping
    one already kept is ignored."""
    if not data:
        return
    with _lock:
        _sizes[url] = int(size)
        ps, st = _pieces.setdefault(url, []), _starts.setdefault(url, [])
        i = bisect.bisect_left(st, offset)
        if (i > 0 and ps[i - 1][0] + len(ps[i - 1][1]) > offset) or (i < len(ps) and ps[i][0] < offset + len(data)):
            return
        ps.insert(i, (offset, bytes(data)))
        st.insert(i, offset)


def has(url: str) -> bool:
    """True when some bytes of ``url`` are kept."""
    return url in _pieces


def pieces(url: str, start: int, end: int) -> List[Tuple[int, int, Optional[bytes]]]:
    """``[start, end)`` of ``url`` as consecutive ``(offset, length, bytes)``: ``bytes`` is the kept data, or
    None for a gap the caller must fetch.  One gap (the whole range) when nothing of it is kept."""
    ps, st = _pieces.get(url), _starts.get(url)
    if ps and url in _sizes:
        end = min(end, max(start, _sizes[url]))  # nothing to fetch past the object's end
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
    with _lock:
        _served["bytes"] += nbytes


def served_bytes() -> int:
    """Bytes this process answered from kept bytes instead of a GET, since it started."""
    return _served["bytes"]


class KeptFetcher:
    """A fetcher ``(start, end) -> bytes`` (fsspec's cache interface) that answers from kept bytes and calls
    ``fetch`` only for the gaps."""

    def __init__(self, url: str, fetch: Callable[[int, int], bytes]) -> None:
        self.url, self.fetch = url, fetch

    def __call__(self, start, end):
        if start is None:
            start = 0
        if end is None or not has(self.url):
            return self.fetch(start, end)
        parts = pieces(self.url, int(start), int(end))
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
