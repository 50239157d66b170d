"""The unit manifest (``ckptaudit.manifest/2``), its sidecars, and the record of one published file.

Formats: ``docs/publish-protocol.md`` ("Sidecars and manifest").
"""

from __future__ import annotations

import json
import os
import platform
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from .._version import __version__
from ..formats.chunk_digest import WRITTEN, digest_range
from .clock import Clock
from .names import O_CLOEXEC, DEFAULT_CHUNK_BYTES, SCHEMA


def sidecar_text(sha256_hex: str, file_name: str) -> str:
    """One ``sha256sum`` line: ``<64 hex>  <name>\\n``."""
    return f"{sha256_hex}  {file_name}\n"


def environment_versions() -> Dict[str, str]:
    """The manifest's ``versions``: Python, ckptaudit, the platform, and torch (loaded or installed)."""
    out = {"python": platform.python_version(), "ckptaudit": __version__, "platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
    else:
        try:
            import importlib.metadata as md

            out["torch"] = md.version("torch")
        except Exception:  # noqa: BLE001 - torch not installed: nothing to record
            pass
    return out


def jsonable(obj: Any) -> Any:
    """``obj`` round-tripped through JSON, with anything JSON cannot hold as ``str``."""
    return json.loads(json.dumps(obj, default=str))


def manifest_bytes(doc: Dict[str, Any]) -> bytes:
    """Manifest JSON with ``schema`` first (the inventory recognises it from 64 bytes)."""
    ordered = {"schema": SCHEMA, **{k: v for k, v in doc.items() if k != "schema"}}
    return (json.dumps(ordered, indent=1) + "\n").encode()


#: what a published file is for (the audit's vocabulary, :mod:`ckptaudit.roles`)
ROLES = ("weights", "optimizer", "scheduler", "scaler", "rng", "sampler", "custom", "trainer_state", "metadata",
         "mixed")


@dataclass
class FileRecord:
    """One published file.  ``path`` is relative to the manifest's folder (the unit folder,
    or the run folder for a file unit); sizes in bytes; ``rank`` is the writer's rank (-1: a
    file no rank registered, adopted by rank 0 at the commit, e.g. a DCP ``.metadata``);
    ``role`` what the file holds (one of :data:`ROLES`; "" when the writer did not say and
    the object was not seen, as for ``pub.open`` and ``pub.path`` files).  ``sha256_hex`` is the
    whole file's SHA-256; ``chunk_blake3_hex`` the BLAKE3 digest of each ``chunk_bytes`` slice
    (the last one shorter; :mod:`ckptaudit.formats.chunk_digest`)."""

    path: str
    size_bytes: int
    sha256_hex: str
    chunk_bytes: int
    chunk_blake3_hex: List[str]
    rank: int = 0
    role: str = ""


def object_role(obj: Any) -> str:
    """The role of an object about to be saved, by its structure: a mapping of tensors with a
    floating one is ``weights`` (a state_dict), of uint8 tensors ``rng``; an optimizer
    state_dict (``state`` + ``param_groups``) is ``optimizer``; an LR scheduler's (``last_epoch``
    + ``base_lrs``) ``scheduler``; a uint8 tensor (``torch.get_rng_state()``) ``rng``; anything
    else (a training dict of several components) ``mixed``."""
    torch = sys.modules.get("torch")
    if torch is None:
        return "mixed"
    if isinstance(obj, torch.Tensor):
        return "rng" if obj.dtype == torch.uint8 else "mixed"
    if not isinstance(obj, dict) or not obj:
        return "mixed"
    vals = list(obj.values())
    if all(isinstance(v, torch.Tensor) for v in vals):
        if any(v.is_floating_point() for v in vals):
            return "weights"
        return "rng" if all(v.dtype == torch.uint8 for v in vals) else "mixed"
    if "state" in obj and "param_groups" in obj and len(obj) == 2:
        return "optimizer"
    if "last_epoch" in obj and "base_lrs" in obj:
        return "scheduler"
    return "mixed"


def hash_file(path: Path, rel: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, rank: int = 0,
              workers: Optional[int] = None) -> FileRecord:
    """Whole-file SHA-256 (streamed, this thread) and BLAKE3 chunk digests (thread pool, all cores,
    concurrently) of an existing file.  Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        n = -(-size // chunk_bytes)
        with ThreadPoolExecutor(max_workers=max(1, min(n, workers or os.cpu_count() or 1))) as pool:
            futs = [pool.submit(digest_range, fd, i * chunk_bytes, min(chunk_bytes, size - i * chunk_bytes), WRITTEN)
                    for i in range(n)]
            full = digest_range(fd, 0, size, "sha256")
            chunks = [f.result() for f in futs]
    finally:
        os.close(fd)
    return FileRecord(rel, size, full, chunk_bytes, chunks, rank)


def fsync_and_hash(path: Path, rel: str, chunk_bytes: int, rank: int, clock: Clock) -> FileRecord:
    """fsync a file another writer made (``pub.path()``, a DCP ``.metadata``), then
    :func:`hash_file` it.  Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | O_CLOEXEC)
    try:
        with clock("fsync_seconds"):
            os.fsync(fd)
    finally:
        os.close(fd)
    return hash_file(path, rel, chunk_bytes, rank)
