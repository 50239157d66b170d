"""The torch zip's storages against its records: every storage data.pkl names needs a record big enough for it.

:func:`check_storages` runs after the scanner has walked data.pkl (it needs the storages' sizes); it is
re-exported by :mod:`ckptaudit.formats.torchzip`.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from ... import findings
from ...findings import Finding


def check_storages(report, storages: Dict[str, Tuple[int, str, int]], path: str) -> List[Finding]:
    """Check that every storage named in data.pkl has a big enough record.

    ``report`` is the archive's :class:`ckptaudit.formats.torchzip.ZipReport`; ``path`` the path the
    findings name (the file as it sits in the run folder).  ``storages``: key -> ``(nbytes_needed,
    dtype, numel)``; the record is ``<prefix>/data/<key>`` and must hold at least ``nbytes_needed``
    bytes (torch reads exactly that many; a longer record loads).  When the archive was cut short or
    zero-filled (``report.cut_offset`` set or no central directory), records past the cut are not
    reported again: the truncation finding covers them; the complete records are still size-checked.
    """
    out: List[Finding] = []
    by_name = {m.name: m for m in report.members}
    cut = report.cut_offset is not None or not report.has_central_directory
    pre = f"{report.prefix}/" if report.prefix else ""

    def keyorder(k: str):
        return (0, int(k), "") if k.isdigit() else (1, 0, k)

    for key in sorted(storages, key=keyorder):
        nbytes, dtype, numel = storages[key]
        name = f"{pre}data/{key}"
        m = by_name.get(name)
        if m is None or not m.complete:
            if not cut:
                out.append(findings.make("zip_storage_missing", path=path, storage=key, member=name))
            continue
        if nbytes is not None and m.size_bytes < nbytes:
            out.append(findings.make("zip_storage_size_mismatch", path=path, storage=key, expected=nbytes,
                                     dtype=dtype, numel=numel, actual=m.size_bytes, member=name))
    return out
