"""The demo's checkpoint writer: deterministic ``torch.save`` bytes, written atomically with a sha256sum sidecar."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path
from typing import Any, Dict, Union

import torch

PathLike = Union[str, Path]


def _canonical(obj: Any) -> Any:
    """Copy of the containers of ``obj`` with every str interned (tensors are kept as is).

    Pickle memoizes by object identity, so without this the same checkpoint pickles to
    different bytes depending on whether, say, the ``"weight_decay"`` key of an optimizer
    param group is the same object as the config's (a fresh run) or one read back by
    ``torch.load`` (a resumed run)."""
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        out = type(obj)((_canonical(k), _canonical(v)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)  # state_dict()'s per-module version info
        if meta is not None:
            out._metadata = _canonical(meta)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_canonical(v) for v in obj)
    return obj


def serialize(ckpt: Dict[str, Any]) -> bytes:
    """``torch.save`` bytes of ``ckpt``, identical for equal checkpoints (see
    :func:`_canonical`).  Saved through a buffer, so the zip's record prefix is
    ``archive/`` whatever the file is later called (torch names it after the file's stem
    when given a path)."""
    buf = io.BytesIO()
    torch.save(_canonical(ckpt), buf)
    return buf.getvalue()


def save_checkpoint(ckpt: Dict[str, Any], path: PathLike) -> None:
    """Well-behaved write: bytes to ``<path>.tmp``, fsync, ``os.replace`` onto ``path``,
    fsync the folder, then the ``sha256sum``-format sidecar ``<path>.sha256``
    (``<64 hex>  <basename>\\n``), itself written the same way."""
    path = Path(path)
    data = serialize(ckpt)
    _atomic_write(path, data)
    digest = hashlib.sha256(data).hexdigest()
    _atomic_write(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n".encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
