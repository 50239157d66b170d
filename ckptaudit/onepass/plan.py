"""What one pass feeds whom: the ranges of a file's zip records and tensors, found first with small reads.

A torch zip: the central directory and each record's local header (the file layer's own parser,
:mod:`ckptaudit.formats.zip.central`, so the offsets are the ones the scan stage asks for), then
data.pkl, walked statically (:func:`ckptaudit.pickle_walk.walk`, nothing unpickled) for each
tensor's storage, offset and dtype.  A safetensors file: its 8-byte length and JSON header.  What
cannot be planned (a damaged archive, another format) gets no ranges: the stage that needs the
fact reads those bytes itself, as it did before.
"""

from __future__ import annotations

import os
import struct
from array import array
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .. import fs
from ..formats.zip.reader import ArchiveFile
from ..formats.zip.records import DICT_ROWS, rows_in
from .values import DTYPES, FLOAT_DTYPES

#: Largest safetensors header read for planning (bytes); the file layer checks the header itself.
MAX_HEADER_BYTES = 100 << 20


#: The dtypes a plan's value ranges are coded in (``Plan.values_dtype`` indexes this tuple).
_DTYPE_CODE = {d: i for i, d in enumerate(DTYPES)}


def _pairs(rows=()) -> "np.ndarray":  # noqa: F821 - numpy is imported inside, when called
    """An ``(n, 2)`` int64 array of ``rows`` (pairs of ints)."""
    import numpy as np

    a = np.array(list(rows) if not hasattr(rows, "shape") else rows, dtype=np.int64)
    return a.reshape(-1, 2)


@dataclass
class Plan:
    """The byte ranges of one file, as columns (one row per range, in ascending offset; memory: a few int64 per
    range, no Python object per record or tensor):

    * ``crc_member`` (``pyarrow`` string array) and ``crc_range`` ``(n, 2)`` ``[data offset, length]``: stored
      zip records with a recorded CRC32;
    * ``values_range`` ``(n, 2)`` ``[data offset, nbytes]`` and ``values_dtype`` ``(n,)`` (codes into
      :data:`DTYPES`): floating tensors, deduplicated;
    * ``tensor_data_range`` ``(n, 2)`` ``[offset, length]``: the bytes that only hold tensor data (stored
      ``data/`` records, a safetensors data area): what a loader that builds the object tree over ``mmap``
      does not read;
    * ``nul_scans`` ``(start, length, min_run)``: ranges whose every NUL run of ``min_run`` bytes or more the
      file layer lists (a safetensors data area: :func:`ckptaudit.formats.safetensors_check._suspicious_zero_runs`).

    ``crc``, ``values`` and ``tensor_data`` give the same ranges as lists of tuples (small files, tests)."""

    crc_member: object = None
    crc_range: object = field(default_factory=_pairs)
    values_range: object = field(default_factory=_pairs)
    values_dtype: object = None
    tensor_data_range: object = field(default_factory=_pairs)
    nul_scans: List[Tuple[int, int, int]] = field(default_factory=list)

    @property
    def crc(self) -> List[Tuple[str, int, int]]:
        """``(member, data offset, length)`` of each CRC range."""
        names = self.crc_member.to_pylist() if self.crc_member is not None else []
        return [(m, int(o), int(n)) for m, (o, n) in zip(names, self.crc_range)]

    @property
    def values(self) -> List[Tuple[int, int, str]]:
        """``(data offset, nbytes, dtype)`` of each value range."""
        codes = self.values_dtype if self.values_dtype is not None else []
        return [(int(o), int(n), DTYPES[c]) for (o, n), c in zip(self.values_range, codes)]

    @property
    def tensor_data(self) -> List[Tuple[int, int]]:
        """``(offset, length)`` of each run of tensor data."""
        return [(int(o), int(n)) for o, n in self.tensor_data_range]


