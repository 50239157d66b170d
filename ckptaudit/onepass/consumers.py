"""The consumers of one pass: objects fed ``(offset, buffer)`` in file order, each computing one fact.

Every consumer has ``feed(offset, view)`` (``view``: the file's bytes from ``offset``) and a result;
none reads a file.  :class:`RangeCrc32` and :class:`RangeValues` also accept the buffers of one
byte range of the file only, so a big file may be split into segments fed by different threads:
:meth:`RangeCrc32.merge` and :meth:`RangeValues.merge` join the segments' instances
(:func:`~.crc32.crc32_combine` for CRC32, sums for the value statistics).  A digest of the whole file is
serial (:class:`Sha256`, :class:`FastDigest`); the manifest's chunk digests are per chunk (:class:`ChunkDigest`).
"""

from __future__ import annotations

import hashlib
import threading
from typing import Dict, Iterable, List, Optional, Tuple

from ..formats.chunk_digest import new_hasher
from ..formats.zip.crc32 import crc32, crc32_combine  # noqa: F401 - crc32_combine is part of this module's interface
from .nulruns import nul_runs
from .ranges import Ranges
from .values import VALUE_BLOCK, buffer_stats, itemsize


class Sha256:
    """SHA-256 of every byte fed (fed in file order from offset 0)."""

    #: Fed on the pass's thread pool while the reading thread feeds the other consumers (:mod:`.stream`).
    ON_POOL = True

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.nbytes = 0

    def feed(self, off: int, view) -> None:
        self.h.update(view)
        self.nbytes += len(view)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


class FastDigest(Sha256):
    """The audit's own digest of every byte fed (:data:`ckptaudit.formats.digest_purpose.FAST_DIGEST`, fed in file order
    from offset 0), hashed on up to ``threads`` threads (:data:`ckptaudit.formats.digest_purpose.FAST_DIGEST_THREADS`);
    fed and read as :class:`Sha256`."""

    def __init__(self, threads: Optional[int] = None) -> None:
        from ..formats.chunk_digest import new_hasher
        from ..formats.digest_purpose import FAST_DIGEST, FAST_DIGEST_THREADS

        self.algorithm = FAST_DIGEST
        self.h = new_hasher(FAST_DIGEST, FAST_DIGEST_THREADS if threads is None else threads)
        self.nbytes = 0


class Progress:
    """Tells a progress writer (:mod:`ckptaudit.stages.progress`) how many bytes were fed; safe to feed from threads."""

    def __init__(self, writer) -> None:
        self.writer = writer
        self._lock = threading.Lock()

    def feed(self, off: int, view) -> None:
        with self._lock:
            self.writer.add(len(view))


class ChunkDigest:
    """The digest (``algorithm``: :data:`ckptaudit.formats.chunk_digest.FIELDS`) of each ``chunk_bytes`` slice of the
    bytes fed from ``start`` (a chunk boundary) on."""

    ON_POOL = True  # as Sha256's

    def __init__(self, chunk_bytes: int, start: int = 0, algorithm: str = "sha256") -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.chunk_bytes, self.algorithm = chunk_bytes, algorithm
        self.first = start // chunk_bytes
        self.digests: List[str] = []
        self._h, self._left = new_hasher(algorithm), chunk_bytes

    def feed(self, off: int, view) -> None:
        i = 0
        while i < len(view):
            k = min(self._left, len(view) - i)
            self._h.update(view[i:i + k])
            i += k
            self._left -= k
            if not self._left:
                self.digests.append(self._h.hexdigest())
                self._h, self._left = new_hasher(self.algorithm), self.chunk_bytes

    def finish(self) -> List[str]:
        """The digests, the last (shorter) chunk included; call once, after the last feed."""
        if self._left != self.chunk_bytes:
            self.digests.append(self._h.hexdigest())
            self._left = self.chunk_bytes
        return self.digests


