"""The tensors of a damaged safetensors file, each with its proof.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and ``data_offsets`` (relative to the end of the header), then the bytes (safetensors
``docs/source/index.mdx``, "Format").  It has no checksum: without a manifest, a tensor whose bytes are all
in the file is at best *unproven*, one holding an all-zero 4 KiB page is *suspect* (a lost block reads back
as zeros), one past the end of a cut file is lost.  With a ``ckptaudit.manifest``, the chunk digests prove
or disprove each tensor's bytes, and those of the header: the header is every tensor's identity (name, dtype,
shape, offsets), so a tensor is intact only when the chunks holding the header verify too.  A header whose
chunk differs makes every tensor of the file lost (an F32 rewritten as I32, two tensors' offsets swapped:
their data chunks still verify).  Without chunk digests, a whole-file SHA-256 (sidecar, manifest entry) that
verifies proves every byte; one that differs proves nothing about any one tensor.
"""

from __future__ import annotations

import bisect
import json
import os
import struct
from typing import List, Optional, Tuple

from ..formats.safetensors_check import DTYPE_BITS, MAX_HEADER_BYTES, ST_DTYPES, valid_entries
from ..formats.zeros import zero_runs
from .proof import INTACT, LOST, SUSPECT, TORCH_DTYPE, UNPROVEN, FileProof, TensorBytes, row_major

#: a NUL run this long, aligned to it, inside an unproven tensor makes it suspect (one page / block)
ZERO_PAGE_BYTES = 4096


def tensors(path: str, file: str, proof: FileProof) -> Tuple[List[TensorBytes], str]:
    """``(tensors, problem)`` as :func:`ckptaudit.intact.torch_zip.tensors` does for a torch zip; tensors of a
    dtype no torch dtype holds as it is (F8_E8M0, F4, F6_*) are named in ``problem`` and not listed."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return [], "the file is shorter than the 8-byte header length"
        n = struct.unpack("<Q", head)[0]
        if n > MAX_HEADER_BYTES or 8 + n > size:
            return [], f"the header length {n} does not fit the file ({size} bytes)"
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            return [], f"the JSON header is damaged: {e}"
    if not isinstance(header, dict):
        return [], "the header is not a JSON object"
    base = 8 + n
    out: List[TensorBytes] = []
    pages = _ZeroPages(path, base, size)  # read only when a tensor is judged by its bytes alone
    head = proof.region(0, base)  # the header: every tensor's name, dtype, shape and offsets
    broken = _layout_problem(valid_entries(header))
    if broken:  # no writer writes this: the header changed, whatever a digest says of it
        head = (False, broken, "")
    odd = []
    for name, e in valid_entries(header):
        dtype = TORCH_DTYPE.get(e["dtype"]) or ST_DTYPES.get(e["dtype"])
        if dtype is None or DTYPE_BITS[e["dtype"]] % 8:
            odd.append(f"{name!r} ({e['dtype']})")
            continue
        b, en = e["data_offsets"]
        itemsize = DTYPE_BITS[e["dtype"]] // 8
        shape = tuple(e["shape"])
        stride = tuple(row_major(shape))
        t = TensorBytes(name=name, file=file, path=path, dtype=dtype, shape=shape, stride=stride,
                        offset=base + b, storage_offset=0, itemsize=itemsize, span=(base + b, base + en),
                        parts=(name,))
        t.status, t.proof = _judge(t, size, proof, head, pages)
        if t.status == INTACT:
            t.proven_by = {"identity": head[2], "bytes": proof.region(*t.span)[2]}
        out.append(t)
    problem = (f"{len(odd)} tensor(s) of a dtype salvage does not write are not listed: {', '.join(odd[:5])}"
               f"{', …' if len(odd) > 5 else ''}") if odd else ""
    return out, problem


def _layout_problem(entries) -> str:
    """Why the entries' offsets are not the layout every safetensors writer gives (each tensor's span exactly its
    dtype and shape's bytes, the spans tiling the data from 0 without gap or overlap: the Rust reader's
    ``Metadata::validate``), or ""."""
    spans = []
    for name, e in entries:
        b, en = e["data_offsets"]
        need = DTYPE_BITS[e["dtype"]] * _numel(e["shape"])
        if need % 8 or en < b or en - b != need // 8:
            return f"tensor {name!r} spans {en - b} bytes where its dtype and shape need {need / 8:g}"
        spans.append((b, en, name))
    pos = 0
    for b, en, name in sorted(spans):
        if b != pos:
            return f"tensor {name!r} starts at data byte {b}, where the one before ends at {pos}"
        pos = en
    return ""


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _judge(t: TensorBytes, size: int, proof: FileProof, head: Tuple[Optional[bool], str, str], pages
           ) -> Tuple[str, str]:
    """Status and words of tensor ``t``; ``head``: :meth:`FileProof.region` of the header's bytes."""
    if t.span[1] > size:
        return LOST, f"the file ends at byte {size}, before the tensor's end at byte {t.span[1]}"
    if head[0] is False:
        return LOST, (f"the header, which gives every tensor's name, dtype, shape and offsets, changed ({head[1]}): "
                      "no tensor of this file is proven")
    ok, words, _ = proof.region(*t.span)
    if ok is False:
        return LOST, words
    if ok and head[0]:
        return INTACT, (words if words == head[1] else f"{words}; header: {head[1]}")
    unproven = ("all its bytes are in the file, but nothing recorded at save time checks them (no manifest)"
                if not (words or head[1]) else
                f"not proven: header: {head[1] or 'nothing checks it'}; its bytes: {words or 'nothing checks them'}")
    page = pages.first_in(*t.span)
    if page is not None:
        return SUSPECT, (f"no checksum covers it (safetensors has none) and bytes {page} to "
                         f"{page + ZERO_PAGE_BYTES - 1} are an all-zero page, what a lost block reads back as"
                         + ("" if unproven.startswith("all its") else f"; {unproven}"))
    return UNPROVEN, unproven


class _ZeroPages:
    """The page-aligned all-zero ``ZERO_PAGE_BYTES`` blocks of a file's data area, from one pass of
    :func:`ckptaudit.formats.zeros.zero_runs` (made when first asked)."""

    def __init__(self, path: str, start: int, end: int):
        self.args, self.runs = (path, start, end), None

    def first_in(self, first: int, end: int) -> Optional[int]:
        """Offset of the first such block inside ``[first, end)``, else None."""
        if self.runs is None:
            path, start, stop = self.args
            self.runs = zero_runs(path, min_run=ZERO_PAGE_BYTES, start=start, end=stop)
            self.starts = [off for off, _ in self.runs]
        i = max(0, bisect.bisect_right(self.starts, first) - 1)
        for off, length in self.runs[i:]:
            if off >= end:
                break
            page = -(-max(off, first) // ZERO_PAGE_BYTES) * ZERO_PAGE_BYTES
            if page + ZERO_PAGE_BYTES <= min(off + length, end):
                return page
        return None
