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


def write(w, tensors: List[TensorBytes], metadata: Dict[str, str]) -> Dict[str, List[int]]:
    """Write the safetensors file of ``tensors`` (each with its ``key`` set) to writer ``w`` (``write(bytes)``);
    returns ``{key: [first, end]}``, where each tensor's bytes went (relative to the end of the header, counted
    as they were written) for :func:`check`.  Raises ``OSError`` when a source cannot be read, ``ValueError``
    when it is shorter than its tensor."""
    head = header_bytes(tensors, metadata)
    w.write(head)
    placed, pos = {}, 0
    for t in tensors:
        n = _copy(w, t)
        placed[t.key] = [pos, pos + n]
        pos += n
    return placed


def check(path: Path, tensors: List[TensorBytes], placed: Dict[str, List[int]]) -> None:
    """Reopen the written file ``path`` with safetensors' own reader (``safe_open``, which validates the header as
    ``safetensors.torch.load_file`` does before it reads a tensor: dtypes, shapes, offsets that tile the data
    and cover the file) and compare it with what was written: the same keys, and per key the safetensors dtype,
    the shape, and the offsets of the bytes written for it (``placed``, from :func:`write`).  That the bytes
    at those offsets are the bytes written is the publish protocol's check (``verify=True``: every chunk
    digest of the written stream re-read from the disk before the commit).  Header only, no torch import
    (which alone costs more than a small salvage).  Raises :class:`WrittenFileDiffers`."""
    from safetensors import safe_open

    want = {t.key: t for t in tensors}
    try:
        with safe_open(str(path), framework="np") as f:  # the framework is never used: no tensor is made
            keys = set(f.keys())
            if keys != set(want):
                raise WrittenFileDiffers(f"{path.name}: holds keys {sorted(keys - set(want))[:3]} not written, lacks "
                                         f"{sorted(set(want) - keys)[:3]}")
            for k, t in want.items():
                sl = f.get_slice(k)
                if sl.get_dtype() != SAFETENSORS_DTYPE[t.dtype] or list(sl.get_shape()) != list(t.shape):
                    raise WrittenFileDiffers(f"{path.name}: {k!r} reads back as {sl.get_dtype()} {sl.get_shape()}, "
                                             f"written as {SAFETENSORS_DTYPE[t.dtype]} {list(t.shape)}")
    except WrittenFileDiffers:
        raise
    except Exception as e:  # safetensors raises its own SafetensorError: the file does not open
        raise WrittenFileDiffers(f"{path.name}: does not open with safetensors ({type(e).__name__}: {e})") from e
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        head = json.loads(fh.read(n))
    for k in want:
        if list(head[k]["data_offsets"]) != placed[k]:
            raise WrittenFileDiffers(f"{path.name}: {k!r} is at data bytes {head[k]['data_offsets']}, its bytes were "
                                     f"written at {placed[k]}")


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
