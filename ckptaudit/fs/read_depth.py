"""How deep the file layer reads: every byte (the audit), or a file's metadata only (the reader's run pass).

:func:`ckptaudit.safe_load_checkpoint` judges the run as the audit does, but reads tensor bytes only of the
units it had to examine (:mod:`ckptaudit.newest_first`).  Older units still take part in the run-level
judgements (step continuity, scheduler cadence, a unit written after a newer one), which read their
metadata: the zip central directory and local headers, data.pkl and its static walk, a safetensors
header, JSON files.  At :data:`METADATA_ONLY` the checks that stream tensor data are off: the CRC32
of every zip record (:func:`ckptaudit.formats.torchzip.check_zip`) and the search for zeroed blocks in a
safetensors data buffer (:func:`ckptaudit.formats.safetensors_check.check_safetensors`).  The state
layer's value scan is turned off by the caller's config (``state.nan_scan: false``).

At :data:`CHECKED_DIGESTS_ONLY` the hash stage computes a file's SHA-256 only when a sidecar or a
manifest entry records one to check it against.  The audit records every file's digest (the report's
"last hashed", a later audit's comparison); the reader, at a resume, needs only what decides its answer:
a digest with nothing to compare it with finds no damage (the CRC32 of every zip record and the structure
checks do, in the same pass).

A depth is a value the stage entry points take (``depth=``, :mod:`ckptaudit.stages`) and hand down: to the
hash stage's passes (:func:`ckptaudit.stages.hash.hash_unit`) and, on the byte facts the checks already receive
(``ByteFacts.tensor_bytes``), to the file checks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReadDepth:
    """What the file layer may read.  ``tensor_bytes``: file checks may stream tensor data (the CRC32 of zip
    records, the zero-block search); ``unchecked_digests``: the hash stage computes the SHA-256 of a file with
    no sidecar or manifest entry to check it against; ``damage_detail``: a damaged record's bytes are read again
    for what the finding tells of them."""

    tensor_bytes: bool = True
    unchecked_digests: bool = True
    #: a zip record that fails its CRC32 is read again for its longest NUL run, a fact told with the finding
    #: (:func:`ckptaudit.formats.zip.crc.longest_zero_run`); the reader, which passes over a damaged unit and
    #: pays for each examined unit's bytes once, tells the mismatch without it
    damage_detail: bool = True
    #: every file gets a SHA-256, recorded or not (``ckptaudit seal``, which writes sidecars of the audited bytes)
    all_sha256: bool = False


#: The audit's depth: every byte, every digest.
FULL = ReadDepth()
#: The reader's run pass: metadata only, no stream over tensor data.
METADATA_ONLY = ReadDepth(tensor_bytes=False)
#: The reader's examination: every byte, a SHA-256 only where something records one to compare.
CHECKED_DIGESTS_ONLY = ReadDepth(unchecked_digests=False, damage_detail=False)
#: ``ckptaudit seal``'s audit: every byte, and a SHA-256 of every file (the sidecars it writes record them).
SEAL = ReadDepth(all_sha256=True)
