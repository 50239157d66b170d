"""Byte ranges of one file, fed buffer by buffer in file order: the base of the range consumers of a pass.

A subclass (:class:`~.consumers.RangeCrc32`, :class:`~.consumers.RangeNulRuns`, :class:`~.consumers.KeepBytes`,
:class:`~.consumers.RangeValues`) says what it does with each piece of a buffer that falls inside one of its
ranges (``_piece``); this class finds those pieces in time linear in buffers plus ranges.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple


class Ranges:
    """Byte ranges of the file; :meth:`feed` hands each the part of a buffer inside it.

    ``ranges``: ``(key, start, length, ...)`` tuples (``results()`` is then keyed by ``key``), or None with
    ``starts`` and ``lengths`` given as int64 arrays sorted by start then length (``arrays()`` then gives the
    results row for row, no Python object per range: what a file of a million tensors needs).  Per-range
    state lives in numpy arrays; only pieces that do not continue a range's prefix (segments fed by other
    threads, a block split between buffers) are kept as Python objects, a few per buffer."""

    def __init__(self, ranges: Optional[Iterable[Tuple]] = None, *, starts=None, lengths=None) -> None:
        import numpy as np

        if ranges is not None:
            rs = sorted(ranges, key=lambda r: (r[1], r[2]))
            self.keys: Optional[List] = [r[0] for r in rs]
            self._extra_cols = [r[3:] for r in rs]
            starts = np.array([r[1] for r in rs], dtype=np.int64)
            lengths = np.array([r[2] for r in rs], dtype=np.int64)
        else:
            self.keys, self._extra_cols = None, None
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        self.n = len(self.starts)
        self._s = memoryview(self.starts)  # indexing a memoryview gives a Python int, fast
        self._n = memoryview(self.lengths)
        self._active: List[int] = []
        self._next = 0

    def feed(self, off: int, view) -> None:
        import numpy as np

        end = off + len(view)
        s, ln = self._s, self._n
        if self._next < self.n and s[self._next] < off:  # a segment: skip what ended before
            self._next = int(np.searchsorted(self.starts, off, side="left"))
            ends = self.starts[:self._next] + self.lengths[:self._next]
            self._active = np.flatnonzero(ends > off).tolist()
        while self._next < self.n and s[self._next] < end:
            self._active.append(self._next)
            self._next += 1
        still = []
        for i in self._active:
            r0, r1 = s[i], s[i] + ln[i]
            a, b = max(r0, off), min(r1, end)
            if a < b:
                self._piece(i, a, view[a - off:b - off])
            if r1 > end:
                still.append(i)
        self._active = still

    def _piece(self, i: int, at: int, piece) -> None:
        raise NotImplementedError

    def _keyed(self, rows) -> Dict:
        keys = self.keys if self.keys is not None else range(self.n)
        return dict(zip(keys, rows))
