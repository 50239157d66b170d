"""The publish protocol's vocabulary: its file names, temp names, manifest schema and errors.

Stdlib only, so that any module may read these names without importing the writer.  A
temp name is ``.ckptaudit-tmp-<host8>-<pid>-<rand8>-<final name>`` (:mod:`ckptaudit._io`,
which every atomic write in ckptaudit uses); ``docs/publish-protocol.md`` says what each
name means on disk.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Dict

from .._io import TMP_PREFIX, TMP_RE, tmp_name  # noqa: F401 - TMP_RE re-exported
from .._io import host_tag

__all__ = ["SCHEMA", "SCHEMAS_READ", "MANIFEST_NAME", "COMPLETE_MARKER", "TMP_PREFIX", "LATEST_NAME", "SIDECAR_SUFFIX",
           "DEFAULT_CHUNK_BYTES", "PublishError", "Preempted", "tmp_name", "host_tag", "check_name"]

#: The manifest schema written.  ``/2`` differs from ``/1`` only in its entries' chunk digests: BLAKE3 in
#: ``chunk_blake3_hex`` where ``/1`` had SHA-256 in ``chunk_sha256_hex`` (:mod:`ckptaudit.formats.chunk_digest`).
SCHEMA = "ckptaudit.manifest/2"
#: Every manifest schema this version reads as its own.
SCHEMAS_READ = ("ckptaudit.manifest/1", SCHEMA)
MANIFEST_NAME = "manifest.json"
COMPLETE_MARKER = "COMPLETE"
LATEST_NAME = "latest"
SIDECAR_SUFFIX = ".sha256"
DEFAULT_CHUNK_BYTES = 64 << 20
#: Names inside a unit that only the protocol writes.
RESERVED = (MANIFEST_NAME, COMPLETE_MARKER, "ckptaudit.manifest.json")
#: ``os.O_CLOEXEC`` where the platform has it (0 elsewhere).
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class PublishError(RuntimeError):
    """A publish that did not happen.  ``causes`` maps each failed rank (or step of the
    protocol, e.g. ``"commit"``) to why; the unit was not made visible."""

    def __init__(self, unit: str, causes: Dict[str, str]):
        self.unit = unit
        self.causes = dict(causes)
        lines = [f"{unit}: not published ({len(causes)} cause(s))"] + [f"  {k}: {v}" for k, v in causes.items()]
        super().__init__("\n".join(lines))


class Preempted(BaseException):
    """Raised by :class:`PreemptionGuard` (``mode="abandon"``) inside a save that is still
    writing data.  A ``BaseException``, like ``KeyboardInterrupt``, so ``except Exception``
    in training code does not swallow it.  ``signum`` is the signal received."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"preempted by signal {signal.Signals(signum).name} during a save; the save was abandoned")


def check_name(name: str, what: str) -> None:
    """``ValueError`` unless ``name`` (a ``what``, for the message) is a relative path inside a unit, without
    ``..``, and no name the protocol keeps for itself (manifest, marker, sidecar, temp file)."""
    p = Path(name)
    if not name or p.is_absolute() or ".." in p.parts or name != p.as_posix():
        raise ValueError(f"{what} {name!r} must be a relative path inside the unit, without '..'")
    if p.name in RESERVED or p.name.endswith(SIDECAR_SUFFIX) or p.name.startswith(TMP_PREFIX):
        raise ValueError(f"{what} {name!r} is reserved by the publish protocol (manifest, marker, sidecar, temp)")