def plan_file(path, data: Optional[bytes] = None, dcp_places: Optional[dict] = None, *, kept=None,
              templates=None) -> Plan:
    """The plan of ``path`` (empty when its format is neither a readable torch zip nor safetensors); ``data``:
    the whole file's bytes when the caller holds them already (a small remote object), so nothing is read.  A DCP
    data file (``__<rank>_<n>.distcp``: many ``torch.save`` zips back to back) is planned blob by blob from its
    folder's ``.metadata`` (:func:`ckptaudit.onepass.plan_dcp.distcp_ranges`; ``dcp_places``: that folder's
    places when the caller walked it, :func:`ckptaudit.onepass.plan_dcp.unit_places`); a remote one is not (yet)
    planned.  ``kept``: bytes of a remote object already read (:class:`ckptaudit.fs.kept.KeptBytes`; a later
    stage's plan of an object the pass did not plan), answered from memory.  ``templates``: the job's data.pkl
    shapes walked so far (:class:`.pickle_templates.PickleTemplates`), or None to walk each data.pkl."""
    try:
        from . import plan_dcp

        if plan_dcp.is_distcp(path):  # a remote one is not planned: .metadata and the headers would be fetched again
            return Plan() if fs.is_remote(path) else _plan_distcp(path, data, dcp_places)
        if data is not None:
            head = bytes(data[:16])
        elif fs.is_remote(path):
            with fs.open_binary(path, exact=True, kept=kept) as fh:
                head = fh.read(16)
        else:
            fd = os.open(fs.fspath(path), os.O_RDONLY)
            try:
                head = fs.pread(fd, 16, 0)
            finally:
                os.close(fd)
        if head[:4] == b"PK\x03\x04":
            return _plan_zip(path, data, kept, templates)
        if len(head) >= 9 and head[8:9] == b"{":
            return _plan_safetensors(path, struct.unpack("<Q", head[:8])[0], data, kept)
    except Exception:  # noqa: BLE001 - planning is an optimisation: the stages read what is not planned
        pass
    return Plan()


class _MemFile(ArchiveFile):
    """An :class:`~ckptaudit.formats.zip.reader.ArchiveFile` over bytes in memory (no reads, no prefetch).  One
    class for every file: a class made per file (as before) is a reference cycle, and it held the file's bytes
    until the garbage collector's next pass."""

    def __init__(self, path, data: bytes) -> None:  # noqa: D401 - the parent's opens are not wanted
        self.path, self.size, self.fd, self.f = fs.fspath(path), len(data), -1, None
        self.window_bytes, self.prefetch_enabled, self.facts, self.kept = 0, False, None, None
        self.data = data

    def pread(self, off: int, n: int) -> bytes:
        if self.reads is not None:
            self.reads.append((off, n))
        return bytes(self.data[off:off + n]) if 0 <= off < self.size and n > 0 else b""

    def close(self) -> None:
        pass


def _plan_zip(path, data: Optional[bytes], kept=None, templates=None) -> Plan:
    from ..formats import torchzip
    from ..formats.zip.central import END_RECORD_ALONE, find_central_directory

    fh = _MemFile(path, data) if data is not None else ArchiveFile(
        fs.fspath(path), window=torchzip.REMOTE_WINDOW_BYTES, prefetch=torchzip.REMOTE_PREFETCH, kept=kept)
    layouts = templates.zip_layouts if templates is not None and data is not None else None
    try:
        rec = layouts.records_of(data) if layouts is not None else None  # a file of a layout parsed before
        if rec is None:
            fh.reads = [] if layouts is not None else None  # a layout compares the bytes its parse read
            cd = find_central_directory(fh, END_RECORD_ALONE if layouts is not None else None)
            if not isinstance(cd, dict):
                return Plan()
            rec = _records(fh, cd, remote=data is None and fs.is_remote(path))
            if layouts is not None:
                layouts.add(data, cd["cd_offset"], fh.reads, rec.data_offset, rec.csize, rec.prefix, rec)
                fh.reads = None
        plan = _record_plan(rec)
        pkl = int(rec.rows_of([f"{rec.prefix}/data.pkl" if rec.prefix else "data.pkl"])[0])
        if pkl < 0 or rec.method[pkl] != 0 or rec.data_offset[pkl] < 0 or \
                rec.usize[pkl] > torchzip.MAX_DATA_PKL_BYTES:
            return plan
        at, n = int(rec.data_offset[pkl]), int(rec.usize[pkl])
        if data is None and fs.is_remote(path):  # one GET of exactly its bytes
            pkl_bytes = fs.read_ranges(path, [(at, n)], kept=kept)[0] or b""
        else:
            pkl_bytes = fh.pread(at, n)
    finally:
        fh.close()
    _plan_values(plan, rec, pkl_bytes, templates)
    return plan


def _plan_distcp(path, data: Optional[bytes], dcp_places: Optional[dict] = None) -> Plan:
    """The CRC ranges and tensor-data runs of every ``torch.save`` blob of a DCP data file (:mod:`.plan_dcp`)."""
    from ..formats import torchzip
    from .plan_dcp import distcp_ranges

    fh = _MemFile(path, data) if data is not None else ArchiveFile(
        fs.fspath(path), window=torchzip.REMOTE_WINDOW_BYTES, prefetch=torchzip.REMOTE_PREFETCH)
    try:
        cols = distcp_ranges(fh, path, dcp_places)
    finally:
        fh.close()
    if cols is None:
        return Plan()
    return Plan(crc_member=cols[0], crc_range=cols[1], tensor_data_range=cols[2])


