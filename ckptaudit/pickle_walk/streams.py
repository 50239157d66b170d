"""Entry points: walk one pickle stream, or every stream stored back to back in a buffer."""

from __future__ import annotations

import io
from typing import Any, List, Optional

from .budgets import MAX_OPS, MAX_STREAMS
from .machine import WalkState
from .model import WalkResult
from .reader import MVReader

def walk(data: bytes | bytearray | memoryview, start: int = 0, *, max_ops: int = MAX_OPS,
         persistent: str = "torch", tensor_paths: bool = True, _depth: int = 0,
         _budget: Optional[List[int]] = None) -> WalkResult:
    """Interpret the pickle that starts at byte ``start`` of ``data``, symbolically.

    Returns a :class:`WalkResult`; never raises on bad input (``error`` is set
    and everything built so far is kept: pending ``SETITEMS``/``APPENDS``
    frames of a cut-short pickle are folded into their containers, so a
    truncated checkpoint still names the tensors it got to).  ``end`` is the
    offset just after ``STOP`` (or where the walk stopped).  ``max_ops`` bounds
    the number of opcodes of this pickle, and :data:`MAX_WALK_BLOCKS` the
    objects it may hold (nested pickles found in bytes payloads share what is
    left; nesting stops 4 levels deep).  When either runs out the result has
    ``budget_exhausted`` and ``error`` set, and the rest of the stream is
    scanned for imports only (up to :data:`MAX_IMPORT_SCAN_OPS` opcodes, no
    objects built), so a payload hidden behind padding is still named;
    ``imports_end`` says how far that got.  ``persistent="torch"``
    decodes torch storage persistent ids into :class:`StorageRef`;
    ``"raw"`` keeps every persistent id as a :class:`PersistentRef`.
    ``tensor_paths=False``: ``tensors`` lists every tensor built, in the order built, each named ``""`` (for a
    caller that wants the tensors' storages and sizes alone: no path string per tensor is made).

    The caller guarantees nothing about the bytes (random input is fine); a
    memoryview must be contiguous.  ``start`` outside ``data`` is an error
    result too.
    """
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if not 0 <= start <= size:
        return WalkResult(obj=None, end=start, error=f"start offset {start} is outside the {size}-byte buffer")
    if isinstance(data, memoryview):
        if data.obj is not None and type(data.obj) is bytes and data.format == "B" and data.contiguous \
                and len(data) == len(data.obj):
            data = data.obj
            f: Any = io.BytesIO(data)
            f.seek(start)
        else:
            f = MVReader(data, start)
            data = f.mv
    else:
        f = io.BytesIO(data)
        f.seek(start)
    res = WalkResult(obj=None, end=start)
    state = WalkState(res, data, persistent, _depth, max_ops, _budget, walker=walk)
    state.tensor_paths = tensor_paths
    state.run(f, start)
    return res


def walk_streams(data: bytes | bytearray | memoryview, first: Optional[WalkResult] = None, *,
                 max_streams: int = MAX_STREAMS, max_ops: int = MAX_OPS,
                 persistent: str = "torch") -> List[WalkResult]:
    """Walk every pickle stream stored back to back in ``data``, from byte 0 (``first``: the
    caller's walk of the first stream, not walked again).

    ``pickle.load`` in a loop (and torch's legacy ``_legacy_load``, which reads
    five pickles) runs each of them, so each is walked: after one stream's
    ``STOP`` the next byte starts another stream when it is a protocol header
    (``\\x80`` + 0..5) or a protocol-0/1 opcode that can open a pickle.  The
    walk stops at the first stream that fails, at ``max_streams``, and after the
    fifth stream of a legacy torch layout (second stream = 1001), whose
    storage bytes follow.  The streams share one ``max_ops`` budget.
    """
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    out: List[WalkResult] = []
    pos = 0
    limit = max_streams
    if first is not None:
        out.append(first)
        if first.error or first.end <= 0:
            return out
        pos = first.end
    while pos < size and len(out) < limit:
        if out and not _stream_start(data, pos, size):
            break
        left = max_ops - sum(r.n_ops for r in out)
        if left <= 0:
            break
        r = walk(data, pos, max_ops=left, persistent=persistent)
        out.append(r)
        if r.error or r.end <= pos:
            break
        pos = r.end
        if len(out) == 2 and type(out[1].obj) is int and out[1].obj == 1001:
            limit = min(limit, 5)  # legacy torch.save: magic, 1001, sys info, object, keys, then raw bytes
    return out


_P0_STARTS = frozenset(b"(cIL}])NSVFdltiopgGJKMXUBCT\x8c\x8a")


def _stream_start(data: Any, pos: int, size: int) -> bool:
    b0 = data[pos]
    if b0 == 0x80:
        return pos + 1 < size and data[pos + 1] <= 5
    return b0 in _P0_STARTS