class RangeCrc32(Ranges):
    """CRC32 of each range ``(key, start, length)``: ``results()`` is {key: (crc32, bytes seen)}, ``arrays()``
    ``(crc32, bytes seen)`` int64 arrays; bytes seen: the contiguous bytes from the range's start."""

    def __init__(self, ranges=None, **cols) -> None:
        import numpy as np

        super().__init__(ranges, **cols)
        self._crc = np.zeros(self.n, np.int64)
        self._seen = np.zeros(self.n, np.int64)
        self._parts: Dict[int, List[List[int]]] = {}  # range index -> [[start, crc, length], ...] off the prefix

    def _piece(self, i: int, at: int, piece) -> None:
        seen = int(self._seen[i])
        if at == self._s[i] + seen and i not in self._parts:
            self._crc[i] = crc32(piece, int(self._crc[i]))
            self._seen[i] = seen + len(piece)
            return
        runs = self._parts.setdefault(i, [])
        if runs and runs[-1][0] + runs[-1][2] == at:
            runs[-1][1] = crc32(piece, runs[-1][1])
            runs[-1][2] += len(piece)
        else:
            runs.append([at, crc32(piece), len(piece)])

    def _runs(self, i: int) -> List[List[int]]:
        pre = [[self._s[i], int(self._crc[i]), int(self._seen[i])]] if self._seen[i] else []
        return pre + self._parts.get(i, [])

    def merge(self, other: "RangeCrc32") -> "RangeCrc32":
        """Take the pieces ``other`` (fed another segment of the same file, same ranges) computed."""
        import numpy as np

        for i in set(np.flatnonzero(other._seen).tolist()) | set(other._parts):
            self._parts.setdefault(i, []).extend(other._runs(i))
        return self

    def arrays(self):
        """``(crc32, bytes seen)`` per range, int64 arrays in range order."""
        crc, seen = self._crc.copy(), self._seen.copy()
        for i, extra in self._parts.items():
            if not extra:
                continue
            c, n, at = 0, 0, self._s[i]
            for start, cc, k in sorted(self._runs(i)):
                if start != at:
                    break  # a hole: only the bytes up to it count
                c, n, at = crc32_combine(c, cc, k), n + k, at + k
            crc[i], seen[i] = c, n
        return crc, seen

    def results(self) -> Dict[object, Tuple[int, int]]:
        crc, seen = self.arrays()
        return self._keyed(zip(crc.tolist(), seen.tolist()))


#: A piece of a range up to this many bytes is first searched for ``min_run`` NUL bytes with ``bytes.find`` (a
#: copy and a memchr-based search): a small file's records hold none, and numpy's word search costs ~10 µs of
#: calls per piece however short (issue 45: 72 records per small unit).
_FIND_BYTES = 64 << 10


class RangeNulRuns(Ranges):
    """The longest run of at least ``min_run`` NUL bytes inside each range ``(key, start, length)``: ``results()``
    is {key: (offset, length) or None}, ``arrays()`` ``(offset or -1, length or 0)``, the earliest of equal
    longest runs (as ``max`` over :func:`ckptaudit.formats.zeros.zero_runs` of the range gives).  Runs inside
    a piece are judged at once; runs touching a piece's edge are joined with their neighbours' (buffers and
    segments alike) at the end."""

    def __init__(self, ranges=None, min_run: int = 64, **cols) -> None:
        import numpy as np

        super().__init__(ranges, **cols)
        self.min_run = min_run
        self._nuls = b"\0" * min_run
        self._off = np.full(self.n, -1, np.int64)
        self._len = np.zeros(self.n, np.int64)
        self._edges: Dict[int, List[Tuple[int, int]]] = {}

    def _keep(self, i: int, off: int, n: int) -> None:
        b = int(self._len[i])
        if n >= self.min_run and (b == 0 or n > b or (n == b and off < self._off[i])):
            self._off[i], self._len[i] = off, n

    def _piece(self, i: int, at: int, piece) -> None:
        if i not in self._edges and piece[:1] != b"\0" and piece[-1:] != b"\0":  # no run goes on or ends here
            if len(piece) < self.min_run:  # too short to hold a run
                return
            if len(piece) <= _FIND_BYTES and self._nuls not in bytes(piece):  # holds no run it would keep
                return
        n = len(piece)
        for o, k in nul_runs(piece, self.min_run):
            if o == 0 or o + k == n:
                edges = self._edges.setdefault(i, [])
                if o == 0 and edges and edges[-1][0] + edges[-1][1] == at:  # fed in order: the run goes on
                    edges[-1] = (edges[-1][0], edges[-1][1] + k)
                else:
                    edges.append((at + o, k))
            else:
                self._keep(i, at + o, k)

    def _kept(self) -> Dict[int, List[Tuple[int, int]]]:
        """{range index: the runs judged so far}."""
        import numpy as np

        return {i: [(int(self._off[i]), int(self._len[i]))] for i in np.flatnonzero(self._len).tolist()}

    def merge(self, other: "RangeNulRuns") -> "RangeNulRuns":
        """Take the runs ``other`` (fed another segment of the same file, same ranges) found."""
        for i, runs in other._kept().items():
            for o, n in runs:
                self._keep(i, o, n)
        for i, e in other._edges.items():
            self._edges.setdefault(i, []).extend(e)
        return self

    def _join_edges(self) -> None:
        for i, edges in self._edges.items():
            cur = None
            for o, n in sorted(edges):
                if cur is not None and cur[0] + cur[1] == o:
                    cur = (cur[0], cur[1] + n)
                    continue
                if cur is not None:
                    self._keep(i, *cur)
                cur = (o, n)
            if cur is not None:
                self._keep(i, *cur)
        self._edges = {}

    def arrays(self):
        """``(offset, length)`` of each range's longest run, int64 arrays (-1, 0: none)."""
        self._join_edges()
        return self._off.copy(), self._len.copy()

    def results(self) -> Dict[object, Optional[Tuple[int, int]]]:
        off, n = self.arrays()
        return self._keyed((o, k) if k else None for o, k in zip(off.tolist(), n.tolist()))


