"""The consumers of one pass: objects fed ``(offset, buffer)`` in file order, each computing one fact.

Every consumer has ``feed(offset, view)`` (``view``: the file's bytes from ``offset``) and a result;
none reads a file.  :class:`RangeCrc32` and :class:`RangeValues` also accept the buffers of one
byte range of the file only, so a big file may be split into segments fed by different threads:
:meth:`RangeCrc32.merge` and :meth:`RangeValues.merge` join the segments' instances
(:func:`crc32_combine` for CRC32, sums for the value statistics).  SHA-256 of the whole file is
serial (:class:`Sha256`); the manifest's chunk digests are per chunk (:class:`ChunkSha256`).
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import zlib
from typing import Dict, Iterable, List, Tuple

from .values import _BLOCK, buffer_stats, itemsize


class Sha256:
    """SHA-256 of every byte fed (fed in file order from offset 0)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.nbytes = 0

    def feed(self, off: int, view) -> None:
        self.h.update(view)
        self.nbytes += len(view)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


class Progress:
    """Tells a progress writer (:mod:`ckptaudit.progress`) how many bytes were fed; safe to feed from threads."""

    def __init__(self, writer) -> None:
        self.writer = writer
        self._lock = threading.Lock()

    def feed(self, off: int, view) -> None:
        with self._lock:
            self.writer.add(len(view))


class ChunkSha256:
    """SHA-256 of each ``chunk_bytes`` slice of the bytes fed from ``start`` (a chunk boundary) on."""

    def __init__(self, chunk_bytes: int, start: int = 0) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self.first = start // chunk_bytes
        self.digests: List[str] = []
        self._h, self._left = hashlib.sha256(), chunk_bytes

    def feed(self, off: int, view) -> None:
        i = 0
        while i < len(view):
            k = min(self._left, len(view) - i)
            self._h.update(view[i:i + k])
            i += k
            self._left -= k
            if not self._left:
                self.digests.append(self._h.hexdigest())
                self._h, self._left = hashlib.sha256(), self.chunk_bytes

    def finish(self) -> List[str]:
        """The digests, the last (shorter) chunk included; call once, after the last feed."""
        if self._left != self.chunk_bytes:
            self.digests.append(self._h.hexdigest())
            self._left = self.chunk_bytes
        return self.digests


