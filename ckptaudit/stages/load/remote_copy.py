"""The load test's copy of a remote object: every byte but its tensor data, so torch or safetensors can build the
object tree without downloading the tensors (whose bytes the hash stage's pass and the CRC check have read).

:func:`with_tensor_data` attaches to a unit the ranges the hash stage's pass found to hold only tensor data
(from its :class:`ckptaudit.onepass.facts.ByteFacts`), so the load, wherever it runs (the audit's load server
gets the unit as data), need not plan the file again; :func:`skeleton` writes the sparse copy.
"""

from __future__ import annotations

import os

from ... import fs


def with_tensor_data(u: dict, run_dir, rel: str, facts) -> dict:
    """``u`` with ``tensor_data[rel]``: the ``[offset, length]`` ranges of remote file ``rel`` that hold only
    tensor data, as the hash stage's pass found them in ``facts`` (:class:`ckptaudit.onepass.facts.ByteFacts`),
    for :func:`skeleton` wherever the load runs (the load server gets ``u`` as data); ``u`` itself when they
    are not known."""
    ranges = None if facts is None else facts.tensor_data_of(fs.fspath(run_dir / rel))
    if ranges is None:
        return u
    return {**u, "tensor_data": {**(u.get("tensor_data") or {}), rel: [list(r) for r in ranges]}}


def skeleton(src, kind: str, scratch: str, limit: int, tensor_data=None, kept=None):
    """A local sparse copy of remote ``src`` with every byte but its tensor data (those are holes: zeros), for a
    ``torch.load(mmap=True)`` or ``safe_open`` that builds the object tree without touching tensor data (whose
    bytes the hash stage's pass and the CRC check have read); the path, or None when ``src`` cannot be planned
    (then it is downloaded whole) or the bytes to fetch exceed ``limit``.  ``kept``: the bytes of ``src`` the
    pass kept (:class:`ckptaudit.fs.kept.KeptBytes`, or None), served instead of fetched."""
    from ...onepass.plan import plan_file, skeleton_ranges

    if kind not in ("torch_zip", "safetensors"):
        return None
    tensor_data = [tuple(r) for r in tensor_data] if tensor_data is not None else None  # the pass's, else planned
    if tensor_data is None:
        tensor_data = plan_file(src, kept=kept).tensor_data
    if not tensor_data:
        return None
    size = fs.size(src)
    ranges = skeleton_ranges(size, tensor_data)
    if sum(n for _, n in ranges) > limit:
        return None
    blobs = fs.read_ranges(src, ranges, purpose="streamed", kept=kept) if ranges else []  # the load test's copy
    if any(b is None or len(b) != n for b, (_, n) in zip(blobs, ranges)):
        return None
    local = os.path.join(scratch, fs.path(src).name)
    with open(local, "wb") as f:
        f.truncate(size)
        for (off, _), b in zip(ranges, blobs):
            f.seek(off)
            f.write(b)
    return local


__all__ = ["with_tensor_data", "skeleton"]
