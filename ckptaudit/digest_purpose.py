"""Which whole-file digest the hash stage computes, by what it is for (issue 45: "hash by purpose").

- **SHA-256** only for a file something can check it against: a ``.sha256``/``.sha256sum`` sidecar, a manifest
  entry without usable chunk digests (``ckptaudit.manifest/1``, or ``/2`` whose chunks do not fit), Megatron-Core's
  ``integrity.json``; and everywhere inside :func:`sha256_everywhere` (``ckptaudit seal``, which writes SHA-256
  sidecars and manifests and refuses a file whose bytes changed since its audit hashed them).
- **The audit's own record** of every other file is :data:`FAST_DIGEST` (BLAKE3), computed in the same one pass
  (:mod:`ckptaudit.onepass`).  Nothing in the run records it, so it finds no damage by itself (the CRC-32 of every
  zip record does, in the same pass); it is kept for the next audit into the same output folder, which compares
  it with the digest it computes then (:func:`ckptaudit.reverify.changed_since_last_audit`: bit rot with size and
  mtime kept), and it is the digest a ``--reuse`` audit keeps for the files it does not read again.

Why BLAKE3 (the ``blake3`` package, already a dependency for the manifests' chunk digests,
:mod:`ckptaudit.chunk_digest`) and not xxh3-128: it is a cryptographic hash, so a digest recorded by one audit
cannot be matched by bytes someone chose, at ~2–4 × SHA-256's rate on one core here (BENCHMARKS.md, "hash by
purpose": ``benchmarks/bench_digest.py``), and it splits one buffer over threads (:data:`FAST_DIGEST_THREADS`).
Inside ``ckptaudit.read_depth.checked_digests_only`` (the reader at a resume) a file with nothing to check its
digest against gets none at all.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

#: The audit's own whole-file digest of a file that nothing records a digest of (a key of
#: :data:`ckptaudit.chunk_digest.FIELDS`).
FAST_DIGEST = "blake3"
#: Threads one :data:`FAST_DIGEST` hasher splits each 8 MiB buffer over (-1: every core).  The hash stage passes
#: several files at once (``hashing.PASSES_AT_ONCE``), so a part of many files keeps every core busy either way;
#: one big file gets them all.
FAST_DIGEST_THREADS = -1
#: The SHA-256's name (a key of :data:`ckptaudit.chunk_digest.FIELDS`): the digest sidecars, manifests and
#: ``integrity.json`` record.
SHA256 = "sha256"

_SHA256_EVERYWHERE: contextvars.ContextVar[bool] = contextvars.ContextVar("ckptaudit_sha256_everywhere",
                                                                          default=False)


@contextlib.contextmanager
def sha256_everywhere() -> Iterator[None]:
    """Within the block (``with sha256_everywhere():``, this thread and the hash stage's pool threads), every file
    gets a SHA-256, recorded or not: what ``ckptaudit seal`` needs to write sidecars of the audited bytes."""
    token = _SHA256_EVERYWHERE.set(True)
    try:
        yield
    finally:
        _SHA256_EVERYWHERE.reset(token)


def whole_file_digest(recorded: bool) -> Optional[str]:
    """The whole-file digest to compute for a file: :data:`SHA256` when ``recorded`` (a sidecar, a manifest entry
    without usable chunk digests or an ``integrity.json`` records its SHA-256) or inside :func:`sha256_everywhere`;
    else :data:`FAST_DIGEST`, or None inside ``ckptaudit.read_depth.checked_digests_only`` (the reader)."""
    from . import read_depth

    if recorded or _SHA256_EVERYWHERE.get():
        return SHA256
    return FAST_DIGEST if read_depth.unchecked_digests() else None
