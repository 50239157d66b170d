"""Runs of NUL bytes in a buffer, found a machine word at a time: the zero-span consumer's kernel.

A lost or unflushed block reads back as NUL bytes (:mod:`ckptaudit.formats.zeros`).  Looking for them
byte by byte costs more than the SHA-256 of the same bytes on zero-heavy data (a regex over a zeroed
tensor ran at 0.13 GiB/s here), so the buffer is read as little-endian 64-bit words: every NUL run of at
least 15 bytes holds a whole zero word, and a buffer without one (most float data: 12.5 GiB/s to tell)
only has short runs at its two edges.  A run of zero words is widened by the NUL bytes of its neighbour
words (their high bytes before it, low bytes after it), all with numpy.
"""

from __future__ import annotations

import re
from typing import List, Tuple

import numpy as np

_SHIFTS = [np.uint64(8 * k) for k in range(1, 8)]
_LOW_MASKS = [np.uint64((1 << (8 * k)) - 1) for k in range(1, 8)]


def _edge_nul(a: np.ndarray, from_end: bool) -> int:
    """NUL bytes at the start (or end) of byte array ``a``."""
    nz = np.flatnonzero(a[::-1] if from_end else a)
    return int(nz[0]) if nz.size else int(a.size)


#: Every NUL run at least this long holds a whole aligned 64-bit zero word, so the word search finds it.
WORD_RUN_BYTES = 15
_ANY_NUL_RUN = re.compile(rb"\x00+")


def nul_runs(view, min_run: int = WORD_RUN_BYTES) -> List[Tuple[int, int]]:
    """``(start, length)`` of maximal NUL runs of ``view`` (bytes-like), offsets from its start, in order: every
    run of at least ``min(min_run, 15)`` bytes and every run that touches the first or last byte (a shorter run
    holding a whole aligned zero word may be listed too; callers keep the runs of the length they look for).
    ``min_run`` under 15 lists every run, byte by byte (a regex: slow on zero-heavy data)."""
    if min_run < WORD_RUN_BYTES:
        return [(m.start(), m.end() - m.start()) for m in _ANY_NUL_RUN.finditer(view)]
    a = np.frombuffer(view, dtype=np.uint8)
    n = int(a.size)
    if n == 0:
        return []
    k = n // 8
    runs = _word_runs(view, a, k) if k else []
    if not runs or runs[0][0] != 0:
        lead = _edge_nul(a[:16], False)
        if lead:
            runs.insert(0, (0, lead))
    if runs[-1:] and runs[-1][0] + runs[-1][1] == n:
        return runs
    trail = _edge_nul(a[-16:], True)
    if trail:
        runs.append((n - trail, trail))
    return runs


def _word_runs(view, a: np.ndarray, k: int) -> List[Tuple[int, int]]:
    """The NUL runs holding at least one whole aligned zero word among the first ``k`` 64-bit words of
    ``view`` (``a``: its bytes), each widened by the NUL bytes of the words around it."""
    w = np.frombuffer(view, dtype="<u8", count=k)
    if w.min():  # no zero word (most float data): a reduction, no temporary (~2.5 x the rate of ``w == 0``)
        return []
    z = w == 0
    d = np.diff(z.view(np.int8), prepend=np.int8(0), append=np.int8(0))
    s = np.flatnonzero(d == 1)
    e = np.flatnonzero(d == -1)
    before = np.zeros(s.size, dtype=np.int64)  # NUL bytes at the end of the word before each run
    has = s > 0
    if has.any():
        pw = w[s[has] - 1]
        cnt = np.zeros(pw.size, dtype=np.int64)
        alive = np.ones(pw.size, dtype=bool)
        for sh in reversed(_SHIFTS):  # 56, 48, ... 8: the top k bytes are NUL while pw >> (64 - 8k) == 0
            alive &= (pw >> sh) == 0
            cnt += alive
        before[has] = cnt
    after = np.zeros(e.size, dtype=np.int64)  # NUL bytes at the start of the word after each run
    inside = e < k
    if inside.any():
        nw = w[e[inside]]
        cnt = np.zeros(nw.size, dtype=np.int64)
        alive = np.ones(nw.size, dtype=bool)
        for m in _LOW_MASKS:
            alive &= (nw & m) == 0
            cnt += alive
        after[inside] = cnt
    if (~inside).any():  # a run of words reaching the last whole word: widened into the tail bytes
        after[~inside] = _edge_nul(a[8 * k:], False)
    starts = 8 * s - before
    ends = 8 * e + after
    return list(zip(starts.tolist(), (ends - starts).tolist()))
