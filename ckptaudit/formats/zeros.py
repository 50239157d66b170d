"""NUL runs where data should be: finding them in a file's bytes, and the one builder of each zero-fill finding.

A lost or unflushed block reads back as NUL bytes.  The checkers decide when such a run is damage
rather than a legitimately zero tensor and ask this module for the finding, so each kind is built in
one place:

* a zeroed head (:func:`head`, at least :data:`MIN_HEAD_BYTES`): :func:`.sniff.generic_findings` for
  unknown bytes, :func:`.safetensors_check.check_safetensors` for a header length of 0 and
  :func:`.torchzip.check_zip` for a file that is not a zip by its first bytes;
* a zeroed span (:func:`span`): ``safetensors_check._suspicious_zero_runs`` (a run across a tensor
  boundary) and ``torchzip._check_with_cd`` (the longest run inside a record that fails its CRC);
* a zeroed tail (:func:`tail`): ``safetensors_check._suspicious_zero_runs`` (such a run reaching EOF)
  and ``torchzip._check_without_cd`` (``zip.cut.decide_tail``: NULs where later records must be).

Every builder takes ``display``, the path the finding names (the file as it sits in the run folder).
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Tuple

from .. import findings, fs
from ..findings import Finding

#: Leading NUL bytes from which a file whose format cannot be told is reported as zero-filled, bytes.
MIN_HEAD_BYTES = 64


def head(display: str, zero_bytes: Optional[int], size_bytes: int) -> List[Finding]:
    """``[zero_filled_head]`` when the file starts with at least :data:`MIN_HEAD_BYTES` NUL bytes
    (``zero_bytes``, sniff's ``zero_head_bytes``; None or 0 for none), else ``[]``."""
    zh = zero_bytes or 0
    if zh < MIN_HEAD_BYTES:
        return []
    return [findings.make("zero_filled_head", path=display, zero_bytes=zh, size_bytes=size_bytes)]


def span(display: str, zero_bytes: int, offset: int, member: str) -> Finding:
    """``zero_filled_span``: ``zero_bytes`` NULs from byte ``offset`` inside ``member`` (a record or tensors)."""
    return findings.make("zero_filled_span", path=display, zero_bytes=zero_bytes, offset=offset, member=member)


def tail(display: str, zero_bytes: int, offset: int, **context: Any) -> Finding:
    """``zero_filled_tail``: the last ``zero_bytes`` bytes, from ``offset``, are NUL.  ``context`` is kept in the
    detail (safetensors: ``member``; a cut zip: ``intact_text`` and ``evidence``)."""
    return findings.make("zero_filled_tail", path=display, zero_bytes=zero_bytes, offset=offset, **context)


_NONZERO = re.compile(rb"[^\x00]")


def zero_runs(path, *, min_run: int = 64, chunk: int = 1 << 20, start: int = 0,
              end: int | None = None, kept=None) -> List[Tuple[int, int]]:
    """``(offset, length)`` of every run of NUL bytes of at least ``min_run`` bytes.

    Streams ``[start, end)`` of the file (default: all of it) in ``chunk``-byte
    reads; memory stays O(chunk) plus the result list.  Runs that cross chunk
    borders are joined.  Offsets and lengths are in bytes.  Inside a chunk the
    search is ``bytes.find`` of ``min_run`` NULs (C speed), then a regex for the
    run's first non-NUL byte.  ``kept``: bytes of a remote object already read
    (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory.
    """
    path = fs.fspath(path)
    runs: List[Tuple[int, int]] = []
    min_run = max(1, int(min_run))
    needle = b"\0" * min_run
    with fs.open_binary(path, block_size=fs.STREAM_BLOCK_BYTES, kept=kept) as f:
        size = fs.size(path)
        stop = size if end is None else min(end, size)
        pos = max(0, start)
        f.seek(pos)
        cur_start = -1  # start of a run still open at the end of the previous chunk
        while pos < stop:
            b = f.read(min(chunk, stop - pos))
            if not b:
                break
            cur_start = _chunk_runs(b, pos, cur_start, min_run, needle, runs)
            pos += len(b)
        if cur_start >= 0:
            length = pos - cur_start
            if length >= min_run:
                runs.append((cur_start, length))
    return runs


def _chunk_runs(b: bytes, pos: int, cur_start: int, min_run: int, needle: bytes,
                runs: List[Tuple[int, int]]) -> int:
    """Append to ``runs`` the NUL runs of chunk ``b`` (file offset ``pos``) that end inside it, joining the one
    open since ``cur_start`` (-1: none); return where a run still open at the chunk's end began (-1: none)."""
    n = len(b)
    i = 0
    if cur_start >= 0:
        m = _NONZERO.search(b)
        if m is None:
            return cur_start
        i = m.start()
        if pos + i - cur_start >= min_run:
            runs.append((cur_start, pos + i - cur_start))
    while True:
        j = b.find(needle, i) if n - i >= min_run else -1
        if j < 0:
            break
        m = _NONZERO.search(b, j + min_run)
        if m is None:
            return pos + j  # runs to the end of the chunk: may continue
        runs.append((pos + j, m.start() - j))
        i = m.start()
    if i < n and b[-1] == 0:
        # a shorter NUL tail that may grow into a run in the next chunk
        k = n - len(b.rstrip(b"\0"))
        if k < min_run:
            return pos + n - k
    return -1
