"""The spans of a safetensors header's tensors in the data buffer, checked over arrays (issue 45).

The same findings, with the same words, as the dict path of :mod:`ckptaudit.formats.safetensors_check`
(``_offset_findings``, ``_truncated``, ``_suspicious_zero_runs``), over the columns of a well-formed header
(:class:`ckptaudit.formats.safetensors_columns.HeaderColumns`, every entry valid): the entries sorted by
``(begin, end, name)``, and numpy masks where the dict path loops over one tuple per tensor.  Memory: a few
int64 arrays of the entries' length.
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Tuple

from .. import findings
from ..findings import Finding
from . import zeros

__all__ = ["sorted_order", "offset_findings", "truncated", "zero_run_findings"]


def offset_invalid(shown: str, tensor: str, offsets: List[int], why: str) -> Finding:
    """``safetensors_offsets_invalid``: ``tensor``'s ``data_offsets`` ``offsets`` ([begin, end] bytes into the data
    buffer) break the format's rule ``why`` (the header's dict path and its column path both report through here)."""
    return findings.make("safetensors_offsets_invalid", path=shown, tensor=tensor, offsets=offsets, why=why)


def truncated_in_data(display: str, data_len: int, present: int, text: str, whole: int, n: int) -> Finding:
    """``truncated_in_data``: ``present`` of the data buffer's ``data_len`` bytes are in the file; ``whole`` of the
    ``n`` tensors lie wholly inside it (``text`` says so, and where the cut falls)."""
    return findings.make("truncated_in_data", path=display, missing_bytes=data_len - present,
                         expected_bytes=data_len, intact_text=text, n_tensors_intact=whole, n_tensors=n)


def sorted_order(cols) -> "np.ndarray":  # noqa: F821
    """Indices (int64) of the entries of ``cols`` sorted by ``(begin, end, name)``, as the dict path sorts them."""
    import numpy as np

    b, e = _arrays(cols)
    order = np.lexsort((e, b))
    if len(order) > 1:
        bo, eo = b[order], e[order]
        tie = (bo[1:] == bo[:-1]) & (eo[1:] == eo[:-1])
        if tie.any():  # equal spans (an overlap): by name, as the dict path's tuples compare
            starts = np.flatnonzero(np.r_[True, ~tie])
            ends = np.r_[starts[1:], len(order)]
            for a, z in zip(starts.tolist(), ends.tolist()):
                if z - a > 1:
                    order[a:z] = sorted(order[a:z].tolist(), key=cols.name)
    return order


def offset_findings(cols, order, shown: str, limit: int, span_problem: Callable) -> Tuple[List[Finding], int]:
    """``(findings, data_len)``: at most ``limit`` ``safetensors_offsets_invalid`` findings, in sorted order, and
    the end of the data buffer the header describes (bytes); ``span_problem`` words each (the dict path's)."""
    import numpy as np

    if not len(order):
        return [], 0
    b, e = (x[order] for x in _arrays(cols))
    need = np.frombuffer(cols.need_bytes, np.int64)[order]
    expected = np.zeros(len(order), np.int64)
    expected[1:] = np.maximum(np.maximum.accumulate(e)[:-1], 0)
    bad = (e < b) | (b != expected) | (need != e - b)
    out: List[Finding] = []
    for i in np.flatnonzero(bad)[:limit].tolist():
        k = int(order[i])
        prev = cols.name(int(order[i - 1])) if i else None
        problem = span_problem(cols.entry(k), int(b[i]), int(e[i]), int(expected[i]), prev)
        if problem:
            out.append(offset_invalid(shown, cols.name(k), [int(b[i]), int(e[i])], problem))
    return out, max(int(e.max()), 0)


def truncated(cols, order, display: str, present: int, data_len: int) -> Finding:
    """``truncated_in_data``: the data buffer holds ``present`` of its ``data_len`` bytes."""
    import numpy as np

    b, e = (x[order] for x in _arrays(cols))
    whole = int(np.count_nonzero(e <= present))
    cut = np.flatnonzero((b <= present) & (present < e))
    text = f"{whole} of {len(order)} tensors lie wholly inside the file"
    if len(cut):
        i = int(cut[0])
        text += (f"; the cut falls inside {cols.name(int(order[i]))!r} after {present - int(b[i])} of its "
                 f"{int(e[i]) - int(b[i])} bytes (data byte {present})")
    text += "."
    return truncated_in_data(display, data_len, present, text, whole, len(order))


def zero_run_findings(cols, order, display: str, runs: Iterable[Tuple[int, int]], data_start: int,
                      data_len: int, min_edge: int) -> List[Finding]:
    """Zeroed spans and tails among ``runs`` (``(file offset, length)`` of NUL runs in the data buffer) that a
    legitimate save cannot explain; the rule is the dict path's ``_suspicious_zero_runs`` (``min_edge``: its
    ``MIN_ZERO_EDGE_BYTES``, bytes)."""
    import numpy as np

    b, e = (x[order] for x in _arrays(cols))
    keep = e > b
    sb, se, idx = b[keep], e[keep], order[keep]
    out: List[Finding] = []
    file_end = data_start + data_len
    for off, length in runs:
        rb, re_ = off - data_start, off - data_start + length
        touched = np.flatnonzero((sb < re_) & (se > rb))
        if len(touched) < 2:
            continue
        f, z = int(touched[0]), int(touched[-1])
        starts_inside = rb > sb[f] and se[f] - rb >= min_edge
        to_eof = off + length >= file_end
        ends_inside = re_ < se[z] and re_ - sb[z] >= min_edge
        if not starts_inside or not (ends_inside or to_eof):
            continue
        first, last = cols.name(int(idx[f])), cols.name(int(idx[z]))
        member = f"tensors {first!r}..{last!r}" if len(touched) > 2 else f"tensors {first!r} and {last!r}"
        out.append(zeros.tail(display, length, off, member=member) if to_eof else zeros.span(display, length, off,
                                                                                             member))
    return out


def _arrays(cols) -> Tuple["np.ndarray", "np.ndarray"]:  # noqa: F821
    import numpy as np

    return np.frombuffer(cols.begin, np.int64), np.frombuffer(cols.end, np.int64)