#: Most NUL runs one range's facts list; past it (a sparse tensor file) the reader searches the bytes itself.
MAX_LISTED_NUL_RUNS = 10_000


class RangeAllNulRuns(RangeNulRuns):
    """Every run of at least ``min_run`` NUL bytes inside each range: ``results()`` is {key: [(offset, length),
    ...] in file order, or None when a range holds more than :data:`MAX_LISTED_NUL_RUNS` (the reader then looks
    itself)}; the list :func:`ckptaudit.formats.zeros.zero_runs` of that range gives (that search stays apart:
    the file layer imports no numpy, ``tests/test_formats.py``)."""

    def __init__(self, ranges: Iterable[Tuple[object, int, int]], min_run: int) -> None:
        self._all: Dict[int, List[Tuple[int, int]]] = {}
        super().__init__(ranges, min_run)

    def _keep(self, i: int, off: int, n: int) -> None:
        if n >= self.min_run:
            self._all.setdefault(i, []).append((off, n))

    def _kept(self) -> Dict[int, List[Tuple[int, int]]]:
        return self._all

    def results(self) -> Dict[object, Optional[List[Tuple[int, int]]]]:
        self._join_edges()
        out: Dict[object, Optional[List[Tuple[int, int]]]] = {}
        for i, key in enumerate(self.keys if self.keys is not None else range(self.n)):
            runs = sorted(self._all.get(i, []))
            out[key] = runs if len(runs) <= MAX_LISTED_NUL_RUNS else None
        return out


class KeepBytes(Ranges):
    """A copy of the bytes of each range ``(key, start, length)``: ``results()`` is ``[(offset, bytes), ...]``
    in file order, contiguous pieces joined (a range the feed did not wholly cover keeps what it saw)."""

    def __init__(self, ranges: Iterable[Tuple[object, int, int]]) -> None:
        super().__init__(ranges)
        self._got: List[Tuple[int, bytes]] = []

    def _piece(self, i: int, at: int, piece) -> None:
        self._got.append((at, bytes(piece)))

    def merge(self, other: "KeepBytes") -> "KeepBytes":
        """Take the bytes ``other`` (fed another segment of the same file, same ranges) kept."""
        self._got.extend(other._got)
        return self

    def results(self) -> List[Tuple[int, bytes]]:
        groups: List[Tuple[int, int, List[bytes]]] = []  # (start, end, pieces): each piece copied once more, joined
        for at, b in sorted(self._got, key=lambda x: x[0]):
            if groups and groups[-1][1] == at:
                groups[-1] = (groups[-1][0], at + len(b), groups[-1][2] + [b])
            else:
                groups.append((at, at + len(b), [b]))
        return [(start, b"".join(pieces)) for start, _end, pieces in groups]


#: Bytes of one value-statistics call (a multiple of every dtype's block of ``values._BLOCK`` elements).
_STATS_BYTES = 1 << 20
_ONE_BLOCK_F32 = VALUE_BLOCK * 4  #: bytes of a float32 range of one value block