@dataclass
class _Records:
    """The stored records of a zip as columns: ``names`` (a ``pyarrow`` string array, one buffer); per row
    ``data_offset`` (-1: the local header disagrees), ``csize``, ``usize``, ``crc`` and ``method`` (numpy int64);
    ``prefix``: the folder of the first record.  No Python object per record (issue 45: 300,000 records)."""

    names: object
    data_offset: object
    csize: object
    usize: object
    crc: object
    method: object
    prefix: str
    _by_name: Optional[dict] = field(default=None, repr=False, compare=False)  # {name: last row}, made when asked

    def rows_of(self, names) -> "np.ndarray":  # noqa: F821 - numpy is imported inside, when called
        """The row of each of ``names`` (a list or string array; the last record of that name, as a reader that
        keeps one entry per name finds it), -1 where none is."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self.names)
        if n <= DICT_ROWS:  # a small archive: a dict of its names answers
            if self._by_name is None:
                self._by_name = {name: i for i, name in enumerate(self.names.to_pylist())}
            return rows_in(self._by_name, names)
        found = pc.index_in(pa.array(names, pa.string()), value_set=self.names[::-1])
        back = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.where(back >= 0, n - 1 - back, -1)


def _records(fh, cd: dict, remote: bool) -> _Records:
    """Every central-directory entry with its local header checked (:func:`ckptaudit.formats.zip.central.
    header_problem`), streamed: one entry dict at a time (a remote object's headers are fetched in batches
    first, which needs the list); the names gathered in one buffer."""
    import numpy as np
    import pyarrow as pa

    from ..formats.zip.central import header_problem, parse_central, prefetch_headers, iter_central
    from ..formats.zip.reader import Member

    problem: List[str] = []
    if remote:
        entries, _p = parse_central(fh, cd)
        prefetch_headers(fh, entries, cd["cd_offset"])
    else:
        entries = iter_central(fh, cd, problem)
    text, ends = bytearray(), array("q")
    cols = {k: array("q") for k in ("data_offset", "csize", "usize", "crc", "method")}
    m = Member(name="", header_offset=0, data_offset=-1, size_bytes=0, crc32=0)
    first = None
    for e in entries:
        m.data_offset = -1
        header_problem(fh, e, m, cd["cd_offset"])
        if first is None:
            first = e["name"]
        text += e["name"].encode("utf-8", "surrogatepass")
        ends.append(len(text))
        for k, v in (("data_offset", m.data_offset), ("csize", e["csize"]), ("usize", e["usize"]),
                     ("crc", e["crc"]), ("method", e["method"])):
            cols[k].append(v)
    offsets = np.zeros(len(ends) + 1, np.int64)
    offsets[1:] = np.frombuffer(ends, np.int64) if len(ends) else offsets[1:]
    names = pa.LargeStringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(bytes(text))
                                             ).cast(pa.string())
    first = first or ""
    arr = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64) for k, v in cols.items()}
    return _Records(names=names, prefix=first.split("/", 1)[0] if "/" in first else "", **arr)


def _record_plan(rec: _Records) -> Plan:
    """The CRC ranges and tensor-data runs of a zip's records, sorted by offset."""
    import numpy as np
    import pyarrow.compute as pc

    placed = (rec.data_offset >= 0) & (rec.method == 0)
    crc_rows = np.flatnonzero(placed & ~((rec.crc == 0) & (rec.usize > 0)))
    order = crc_rows[np.lexsort((rec.csize[crc_rows], rec.data_offset[crc_rows]))]
    data_dir = f"{rec.prefix}/data/" if rec.prefix else "data/"
    is_data = pc.starts_with(rec.names, data_dir).to_numpy(zero_copy_only=False).astype(bool)
    td = np.flatnonzero(placed & is_data)
    td = td[np.lexsort((rec.csize[td], rec.data_offset[td]))]
    return Plan(crc_member=rec.names.take(order),
                crc_range=np.stack([rec.data_offset[order], rec.csize[order]], axis=1),
                tensor_data_range=np.stack([rec.data_offset[td], rec.csize[td]], axis=1))


