"""The demo's checkpoint writer: deterministic ``torch.save`` bytes, written atomically with a sha256sum sidecar."""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path
from typing import Any, Dict, Union

import torch

from .._io import atomic_write

PathLike = Union[str, Path]


def canonical(obj: Any) -> Any:
    """Copy of the containers of ``obj`` with every str interned (tensors are kept as is).

    Pickle memoizes by object identity, so without this the same checkpoint pickles to
    different bytes depending on whether, say, the ``"weight_decay"`` key of an optimizer
    param group is the same object as the config's (a fresh run) or one read back by
    ``torch.load`` (a resumed run)."""
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        out = type(obj)((canonical(k), canonical(v)) for k, v in obj.items())
        meta = getattr(obj, "_metadata", None)  # state_dict()'s per-module version info
        if meta is not None:
            out._metadata = canonical(meta)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(canonical(v) for v in obj)
    return obj


def serialize(ckpt: Dict[str, Any]) -> bytes:
    """``torch.save`` bytes of ``ckpt``, identical for equal checkpoints (see
    :func:`canonical`).  Saved through a buffer, so the zip's record prefix is
    ``archive/`` whatever the file is later called (torch names it after the file's stem
    when given a path)."""
    buf = io.BytesIO()
    torch.save(canonical(ckpt), buf)
    return buf.getvalue()


def save_checkpoint(ckpt: Dict[str, Any], path: PathLike) -> None:
    """Well-behaved write (:func:`ckptaudit._io.atomic_write`, durable): bytes to a temporary
    name beside ``path``, fsync, ``os.replace`` onto ``path``, fsync the folder, then the ``sha256sum``-format sidecar ``<path>.sha256``
    (``<64 hex>  <basename>\\n``), itself written the same way."""
    path = Path(path)
    data = serialize(ckpt)
    atomic_write(path, data, durable=True)
    digest = hashlib.sha256(data).hexdigest()
    atomic_write(path.with_name(path.name + ".sha256"), f"{digest}  {path.name}\n".encode(), durable=True)

