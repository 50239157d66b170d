"""How deep the file layer reads: every byte (the audit), or a file's metadata only (the reader's run pass).

:func:`ckptaudit.safe_load_checkpoint` judges the run as the audit does, but reads tensor bytes only of the
units it had to examine (:mod:`ckptaudit.newest_first`).  Older units still take part in the run-level
judgements (step continuity, scheduler cadence, a unit written after a newer one), which read their
metadata: the zip central directory and local headers, data.pkl and its static walk, a safetensors
header, JSON files.  Inside :func:`metadata_only` the checks that stream tensor data are off: the CRC32
of every zip record (:func:`ckptaudit.formats.torchzip.check_zip`) and the search for zeroed blocks in a
safetensors data buffer (:func:`ckptaudit.formats.safetensors_check.check_safetensors`).  The state
layer's value scan is turned off by the caller's config (``state.nan_scan: false``).

Inside :func:`checked_digests_only` the hash stage computes a file's SHA-256 only when a sidecar or a
manifest entry records one to check it against.  The audit records every file's digest (the report's
"last hashed", a later audit's comparison); the reader, at a resume, needs only what decides its answer:
a digest with nothing to compare it with finds no damage (the CRC32 of every zip record and the structure
checks do, in the same pass).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

_METADATA_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("ckptaudit_metadata_only", default=False)
_CHECKED_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("ckptaudit_checked_digests_only",
                                                                     default=False)


@contextlib.contextmanager
def _on(flag: contextvars.ContextVar) -> Iterator[None]:
    token = flag.set(True)
    try:
        yield
    finally:
        flag.reset(token)


def metadata_only():
    """Within the block (``with metadata_only():``), file checks read metadata and skip the streams over
    tensor data."""
    return _on(_METADATA_ONLY)


def tensor_bytes() -> bool:
    """Whether file checks may stream tensor data (False inside :func:`metadata_only`)."""
    return not _METADATA_ONLY.get()


def checked_digests_only():
    """Within the block (``with checked_digests_only():``), the hash stage skips the SHA-256 of a file that has
    no recorded digest."""
    return _on(_CHECKED_ONLY)


def unchecked_digests() -> bool:
    """Whether the hash stage computes the SHA-256 of a file with no sidecar or manifest entry (False inside
    :func:`checked_digests_only`)."""
    return not _CHECKED_ONLY.get()
