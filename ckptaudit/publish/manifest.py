"""The unit manifest (``ckptaudit.manifest/1``), its sidecars, and the record of one published file.

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
from ..hashing import sha256_range
from .clock import _Clock
from .names import _O_CLOEXEC, DEFAULT_CHUNK_BYTES, SCHEMA


def sidecar_text(sha256_hex: str, file_name: str) -> str:
    """One ``sha256sum`` line: ``<64 hex>  <name>\\n``."""
    return f"{sha256_hex}  {file_name}\n"


def _versions() -> Dict[str, str]:
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


def _jsonable(obj: Any) -> Any:
    """``obj`` round-tripped through JSON, with anything JSON cannot hold as ``str``."""
    return json.loads(json.dumps(obj, default=str))


def manifest_bytes(doc: Dict[str, Any]) -> bytes:
    """Manifest JSON with ``schema`` first (the inventory recognises it from 64 bytes)."""
    ordered = {"schema": SCHEMA, **{k: v for k, v in doc.items() if k != "schema"}}
    return (json.dumps(ordered, indent=1) + "\n").encode()


@dataclass
class FileRecord:
    """One published file.  ``path`` is relative to the manifest's folder (the unit folder,
    or the run folder for a file unit); sizes in bytes; ``rank`` is the writer's rank (-1: a
    file no rank registered, adopted by rank 0 at the commit, e.g. a DCP ``.metadata``)."""

    path: str
    size_bytes: int
    sha256_hex: str
    chunk_bytes: int
    chunk_sha256_hex: List[str]
    rank: int = 0


def hash_file(path: Path, rel: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, rank: int = 0,
              workers: Optional[int] = None) -> FileRecord:
    """Whole-file SHA-256 (streamed, this thread) and chunk digests (thread pool, all cores,
    concurrently) of an existing file.  Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        n = -(-size // chunk_bytes)
        with ThreadPoolExecutor(max_workers=max(1, min(n, workers or os.cpu_count() or 1))) as pool:
            futs = [pool.submit(sha256_range, fd, i * chunk_bytes, min(chunk_bytes, size - i * chunk_bytes))
                    for i in range(n)]
            full = sha256_range(fd, 0, size)
            chunks = [f.result() for f in futs]
    finally:
        os.close(fd)
    return FileRecord(rel, size, full, chunk_bytes, chunks, rank)


def _fsync_and_hash(path: Path, rel: str, chunk_bytes: int, rank: int, clock: _Clock) -> FileRecord:
    """fsync a file another writer made (``pub.path()``, a DCP ``.metadata``), then
    :func:`hash_file` it.  Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        with clock("fsync_seconds"):
            os.fsync(fd)
    finally:
        os.close(fd)
    return hash_file(path, rel, chunk_bytes, rank)