class RangeValues(Ranges):
    """Value statistics of each range ``(key, start, nbytes, dtype)`` read as elements of ``dtype`` (or columns:
    ``starts``, ``lengths`` and ``dtypes``, codes into ``dtype_names``): ``results()`` is {key: (non-finite count,
    Σx² of the finite values, bytes seen)}, ``arrays()`` the same as three arrays.

    Bytes are summed in blocks of ``values._BLOCK`` elements from the range's start (the float32 dot
    products of :func:`ckptaudit.onepass.values._sum_squares`, so the sums equal a scan of the tensor
    alone); a block split between two buffers (or segments) is kept as fragments and counted when whole."""

    def __init__(self, ranges=None, *, dtypes=None, dtype_names=None, **cols) -> None:
        import numpy as np

        super().__init__(ranges, **cols)
        if ranges is not None:
            names = sorted({e[0] for e in self._extra_cols})
            code = {d: k for k, d in enumerate(names)}
            dtypes = np.array([code[e[0]] for e in self._extra_cols], dtype=np.int64)
            dtype_names = names
        self.dtype_names = list(dtype_names or [])
        self._code = memoryview(np.ascontiguousarray(dtypes if dtypes is not None else np.zeros(0), np.int64))
        self._bad = np.zeros(self.n, np.int64)
        self._sq = np.zeros(self.n, np.float64)
        self._seen = np.zeros(self.n, np.int64)
        self._frag: Dict[Tuple[int, int], Dict[int, bytes]] = {}  # (range, element start) -> {offset: bytes}

    def _dtype(self, i: int) -> str:
        return self.dtype_names[self._code[i]]

    def _add(self, i: int, buf, dtype: str) -> None:
        bad, sq = 0, 0.0
        # numpy temporaries of 1 MiB, not of the whole buffer; float32 makes none (the dot products read the
        # bytes in place), so its whole piece goes at once: the same blocks, fewer calls
        step = len(buf) if dtype == "float32" else _STATS_BYTES
        for k in range(0, len(buf), max(step, 1)):
            b, q = buffer_stats(buf[k:k + step], dtype)
            bad, sq = bad + b, sq + q
        self._bad[i] += bad
        self._sq[i] += sq

    def _piece(self, i: int, at: int, piece) -> None:
        start, dtype = self._s[i], self._dtype(i)
        if dtype == "float32" and at == start and len(piece) == self._n[i] <= _ONE_BLOCK_F32 and not len(piece) % 4:
            import numpy as np  # a small tensor whole: the dot product _blocks takes (a non-finite one: there)

            q = float(np.dot(f := np.frombuffer(piece, np.float32), f))
            if q == q and q not in (float("inf"), float("-inf")):
                self._seen[i] += len(piece)
                self._sq[i] += q
                return
        item = VALUE_BLOCK * itemsize(dtype)  # whole float32 blocks, as the state stage's own scan sums them
        self._seen[i] += len(piece)
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
        if end > last and end == start + self._n[i]:  # the range's last block, whole here: no fragment to keep
            self._add(i, piece[last - at:], dtype)
        elif end > last:
            self._fragment(i, last, last, bytes(piece[last - at:]), item, dtype)

    def _fragment(self, i: int, elem: int, at: int, data: bytes, item: int, dtype: str) -> None:
        frags = self._frag.setdefault((i, elem), {})
        frags[at] = data
        start, nbytes = self._s[i], self._n[i]
        if sum(len(b) for b in frags.values()) == min(item, start + nbytes - elem):
            whole = b"".join(frags[k] for k in sorted(frags))
            del self._frag[(i, elem)]
            self._add(i, whole, dtype)

    def merge(self, other: "RangeValues") -> "RangeValues":
        """Take the statistics and fragments ``other`` (fed another segment, same ranges) computed."""
        self._seen += other._seen
        self._bad += other._bad
        self._sq += other._sq
        for (i, elem), frags in other._frag.items():
            dtype = self._dtype(i)
            for at, data in frags.items():
                self._fragment(i, elem, at, data, VALUE_BLOCK * itemsize(dtype), dtype)
        return self

    def arrays(self):
        """``(non-finite count, Σx², bytes seen)`` per range, arrays in range order."""
        return self._bad.copy(), self._sq.copy(), self._seen.copy()

    def results(self) -> Dict[object, Tuple[int, float, int]]:
        bad, sq, seen = self.arrays()
        return self._keyed(zip(bad.tolist(), sq.tolist(), seen.tolist()))


def split_points(size: int, n: int, align: int) -> List[Tuple[int, int]]:
    """``n`` contiguous segments ``(start, end)`` covering ``[0, size)``, boundaries on multiples of ``align``."""
    step = max(align, -(-size // max(n, 1) // align) * align) if size else align
    return [(s, min(s + step, size)) for s in range(0, size, step)] or [(0, 0)]
