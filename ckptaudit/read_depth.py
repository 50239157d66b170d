"""How deep the file layer reads: every byte (the audit), or a file's metadata only (the reader's run pass).

:func:`ckptaudit.safe_load_checkpoint` judges the run as the audit does, but reads tensor bytes only of the
units it had to examine (:mod:`ckptaudit.newest_first`).  Older units still take part in the run-level
judgements (step continuity, scheduler cadence, a unit written after a newer one), which read their
metadata: the zip central directory and local headers, data.pkl and its static walk, a safetensors
header, JSON files.  Inside :func:`metadata_only` the checks that stream tensor data are off: the CRC32
of every zip record (:func:`ckptaudit.formats.torchzip.check_zip`) and the search for zeroed blocks in a
safetensors data buffer (:func:`ckptaudit.formats.safetensors_check.check_safetensors`).  The state
layer's value scan is turned off by the caller's config (``state.nan_scan: false``).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

_METADATA_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("ckptaudit_metadata_only", default=False)


@contextlib.contextmanager
def metadata_only() -> Iterator[None]:
    """Within the block, file checks read metadata and skip the streams over tensor data."""
    token = _METADATA_ONLY.set(True)
    try:
        yield
    finally:
        _METADATA_ONLY.reset(token)


def tensor_bytes() -> bool:
    """Whether file checks may stream tensor data (False inside :func:`metadata_only`)."""
    return not _METADATA_ONLY.get()
