"""Which whole-file digest the hash stage computes, by what it is for (issue 45: "hash by purpose").

- **SHA-256** only for a file something can check it against: a ``.sha256``/``.sha256sum`` sidecar, a manifest
  entry without usable chunk digests (``ckptaudit.manifest/1``, or ``/2`` whose chunks do not fit), Megatron-Core's
  ``integrity.json``; and everywhere at :data:`ckptaudit.fs.read_depth.SEAL` (``ckptaudit seal``, which writes SHA-256
  sidecars and manifests and refuses a file whose bytes changed since its audit hashed them).
- **The audit's own record** of every other file is :data:`FAST_DIGEST` (BLAKE3), computed in the same one pass
  (:mod:`ckptaudit.onepass`).  Nothing in the run records it, so it finds no damage by itself (the CRC-32 of every
  zip record does, in the same pass); it is kept for the next audit into the same output folder, which compares
  it with the digest it computes then (:func:`ckptaudit.verification.reverify.changed_since_last_audit`: bit rot with size and
  mtime kept), and it is the digest a ``--reuse`` audit keeps for the files it does not read again.

Why BLAKE3 (the ``blake3`` package, already a dependency for the manifests' chunk digests,
:mod:`ckptaudit.formats.chunk_digest`) and not xxh3-128: it is a cryptographic hash, so a digest recorded by one audit
cannot be matched by bytes someone chose, at ~2–4 × SHA-256's rate on one core here (BENCHMARKS.md, "hash by
purpose": ``benchmarks/bench_digest.py``), and it splits one buffer over threads (:data:`FAST_DIGEST_THREADS`).
At :data:`ckptaudit.fs.read_depth.CHECKED_DIGESTS_ONLY` (the reader at a resume) a file with nothing to check its
digest against gets none at all.
"""

from __future__ import annotations

from typing import Optional

#: The audit's own whole-file digest of a file that nothing records a digest of (a key of
#: :data:`ckptaudit.formats.chunk_digest.FIELDS`).
FAST_DIGEST = "blake3"
#: Threads one :data:`FAST_DIGEST` hasher splits each 8 MiB buffer over (-1: every core).  The hash stage passes
#: several files at once (``onepass.at_once.PASSES_AT_ONCE``), so a part of many files keeps every core busy either way;
#: one big file gets them all.  Measured on this project's 2-core VM at load 11–12 (3 GiB ``torch.save`` files,
#: the pass with BLAKE3 and its other consumers, 3 interleaved rounds; docs/benchmarks-history.md, "hash by
#: purpose"): the same CPU with 1 thread and with -1 (one file 1.42–1.45 against 1.46–1.52 CPU-s, three at once
#: 4.6–5.0 against 4.5–5.1), and less wall with -1 (one file 2.0–3.8 s against 3.7–9.3, three 6.1–9.7 against
#: 11.0–15.2): the second thread costs no CPU and finishes sooner, so -1 stays.
FAST_DIGEST_THREADS = -1
#: The SHA-256's name (a key of :data:`ckptaudit.formats.chunk_digest.FIELDS`): the digest sidecars, manifests and
#: ``integrity.json`` record.
SHA256 = "sha256"

def whole_file_digest(recorded: bool, depth=None) -> Optional[str]:
    """The whole-file digest to compute for a file: :data:`SHA256` when ``recorded`` (a sidecar, a manifest entry
    without usable chunk digests or an ``integrity.json`` records its SHA-256) or at a ``depth``
    (:class:`ckptaudit.fs.read_depth.ReadDepth`; default ``FULL``) with ``all_sha256`` (``ckptaudit seal``); else
    :data:`FAST_DIGEST`, or None at a depth without ``unchecked_digests`` (the reader)."""
    from ..fs import read_depth

    depth = read_depth.FULL if depth is None else depth
    if recorded or depth.all_sha256:
        return SHA256
    return FAST_DIGEST if depth.unchecked_digests else None
