"""The tensors of a damaged safetensors file, each with its proof.

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and ``data_offsets`` (relative to the end of the header), then the bytes (safetensors
``docs/source/index.mdx``, "Format").  It has no checksum: without a manifest, a tensor whose bytes are all
in the file is at best *unproven*, one holding an all-zero 4 KiB page is *suspect* (a lost block reads back
as zeros), one past the end of a cut file is lost.  With a ``ckptaudit.manifest``, the chunk digests prove
or disprove each tensor's bytes.
"""

from __future__ import annotations

import bisect
import json
import os
import struct
from typing import List, Optional, Tuple

from ..formats.safetensors_check import DTYPE_BITS, MAX_HEADER_BYTES, ST_DTYPES, valid_entries
from ..formats.zeros import zero_runs
from .proof import INTACT, LOST, SUSPECT, UNPROVEN, ChunkProof, TensorBytes, row_major

#: a NUL run this long, aligned to it, inside an unproven tensor makes it suspect (one page / block)
ZERO_PAGE_BYTES = 4096


def tensors(path: str, file: str, chunks: Optional[ChunkProof]) -> Tuple[List[TensorBytes], str]:
    """``(tensors, problem)`` as :func:`ckptaudit.intact.torch_zip.tensors` does for a torch zip."""
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
    for name, e in valid_entries(header):
        dtype = ST_DTYPES.get(e["dtype"])
        if dtype is None or DTYPE_BITS[e["dtype"]] % 8:
            continue  # sub-byte and unnamed dtypes are not written back (nor counted)
        b, en = e["data_offsets"]
        itemsize = DTYPE_BITS[e["dtype"]] // 8
        shape = tuple(e["shape"])
        stride = tuple(row_major(shape))
        t = TensorBytes(name=name, file=file, path=path, dtype=dtype, shape=shape, stride=stride,
                        offset=base + b, storage_offset=0, itemsize=itemsize, span=(base + b, base + en))
        t.status, t.proof = _judge(t, size, chunks, pages)
        out.append(t)
    return out, ""


def _judge(t: TensorBytes, size: int, chunks: Optional[ChunkProof], pages) -> Tuple[str, str]:
    if t.span[1] > size:
        return LOST, f"the file ends at byte {size}, before the tensor's end at byte {t.span[1]}"
    if chunks is not None:
        ok, words = chunks.span(*t.span)
        if ok is not None:
            return (INTACT if ok else LOST), words
    page = pages.first_in(*t.span)
    if page is not None:
        return SUSPECT, (f"no checksum covers it (safetensors has none) and bytes {page} to "
                         f"{page + ZERO_PAGE_BYTES - 1} are an all-zero page, what a lost block reads back as")
    return UNPROVEN, "all its bytes are in the file, but nothing recorded at save time checks them (no manifest)"


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