def _plan_values(plan: Plan, rec: _Records, pkl_bytes: bytes, templates=None) -> None:
    """The value ranges of the floating tensors data.pkl rebuilds (walked statically, nothing unpickled, or their
    places taken from a same-shape data.pkl's walk by ``templates``, :class:`.pickle_templates.PickleTemplates`):
    each tensor's storage record looked up in the records' names column once, for all tensors together."""
    import numpy as np

    def walked(pkl: bytes):
        return _float_views(pkl, len(rec.names))

    keys, views, lens, codes = walked(pkl_bytes)[0] if templates is None else templates.views_of(pkl_bytes, walked)
    if not keys:
        return
    rows = rec.rows_of([f"{rec.prefix}/data/{k}" for k in keys])
    at = np.where(rows >= 0, rec.data_offset[np.maximum(rows, 0)], -1)
    keep = at >= 0
    offs = (at + np.frombuffer(views, np.int64))[keep]
    _set_values(plan, array("q", offs.tobytes()), array("q", np.frombuffer(lens, np.int64)[keep].tobytes()),
                array("q", np.frombuffer(codes, np.int64)[keep].tobytes()))


def _float_views(pkl_bytes: bytes, n_records: int):
    """``((storage keys, byte offsets in the storages, bytes, dtype codes), clean)`` of the floating tensors of a
    static walk of ``pkl_bytes`` (opcode budget from ``n_records``); ``clean``: the walk ended without an error."""
    from ..pickle_walk import walk
    from ..pickle_walk.budgets import ops_for

    res = walk(pkl_bytes, max_ops=ops_for(n_records), tensor_paths=False)  # names are not needed here
    keys, views, lens, codes = [], array("q"), array("q"), array("q")
    for _name, tm in res.tensors:
        if tm.dtype not in FLOAT_DTYPES or not tm.nbytes:
            continue
        keys.append(str(tm.storage.key))
        views.append(tm.storage_offset * tm.storage.itemsize)
        lens.append(tm.nbytes)
        codes.append(_DTYPE_CODE[tm.dtype])
    return (keys, views, lens, codes), res.error is None and not res.budget_exhausted


def _set_values(plan: Plan, offs, lens, codes) -> None:
    """Deduplicated value ranges ``(offset, nbytes, dtype code)``, sorted by offset then length, into ``plan``."""
    import numpy as np

    if not len(offs):
        return
    rows = np.stack([np.frombuffer(offs, np.int64), np.frombuffer(lens, np.int64),
                     np.frombuffer(codes, np.int64)], axis=1)
    rows = np.unique(rows, axis=0)  # sorted by (offset, nbytes, code); each triple once
    plan.values_range = np.ascontiguousarray(rows[:, :2])
    plan.values_dtype = np.ascontiguousarray(rows[:, 2])


def skeleton_ranges(size: int, tensor_data) -> List[Tuple[int, int]]:
    """``(offset, length)`` of the bytes of a file of ``size`` bytes outside ``tensor_data`` (a plan's
    ``(offset, length)`` pairs, a list or an ``(n, 2)`` array)."""
    out, at = [], 0
    for off, n in sorted((int(o), int(k)) for o, k in tensor_data):
        if off > at:
            out.append((at, off - at))
        at = max(at, off + n)
    if at < size:
        out.append((at, size - at))
    return out


def _plan_safetensors(path, hlen: int, data: Optional[bytes], kept=None) -> Plan:
    """The data area and the value ranges of a safetensors file; its header is parsed one entry at a time
    (:func:`ckptaudit.formats.safetensors_check.iter_header`), the ranges kept as columns."""
    from ..formats.safetensors_check import MIN_ZERO_RUN_BYTES, ST_DTYPES, entry_problem, iter_header

    plan = Plan()
    if hlen > MAX_HEADER_BYTES:
        return plan
    if data is not None:
        raw, size = bytes(data[8:8 + hlen]), len(data)
    else:
        with fs.open_binary(path, exact=True, kept=kept) as fh:
            fh.seek(8)
            raw = fh.read(hlen)
        size = fs.size(path) if fs.is_remote(path) else os.stat(fs.fspath(path)).st_size
    text = raw.decode("utf-8")
    del raw
    offs, lens, codes = array("q"), array("q"), array("q")
    base = 8 + hlen
    for name, info in iter_header(text):
        if name == "__metadata__" or entry_problem(name, info):
            continue
        a, b = info["data_offsets"]
        dtype = ST_DTYPES.get(info.get("dtype"), str(info.get("dtype")).lower())
        if dtype in FLOAT_DTYPES and b > a:
            offs.append(base + a)
            lens.append(b - a)
            codes.append(_DTYPE_CODE[dtype])
    if size > base:
        plan.tensor_data_range = _pairs([(base, size - base)])
        plan.nul_scans = [(base, size - base, MIN_ZERO_RUN_BYTES)]
    _set_values(plan, offs, lens, codes)
    return plan
