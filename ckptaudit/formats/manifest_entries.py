"""The file entries of a ckptaudit manifest (``*.manifest.json`` or a published folder's ``manifest.json``).

The format is the publish protocol's (docs/publish-protocol.md, written by :mod:`ckptaudit.publish.manifest`):
a JSON object whose ``schema`` starts with ``ckptaudit.manifest/`` and whose ``files`` list holds one entry per
file (``path`` relative to the manifest's folder, ``size_bytes``, ``sha256_hex``, ``chunk_blake3_hex`` or
``chunk_sha256_hex`` …).
Read by the hash stage (:func:`ckptaudit.stages.hash.hash_unit`) and the published-folder layout
(:mod:`ckptaudit.layouts.published`); it imports neither, so both may.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

from .. import fs


def load_manifest(path: Path, kept=None) -> Dict[str, dict]:
    """{relative path inside the manifest's folder: entry} of a ckptaudit manifest; {} when unreadable.
    ``kept``: bytes of remote objects already read (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
    try:
        doc = fs.loads_json(fs.read_bounded(path, fs.SMALL_FILE_BYTES, kept=kept))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("ckptaudit.manifest/"):
        return {}
    return {str(e.get("path")): e for e in doc.get("files", []) if isinstance(e, dict)}
