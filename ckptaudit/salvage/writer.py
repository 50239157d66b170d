"""Write salvaged tensors as a safetensors file, streamed: the header first, then each tensor's bytes read
from its source file in 4 MiB pieces (memory: one piece, or one tensor for a strided view).

The format (safetensors ``docs/source/index.mdx``): an unsigned little-endian 64-bit header length, the JSON
header (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, offsets
relative to the end of the header, padded with spaces to a multiple of 8 as the library does), then the
tensors' bytes in header order.  The writer is the publish protocol's (:meth:`ckptaudit.publish.Publication.open`):
hashed while written, fsynced, with a sidecar and a manifest entry.  ``safetensors.torch.load_file`` reads the
result (tested).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Dict, List

from ..intact.proof import SAFETENSORS_DTYPE, TensorBytes

_PIECE = 4 << 20


def header_bytes(tensors: List[TensorBytes], metadata: Dict[str, str]) -> bytes:
    """The length prefix and JSON header for ``tensors`` (in that order), padded to a multiple of 8."""
    head: Dict[str, object] = {"__metadata__": metadata}
    pos = 0
    for t in tensors:
        head[t.name] = {"dtype": SAFETENSORS_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [pos, pos + t.nbytes]}
        pos += t.nbytes
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write(w, tensors: List[TensorBytes], metadata: Dict[str, str]) -> int:
    """Write the safetensors file of ``tensors`` to writer ``w`` (``write(bytes)``); returns the bytes written.
    Raises ``OSError`` when a source cannot be read, ``ValueError`` when it is shorter than its tensor."""
    head = header_bytes(tensors, metadata)
    w.write(head)
    total = len(head)
    for t in tensors:
        total += _copy(w, t)
    return total


def _copy(w, t: TensorBytes) -> int:
    if t.load is not None:
        data = t.load()
        if len(data) != t.nbytes:
            raise ValueError(f"{t.file}: tensor {t.name!r} assembled to {len(data)} bytes, not {t.nbytes}")
        w.write(data)
        return len(data)
    fd = os.open(t.path, os.O_RDONLY)
    try:
        if t.contiguous():
            done, first = 0, t.span[0]
            while done < t.nbytes:
                piece = os.pread(fd, min(_PIECE, t.nbytes - done), first + done)
                if not piece:
                    raise ValueError(f"{t.file}: ends inside tensor {t.name!r}")
                w.write(piece)
                done += len(piece)
            return done
        raw = os.pread(fd, t.span[1] - t.span[0], t.span[0])
    finally:
        os.close(fd)
    if len(raw) != t.span[1] - t.span[0]:
        raise ValueError(f"{t.file}: ends inside tensor {t.name!r}")
    import torch

    flat = torch.frombuffer(bytearray(raw), dtype=getattr(torch, t.dtype))
    data = flat.as_strided(t.shape, t.stride, 0).contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    w.write(data)
    return len(data)
