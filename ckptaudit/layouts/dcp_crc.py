"""DCP chunks whose bytes changed after the save: each ``torch.save`` blob's record CRC-32s, as the pass computed.

With DCP's default ``SerializationFormat.TORCH_SAVE`` every item of a ``__<rank>_<n>.distcp`` file is a whole
``torch.save`` zip (torch ``distributed/checkpoint/filesystem.py``, ``_write_item``) at the byte range
``.metadata`` gives it (``_StorageInfo(relative_path, offset, length)``), and each of its records carries the
CRC-32 ``torch.save``'s writer computed.  ``dcp.load`` (``FileSystemReader.read_data``: ``torch.load`` of the
blob) and ``dcp_to_torch_save`` either raise on a changed record or, when the reader skips the check, load the
changed values.  The hash stage's one pass computed the CRC-32 of every stored record of every blob
(:func:`ckptaudit.onepass.plan_dcp.plan_distcp`); :func:`check_chunk_crcs` reads each blob's end record,
central directory and local headers again (small reads, never a tensor byte:
:func:`ckptaudit.formats.zip.blob.blob_records`) for the stored CRCs and compares.  A record the pass did not
compute (no facts: an unplanned file, a changed file, a blob in another format) is not judged: no false alarm.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from .. import findings as F
from .. import fs
from .result import UnitScan

__all__ = ["MAX_FINDINGS", "check_chunk_crcs", "chunk_crc_mismatch"]

#: Records failing their CRC named per unit, at most (the count is in the scan's facts).
MAX_FINDINGS = 20


def check_chunk_crcs(folder: Path, storage: dict, scan: UnitScan, facts, rel: Callable[[str], str],
                     state: Callable, fqn_of: Callable, count: Callable, inside: Callable[[str], bool]) -> None:
    """Compare every stored record of every item blob of the DCP unit in ``folder`` with the CRC-32 the pass
    computed (``facts``: the hash stage's :class:`ckptaudit.onepass.facts.ByteFacts`, or None: nothing is
    judged); add a ``dcp_chunk_crc_mismatch`` error per failing record (the first :data:`MAX_FINDINGS`) to
    ``scan``, their number to ``scan.facts["crc_mismatches"]``.  ``storage``: the Metadata's ``storage_data``
    ({MetadataIndex: _StorageInfo}); ``state``, ``fqn_of``, ``count`` and ``inside`` read its fields
    (:mod:`ckptaudit.layouts.dcp`); ``rel`` names a file of the unit as the findings do."""
    if facts is None:
        return
    by_file: Dict[str, List[Tuple[int, int, str, object]]] = {}
    for idx, info in storage.items():
        s = state(info)
        if not isinstance(s, dict):
            continue
        relp, off, n = s.get("relative_path"), count(s.get("offset")), count(s.get("length"))
        if isinstance(relp, str) and inside(relp) and off is not None and n:
            i = state(idx)
            chunk = i.get("offset") if isinstance(i, dict) else None
            by_file.setdefault(relp, []).append((off, n, fqn_of(idx), chunk))
    bad = 0
    for relp, items in sorted(by_file.items()):
        path = fs.fspath(folder / relp)
        if not facts.knows(path, "crc"):
            continue  # not planned by the pass: judged as before (offsets and lengths only)
        bad += _check_file(path, rel(relp), sorted(items, key=lambda t: (t[0], t[1])), scan, facts,
                           MAX_FINDINGS - min(bad, MAX_FINDINGS))
    if bad:
        scan.facts["crc_mismatches"] = bad


def _check_file(path: str, shown: str, items: list, scan: UnitScan, facts, room: int) -> int:
    """The records of the item blobs ``items`` (``(offset, length, fqn, chunk offsets)``, ascending) of data
    file ``path`` whose computed CRC differs from the stored one: a finding each (``room`` at most); their
    number.  A file gone or no regular file is left to the shard checks."""
    from ..formats import torchzip
    from ..formats.zip.blob import blob_records
    from ..formats.zip.reader import ArchiveFile, hex32

    try:
        if not fs.is_remote(path) and not stat.S_ISREG(os.stat(path).st_mode):
            return 0
        fh = ArchiveFile(path, window=torchzip.REMOTE_WINDOW_BYTES, prefetch=torchzip.REMOTE_PREFETCH,
                         kept=facts.kept)
    except OSError:
        return 0
    bad, done = 0, set()
    try:
        for off, n, fqn, chunk in items:
            if (off, n) in done or off + n > fh.size:
                continue  # one blob named twice; a cut file (dcp_shard_too_short names it)
            done.add((off, n))
            rec = blob_records(fh, off, n)
            for i in range(len(rec) if rec is not None else 0):
                at, k, want = rec.data_offset[i], rec.length[i], rec.crc[i]
                got = facts.crc_of(path, at, k) if want or not k else None
                if got is None or got[1] != k or got[0] == want:
                    continue
                if bad < room:
                    scan.add(chunk_crc_mismatch(shown, fqn, chunk, rec.names[i], (off, n), (at, k),
                                                hex32(want), hex32(got[0])))
                bad += 1
    except OSError:
        pass
    finally:
        fh.close()
    return bad


def chunk_crc_mismatch(shown: str, fqn: str, chunk, member: str, blob: Tuple[int, int], data: Tuple[int, int],
                       expected: str, actual: str) -> F.Finding:
    """``dcp_chunk_crc_mismatch``: record ``member`` of the ``torch.save`` blob at ``blob`` (``(offset, length)``
    in bytes) of data file ``shown``, holding item ``fqn`` (``chunk``: a tensor chunk's offsets in the global
    tensor, None for a non-tensor item), stores CRC ``expected`` but its data at ``data`` gives ``actual``."""
    if chunk is None:
        what = f"non-tensor item {fqn}"
    else:
        offsets = [int(x) for x in chunk] if isinstance(chunk, (list, tuple)) else chunk
        what = f"tensor {fqn} (its chunk at offsets {offsets})"
    return F.make("dcp_chunk_crc_mismatch", path=shown, item=fqn, what=what, member=member,
                  blob_start=blob[0], blob_end=blob[0] + blob[1], data_start=data[0], data_end=data[0] + data[1],
                  expected=expected, actual=actual)