def _gf2_times(mat: List[int], vec: int) -> int:
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat: List[int]) -> List[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32 of ``A + B`` from ``crc1`` = CRC32(A), ``crc2`` = CRC32(B) and ``len2`` = len(B) in bytes
    (zlib's ``crc32_combine``: the CRC register advanced over ``len2`` zero bytes by GF(2) matrix squaring)."""
    if len2 <= 0:
        return crc1
    op = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    for _ in range(3):
        op = _gf2_square(op)  # ... for 2, 4, then 8 zero bits: one zero byte
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
        if len2:
            op = _gf2_square(op)
    return crc1 ^ crc2


class _Ranges:
    """Byte ranges ``(key, start, length)`` of the file; :meth:`feed` hands each the part of a buffer inside it."""

    def __init__(self, ranges: Iterable[Tuple]) -> None:
        self.ranges = sorted(ranges, key=lambda r: (r[1], r[2]))
        self._starts = [r[1] for r in self.ranges]
        self._ends_max = 0
        self._active: List[int] = []
        self._next = 0

    def feed(self, off: int, view) -> None:
        end = off + len(view)
        if self._next < len(self.ranges) and self.ranges[self._next][1] < off:  # a segment: skip what ended before
            self._next = bisect.bisect_left(self._starts, off)
            self._active = [i for i in range(self._next) if self.ranges[i][1] + self.ranges[i][2] > off]
        while self._next < len(self.ranges) and self.ranges[self._next][1] < end:
            self._active.append(self._next)
            self._next += 1
        still = []
        for i in self._active:
            r = self.ranges[i]
            a, b = max(r[1], off), min(r[1] + r[2], end)
            if a < b:
                self._piece(i, a, view[a - off:b - off])
            if r[1] + r[2] > end:
                still.append(i)
        self._active = still

    def _piece(self, i: int, at: int, piece) -> None:
        raise NotImplementedError


class RangeCrc32(_Ranges):
    """CRC32 of each range ``(key, start, length)``: ``results()`` is {key: (crc32, bytes seen)}."""

    def __init__(self, ranges: Iterable[Tuple[object, int, int]]) -> None:
        super().__init__(ranges)
        self._parts: Dict[int, List[List[int]]] = {}  # range index -> [[start, crc, length], ...] (contiguous runs)

    def _piece(self, i: int, at: int, piece) -> None:
        runs = self._parts.setdefault(i, [])
        if runs and runs[-1][0] + runs[-1][2] == at:
            runs[-1][1] = zlib.crc32(piece, runs[-1][1])
            runs[-1][2] += len(piece)
        else:
            runs.append([at, zlib.crc32(piece), len(piece)])

    def merge(self, other: "RangeCrc32") -> "RangeCrc32":
        """Take the pieces ``other`` (fed another segment of the same file, same ranges) computed."""
        for i, runs in other._parts.items():
            self._parts.setdefault(i, []).extend(runs)
        return self

    def results(self) -> Dict[object, Tuple[int, int]]:
        out = {}
        for i, r in enumerate(self.ranges):
            runs = sorted(self._parts.get(i, []))
            crc, seen, at = 0, 0, r[1]
            for start, c, n in runs:
                if start != at:
                    break  # a hole: only the bytes up to it count
                crc, seen, at = crc32_combine(crc, c, n), seen + n, at + n
            out[r[0]] = (crc, seen)
        return out


#: Bytes of one value-statistics call (a multiple of every dtype's block of ``values._BLOCK`` elements).
_STATS_BYTES = 1 << 20


class RangeValues(_Ranges):
    """Value statistics of each range ``(key, start, nbytes, dtype)`` read as elements of ``dtype``:
    ``results()`` is {key: (non-finite count, Σx² of the finite values, bytes seen)}.

    Bytes are summed in blocks of ``values._BLOCK`` elements from the range's start (the float32 dot
    products of :func:`ckptaudit.onepass.values._sum_squares`, so the sums equal a scan of the tensor
    alone); a block split between two buffers (or segments) is kept as fragments and counted when whole."""

    def __init__(self, ranges: Iterable[Tuple[object, int, int, str]]) -> None:
        super().__init__(ranges)
        self._bad: Dict[int, int] = {}
        self._sq: Dict[int, float] = {}
        self._seen: Dict[int, int] = {}
        self._frag: Dict[Tuple[int, int], Dict[int, bytes]] = {}  # (range, element start) -> {offset: bytes}

    def _add(self, i: int, buf, dtype: str) -> None:
        bad, sq = 0, 0.0
        for k in range(0, len(buf), _STATS_BYTES):  # numpy temporaries of 1 MiB, not of the whole buffer
            b, q = buffer_stats(buf[k:k + _STATS_BYTES], dtype)
            bad, sq = bad + b, sq + q
        self._bad[i] = self._bad.get(i, 0) + bad
        self._sq[i] = self._sq.get(i, 0.0) + sq

    def _piece(self, i: int, at: int, piece) -> None:
        _, start, _, dtype = self.ranges[i]
        item = _BLOCK * itemsize(dtype)  # whole float32 blocks, as the state stage's own scan sums them
        self._seen[i] = self._seen.get(i, 0) + len(piece)
        end = at + len(piece)
        first = start + -(-(at - start) // item) * item  # first element boundary at or after the piece start
        last = start + ((end - start) // item) * item  # last element boundary at or before its end
        if first > last:  # the piece lies inside one element
            self._fragment(i, last, at, bytes(piece), item, dtype)
            return
        if first > at:
            self._fragment(i, first - item, at, bytes(piece[:first - at]), item, dtype)
        if last > first:
            self._add(i, piece[first - at:last - at], dtype)
        if end > last:
            self._fragment(i, last, last, bytes(piece[last - at:]), item, dtype)

    def _fragment(self, i: int, elem: int, at: int, data: bytes, item: int, dtype: str) -> None:
        frags = self._frag.setdefault((i, elem), {})
        frags[at] = data
        _, start, nbytes, _ = self.ranges[i]
        if sum(len(b) for b in frags.values()) == min(item, start + nbytes - elem):
            whole = b"".join(frags[k] for k in sorted(frags))
            del self._frag[(i, elem)]
            self._add(i, whole, dtype)

    def merge(self, other: "RangeValues") -> "RangeValues":
        """Take the statistics and fragments ``other`` (fed another segment, same ranges) computed."""
        for i in other._seen:
            self._seen[i] = self._seen.get(i, 0) + other._seen[i]
            self._bad[i] = self._bad.get(i, 0) + other._bad.get(i, 0)
            self._sq[i] = self._sq.get(i, 0.0) + other._sq.get(i, 0.0)
        for (i, elem), frags in other._frag.items():
            dtype = self.ranges[i][3]
            for at, data in frags.items():
                self._fragment(i, elem, at, data, _BLOCK * itemsize(dtype), dtype)
        return self

    def results(self) -> Dict[object, Tuple[int, float, int]]:
        return {r[0]: (self._bad.get(i, 0), self._sq.get(i, 0.0), self._seen.get(i, 0))
                for i, r in enumerate(self.ranges)}


def split_points(size: int, n: int, align: int) -> List[Tuple[int, int]]:
    """``n`` contiguous segments ``(start, end)`` covering ``[0, size)``, boundaries on multiples of ``align``."""
    step = max(align, -(-size // max(n, 1) // align) * align) if size else align
    return [(s, min(s + step, size)) for s in range(0, size, step)] or [(0, 0)]
