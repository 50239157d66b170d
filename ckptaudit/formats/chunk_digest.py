"""The chunk digests of a ckptaudit manifest: which hash an entry's chunks use, and hashing a file's chunks.

A manifest entry (:mod:`ckptaudit.publish.manifest`) records the whole file's SHA-256 (``sha256_hex``, the
same digest as its ``.sha256`` sidecar, which ``sha256sum -c`` checks) and one digest of each
``chunk_bytes``-sized slice (the last one shorter), so a mismatch can name the damaged byte range and a
reader can verify one big file on every core.  Which hash the chunks use is told by the entry's key:

- ``chunk_blake3_hex``: BLAKE3 (``ckptaudit.manifest/2``, what :mod:`ckptaudit.publish` and ``seal`` write).
  BLAKE3 is a cryptographic hash (BLAKE3 specification, https://github.com/BLAKE3-team/BLAKE3-specs) that the
  ``blake3`` package computes ~3.6 × faster than hashlib's SHA-256 on one core of this project's machines
  (144 against 520 ms per GiB, SHA-NI present; BENCHMARKS.md, issue 23).  The writer hashes every byte it
  writes twice (the whole-file SHA-256 and its chunk), so this halves what the second pass costs it.
- ``chunk_sha256_hex``: SHA-256 (``ckptaudit.manifest/1``); still read and verified.

An entry with neither (or with digests that do not fit its size) is verified by the whole-file SHA-256.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional, Tuple

import blake3

from .. import fs

#: The hash a writer uses for new manifests' chunk digests.
WRITTEN = "blake3"
#: {hash name: the manifest entry key of its chunk digests}, in the order :func:`entry_chunks` looks.
FIELDS = {"blake3": "chunk_blake3_hex", "sha256": "chunk_sha256_hex"}
#: each algorithm as a sentence names it
SAID = {"blake3": "BLAKE3", "sha256": "SHA-256"}

_READ_BYTES = 4 << 20  # read buffer of one chunk-hashing task (bytes)


def new_hasher(algorithm: str, threads: int = 1):
    """A fresh hasher of ``algorithm`` (a key of :data:`FIELDS`) with ``update``, ``hexdigest`` and ``copy``.
    Both hashes release the GIL while they hash a large buffer, so chunks hash in parallel on threads; a BLAKE3
    hasher also splits one large buffer over up to ``threads`` threads (-1: every core; SHA-256 is serial).
    Raises ``ValueError`` for another name."""
    if algorithm == "blake3":
        return blake3.blake3(max_threads=blake3.blake3.AUTO if threads < 0 else max(1, threads))
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown chunk digest {algorithm!r}; known: {', '.join(FIELDS)}")


def entry_chunks(entry: Optional[dict], size: int) -> Optional[Tuple[str, List[str]]]:
    """``(hash name, hex digests)`` of a manifest entry's chunk digests when they are usable for a file of
    ``size`` bytes (a positive ``chunk_bytes``, the entry's ``size_bytes`` equal to ``size``, one string per
    chunk), else None."""
    if not entry:
        return None
    cb = entry.get("chunk_bytes")
    if not isinstance(cb, int) or cb <= 0 or entry.get("size_bytes") != size:
        return None
    for algorithm, key in FIELDS.items():
        digests = entry.get(key)
        if isinstance(digests, list):
            ok = len(digests) == -(-size // cb) and all(isinstance(d, str) for d in digests)
            return (algorithm, [d.lower() for d in digests]) if ok else None
    return None


def damaged_ranges(bad: List[int], chunk_bytes: int, size: int) -> List[Tuple[int, int, List[int]]]:
    """Damaged chunk indexes ``bad`` of a file of ``size`` bytes in ``chunk_bytes`` chunks, merged into runs
    ``(first byte, end byte exclusive, chunk indexes)``."""
    runs: List[Tuple[int, int, List[int]]] = []
    for i in sorted(bad):
        if runs and runs[-1][2][-1] == i - 1:
            runs[-1][2].append(i)
            runs[-1] = (runs[-1][0], min((i + 1) * chunk_bytes, size), runs[-1][2])
        else:
            runs.append((i * chunk_bytes, min((i + 1) * chunk_bytes, size), [i]))
    return runs


def digest_range(fd: int, offset: int, length: int, algorithm: str = "sha256") -> str:
    """Hex digest (``algorithm``, a key of :data:`FIELDS`) of ``length`` bytes of open file ``fd`` from
    ``offset`` (bytes).

    Uses ``os.preadv`` (positional, so threads may share ``fd``) into a 4 MiB buffer: memory stays constant
    whatever ``length``.  Raises ``OSError``; a file shorter than ``offset + length`` hashes only the bytes
    that are there."""
    h = new_hasher(algorithm)
    buf = bytearray(min(_READ_BYTES, max(length, 1)))
    view = memoryview(buf)
    done = 0
    while done < length:
        want = min(len(buf), length - done)
        n = os.preadv(fd, [view[:want]], offset + done)
        if n == 0:
            break
        h.update(view[:n])
        done += n
    return h.hexdigest()


def chunk_digests(path: str | Path, chunk_bytes: int, algorithm: str = WRITTEN,
                  workers: Optional[int] = None) -> List[str]:
    """Hex digest (``algorithm``) of each ``chunk_bytes``-sized slice of ``path`` (the last may be shorter;
    ``[]`` for an empty file), hashed in parallel on ``workers`` threads (default: all cores).  Raises
    ``OSError``, and ``ValueError`` for ``chunk_bytes`` < 1 or an unknown ``algorithm``."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    new_hasher(algorithm)  # the ValueError before any read
    if fs.is_remote(path):  # object storage: one streamed pass, one digest per chunk
        return _remote_chunk_digests(path, chunk_bytes, algorithm)
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        n = -(-size // chunk_bytes)
        if n <= 1:
            return [digest_range(fd, 0, size, algorithm)] if n else []
        with ThreadPoolExecutor(max_workers=min(n, workers or os.cpu_count() or 1)) as pool:
            return list(pool.map(lambda i: digest_range(fd, i * chunk_bytes, min(chunk_bytes, size - i * chunk_bytes),
                                                        algorithm), range(n)))
    finally:
        os.close(fd)


def _remote_chunk_digests(path: str, chunk_bytes: int, algorithm: str) -> List[str]:
    out: List[str] = []
    with fs.open_binary(path, block_size=fs.STREAM_BLOCK_BYTES) as fh:
        while True:
            h, left = new_hasher(algorithm), chunk_bytes
            while left:
                b = fh.read(min(left, _READ_BYTES))
                if not b:
                    break
                h.update(b)
                left -= len(b)
            if left == chunk_bytes:
                return out
            out.append(h.hexdigest())
            if left:
                return out
