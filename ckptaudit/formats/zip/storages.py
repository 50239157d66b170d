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
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    out: List[Finding] = []
    cut = report.cut_offset is not None or not report.has_central_directory
    pre = f"{report.prefix}/" if report.prefix else ""

    # numbered keys by number, then the others by name (no tuple per key: 300,000 storages, issue 45)
    keys = [k for k in storages if k.isdigit()]
    keys.sort(key=int)
    keys += sorted(k for k in storages if not k.isdigit())
    if not keys:
        return out
    # the record of each storage (the last of its name, as a dict by name), looked up over the records' columns
    names = pc.binary_join_element_wise(pa.scalar(f"{pre}data/"), pa.array(keys, pa.string()), pa.scalar(""))
    rows = report.members.rows_of(names)
    found = np.maximum(rows, 0)  # rows of absent names read record 0 here and are masked out
    has = len(report.members) > 0
    complete = (rows >= 0) & (report.members.column("complete")[found] == 1 if has else False)
    size = report.members.column("size_bytes")[found] if has else np.zeros(len(keys), np.uint64)
    top = (1 << 63) - 1  # a walk of a damaged data.pkl may claim more bytes than int64 holds: compared as ints below
    need = np.fromiter((-1 if storages[k][0] is None else min(storages[k][0], top) for k in keys), np.int64, len(keys))
    short = complete & (need >= 0) & (size < need.astype(np.uint64))
    for i in np.flatnonzero(complete & (need == top)):
        short[i] = int(size[i]) < storages[keys[i]][0]
    for i in np.flatnonzero(short if cut else ~complete | short):
        key = keys[i]
        nbytes, dtype, numel = storages[key]
        name = f"{pre}data/{key}"
        if not complete[i]:
            out.append(findings.make("zip_storage_missing", path=path, storage=key, member=name))
            continue
        out.append(findings.make("zip_storage_size_mismatch", path=path, storage=key, expected=nbytes,
                                 dtype=dtype, numel=numel, actual=int(size[i]), member=name))
    return out
