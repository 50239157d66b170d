"""The file layer's finding kinds about recorded digests: a ckptaudit manifest's chunk digests and listed files, and
the previous audit's own digests (:mod:`ckptaudit.verification.reverify`).

Data only, as :mod:`ckptaudit.findings.file`, whose ``ENTRIES`` take these in place (the catalogue's order stays).
"""

from __future__ import annotations

from typing import List

from .model import Kind as _k

ENTRIES: List[_k] = [
    # ------------------------------------- file (hashing: ckptaudit.publish manifests)
    _k("chunk_checksum_mismatch", "file", "error", "none",
       "{path}: bytes {start} to {last} ({n_bytes} bytes: chunk(s) {chunks} of {n_chunks}, {chunk_bytes} bytes "
       "each) do not match the {algorithm} chunk digest(s) recorded in the {source}; {where_text}.",
       "Do not use it; roll back to the newest checkpoint whose checksums verify.{range_note}",
       stage="hash", detector="ckptaudit.stages.hash:_file_row"),
    _k("manifest_file_missing", "file", "error", "none",
       "{path} is listed in {manifest} ({size_bytes} bytes, SHA-256 {sha256_hex}) but is not in the unit: it "
       "was deleted, or the unit was copied only in part.",
       "Do not use the unit; restore the file from a copy whose SHA-256 matches, or roll back to the previous "
       "checkpoint.",
       stage="hash", detector="ckptaudit.stages.hash:_missing_file_rows"),
    # ------------------------------------- file (the previous audit's own digests: ckptaudit.verification.reverify)
    _k("digest_changed_since_last_audit", "file", "error", "none",
       "{path}: its {algorithm} digest is {actual} but the audit of {last_hashed_utc} recorded {expected} for the same "
       "size ({size_bytes} bytes) and mtime: its bytes changed with no write that shows (bit rot, a bad disk or "
       "controller, or a copy that wrote other bytes and put the times back).",
       "Do not use it; roll back to the newest checkpoint whose bytes verify, or restore {path} from a copy whose "
       "{algorithm} digest is {expected}.",
       stage="hash", detector="ckptaudit.verification.reverify:changed_since_last_audit"),
]
