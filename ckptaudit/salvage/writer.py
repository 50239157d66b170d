"""Write salvaged tensors as a safetensors file, streamed: the header first, then each tensor's bytes read
from its source file in 4 MiB pieces (memory: one piece, or one tensor for a strided view).

The format (safetensors ``docs/source/index.mdx``): an unsigned little-endian 64-bit header length, the JSON
header (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}``, offsets
relative to the end of the header, padded with spaces to a multiple of 8 as the library does), then the
tensors' bytes in header order.  The writer is the publish protocol's (:meth:`ckptaudit.publish.Publication.open`):
hashed while written, fsynced, with a sidecar and a manifest entry.  Each tensor is written under its ``key``
(:mod:`.keys`); :func:`check` reopens the written file with safetensors' own reader, the one
``safetensors.torch.load_file`` uses, and compares its keys, dtypes, shapes and each tensor's bytes with what
was written, before the folder is published.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Dict, List

from ..intact.proof import SAFETENSORS_DTYPE, TensorBytes, strided_bytes

_PIECE = 4 << 20


class WrittenFileDiffers(RuntimeError):
    """A salvaged file read back is not what was written (a bug or a failing disk): the folder is not published."""


def header_bytes(tensors: List[TensorBytes], metadata: Dict[str, str]) -> bytes:
    """The length prefix and JSON header for ``tensors`` (in that order), padded to a multiple of 8."""
    head: Dict[str, object] = {"__metadata__": metadata}
    pos = 0
    for t in tensors:
        head[t.key] = {"dtype": SAFETENSORS_DTYPE[t.dtype], "shape": list(t.shape),
                        "data_offsets": [pos, pos + t.nbytes]}
        pos += t.nbytes
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write(w, tensors: List[TensorBytes], metadata: Dict[str, str]) -> Dict[str, str]:
    """Write the safetensors file of ``tensors`` (each with its ``key`` set) to writer ``w`` (``write(bytes)``);
    returns ``{key: BLAKE2b hex of the tensor's bytes as written}`` for :func:`check`.  Raises ``OSError`` when
    a source cannot be read, ``ValueError`` when it is shorter than its tensor."""
    head = header_bytes(tensors, metadata)
    w.write(head)
    digests = {}
    for t in tensors:
        h = hashlib.blake2b(digest_size=16)
        _copy(_Tee(w, h), t)
        digests[t.key] = h.hexdigest()
    return digests


def check(path: Path, tensors: List[TensorBytes], digests: Dict[str, str]) -> None:
    """Reopen the written file ``path`` with safetensors' reader (``safe_open``, what
    ``safetensors.torch.load_file`` calls for each key; memory: one tensor at a time) and compare it with what
    was written: the same keys, and per key the dtype, shape and bytes.  Raises :class:`WrittenFileDiffers`."""
    import torch
    from safetensors import safe_open

    want = {t.key: t for t in tensors}
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            if keys != set(want):
                raise WrittenFileDiffers(f"{path.name}: holds keys {sorted(keys - set(want))[:3]} not written, lacks "
                                         f"{sorted(set(want) - keys)[:3]}")
            for k, t in want.items():
                x = f.get_tensor(k)
                if str(x.dtype).removeprefix("torch.") != t.dtype or tuple(x.shape) != tuple(t.shape):
                    raise WrittenFileDiffers(f"{path.name}: {k!r} reads back as {x.dtype} {list(x.shape)}, written "
                                             f"as {t.dtype} {list(t.shape)}")
                flat = torch.empty(x.numel(), dtype=x.dtype).copy_(x.reshape(-1))  # stride 1, whatever x's were
                raw = flat.view(torch.uint8).numpy().tobytes() if x.numel() else b""
                if hashlib.blake2b(raw, digest_size=16).hexdigest() != digests[k]:
                    raise WrittenFileDiffers(f"{path.name}: the bytes of {k!r} read back differ from those written")
    except WrittenFileDiffers:
        raise
    except Exception as e:  # safetensors raises its own SafetensorError: the file does not open
        raise WrittenFileDiffers(f"{path.name}: does not open with safetensors ({type(e).__name__}: {e})") from e


class _Tee:
    """A writer that also feeds what it writes to a hash."""

    def __init__(self, w, h):
        self.w, self.h = w, h

    def write(self, b) -> None:
        self.h.update(b)
        self.w.write(b)


def _copy(w, t: TensorBytes) -> int:
    if t.nbytes == 0:
        return 0
    if t.load is not None:
        data = t.load()
        if len(data) != t.nbytes:
            raise ValueError(f"{t.file}: tensor {t.name!r} assembled to {len(data)} bytes, not {t.nbytes}")
        w.write(data)
        return len(data)
    if t.span[0] < 0 or t.span[1] < t.span[0]:
        raise ValueError(f"{t.file}: tensor {t.name!r} has no place in the file (bytes {list(t.span)})")
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
    data = strided_bytes(raw, t.shape, t.stride, t.itemsize)
    w.write(data)
    return len(data)
