"""The byte-reading steps of the shared file scanner: the security sweep of pickle bytes, tensor rows and small values.

:func:`ckptaudit.layouts.base.scan_file` runs these steps and builds the findings they lead to;
each step here only reads bytes and records rows, imports, trees and timings on the ``UnitScan``.  Each
takes ``kept``: bytes of a remote object already read (:class:`ckptaudit.fs.kept.KeptBytes`, or None),
which its reads answer from first.
"""

from __future__ import annotations

import struct
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Mapping

from .. import fs
from ..security import resume as security_resume
from .result import TENSOR_COLUMNS, TensorRow, UnitScan
from .tree import decode_small, read_small, small_nbytes

#: Sniff kinds whose bytes may be a pickle (protocol 0 is text; protocol 1 starts with any opcode).
_SWEPT_KINDS = ("torch_legacy", "pickle", "text", "json", "html", "unknown")
#: Bytes of one file read for the security sweep (legacy records sit at the front).
SWEEP_BYTES = 256 << 20
_SWEEP_HEAD_BYTES = 1 << 20


def security_sweep(path: Path, rel: str, s, scan: UnitScan, allowed: List[str], kept=None):
    """Walk every pickle stream of a file that is not a zip or safetensors, whatever its name or
    what the file layer calls it; add its security findings.  Returns the combined walk when the
    bytes are a pickle, else None.  ``torch.load`` with weights-only off unpickles the first pickle
    of any non-zip file before it checks a magic number, so each one is a loadable pickle."""
    import time

    from .. import security
    from ..pickle_walk import walk

    if s.kind not in _SWEPT_KINDS or s.size_bytes == 0:
        return None
    t0 = time.perf_counter()
    with fs.open_binary(path, kept=kept) as fh:
        data = fh.read(min(s.size_bytes, _SWEEP_HEAD_BYTES))  # most non-pickles fail in the first bytes
        first = walk(data)
        if s.kind not in ("torch_legacy", "pickle") and not first.globals \
                and not (first.n_ops >= 2 and (first.error is None or first.error.startswith("truncated"))):
            return None  # text or bytes that are no pickle
        if len(data) < s.size_bytes and (first.error is None or first.error.startswith("truncated")):
            data += fh.read(min(s.size_bytes, SWEEP_BYTES) - len(data))
            first = walk(data)
    res = security.streams(data, first, expected=5 if s.kind == "torch_legacy" else 1)
    scan.walk_seconds += time.perf_counter() - t0
    member = "(legacy pickle)" if s.kind == "torch_legacy" else "(pickle)"
    verdicts, sec = security.scan(res, path=rel, member=member, extra_allowed=allowed,
                                  resume=security_resume.resume_load(scan.layout, rel))
    scan.add(sec)
    scan.imports.extend({"file": rel, "member": member, **asdict(v)} for v in verdicts)
    return res


def walk_data_pkl(scan: UnitScan, data: bytes, n_records: int, walks=None):
    """Walk the intact data.pkl of a zip of ``n_records`` records (its opcode budget grows with them:
    :func:`ckptaudit.pickle_walk.budgets.ops_for`) and gather its pickle streams; returns ``(walk, streams)``.
    ``walks``: the job's :class:`ckptaudit.pickle_walk.templates.WalkTemplates` (a data.pkl of a shape walked
    before gets that walk's result with its own numbers in place), or None."""
    from .. import security
    from ..pickle_walk import walk
    from ..pickle_walk.budgets import ops_for

    t0 = time.perf_counter()
    res = walk(data, max_ops=ops_for(n_records)) if walks is None else walks.walk(data, ops_for(n_records))
    all_streams = security.streams(data, res)
    scan.walk_seconds += time.perf_counter() - t0
    scan.pickle_bytes += len(data)
    return res, all_streams


def storages_needed(res) -> Mapping[str, tuple]:
    """Storage key -> ``(nbytes, dtype, numel)`` from a walk of data.pkl, for ``torchzip.check_storages``: the
    storages whose ``numel`` is known, each tuple made when asked for (not one held per storage: issue 45)."""
    return _StoragesNeeded(res.storages)


class _StoragesNeeded(Mapping):
    """:func:`storages_needed` over the walk's ``{key: StorageRef}``."""

    def __init__(self, refs) -> None:
        self._refs = refs

    def __getitem__(self, key: str) -> tuple:
        sref = self._refs[key]
        if sref.numel is None:
            raise KeyError(key)
        return (sref.numel * sref.itemsize, sref.dtype, sref.numel)

    def __iter__(self):
        return (k for k, sref in self._refs.items() if sref.numel is not None)

    def __len__(self) -> int:
        return sum(1 for sref in self._refs.values() if sref.numel is not None)


#: Tensors of a zip made into one ``tensors`` table at a time by :func:`zip_tensors` (its Python lists of values
#: are one block's: ~35 MiB at 300,000 tensors were all of them at once).
TENSOR_BLOCK = 1 << 16


def zip_tensors(path: Path, rel: str, unit: str, scan: UnitScan, rep, res) -> None:
    """The tensors of a zip's data.pkl (``res.tensors``) as ``tensors`` tables of :data:`TENSOR_BLOCK` rows added
    to ``scan`` (a column per field, not a :class:`TensorRow` per tensor: issue 45)."""
    from .. import tables

    rows = _record_rows(rep, (tm for _, tm in res.tensors))
    record_offset = rep.members.column("data_offset")
    for a in range(0, len(res.tensors), TENSOR_BLOCK):  # a table per block: lists of one block's values at a time
        cols: Dict[str, list] = {c: [] for c in TENSOR_COLUMNS if c not in ("unit", "file")}
        name_c, dtype_c, shape_c, numel_c, nbytes_c, key_c, off_c, param_c, soff_c = (
            cols[c] for c in ("name", "dtype", "shape", "numel", "nbytes", "storage_key", "data_offset",
                              "is_parameter", "storage_offset"))
        for (name, tm), row in zip(res.tensors[a:a + TENSOR_BLOCK], rows[a:a + TENSOR_BLOCK]):
            name_c.append(name)
            dtype_c.append(tm.dtype)
            shape_c.append(tm.shape)
            numel_c.append(tm.numel)
            nbytes_c.append(tm.nbytes)
            key_c.append(tm.storage.key)
            off_c.append(int(record_offset[row]) + tm.storage_offset * tm.storage.itemsize if row >= 0 else -1)
            param_c.append(tm.is_parameter)
            soff_c.append(tm.storage_offset)
        n = len(name_c)
        scan.add_tensor_table(tables.from_columns("tensors", {"unit": [unit] * n, "file": [rel] * n, **cols}))
        del cols, name_c, dtype_c, shape_c, numel_c, nbytes_c, key_c, off_c, param_c, soff_c


def zip_small_values(path: Path, rep, shown, kept=None) -> None:
    """Read the values of the small tensors a zip's described tree shows (``shown``, a
    :class:`ckptaudit.layouts.tree.ShownValues`) from their bytes and set them in its nodes: those of a storage
    record at a data offset ≥ 0.  Only the tensors shown are read (at most
    :data:`ckptaudit.layouts.tree.TREE_MAX_ITEMS` of a container), not every small tensor of the file."""
    if not shown.tensors:
        return
    rows = _record_rows(rep, shown.tensors)
    record_offset = rep.members.column("data_offset")
    small = []
    for tm, row in zip(shown.tensors, rows):
        off = int(record_offset[row]) + tm.storage_offset * tm.storage.itemsize if row >= 0 else -1
        if off >= 0:
            small.append((off, tm, small_nbytes(tm.dtype, tm.numel)))
    values: Dict[int, Any] = {}
    _read_small_values(path, small, values, kept)
    shown.fill(values)


def _record_rows(rep, tms):
    """Row of the storage record (the last of its name, ``<prefix>/data/<key>``) of each of the TensorMetas
    ``tms`` in ``rep.members``, -1 where none: an int64 numpy array, looked up over the records' columns."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = pa.array([tm.storage.key for tm in tms], pa.string())
    return rep.members.rows_of(pc.binary_join_element_wise(pa.scalar(f"{rep.prefix}/data/"), keys, pa.scalar("")))


def _read_small_values(path: Path, small: list, values: Dict[int, Any], kept=None) -> None:
    """The values of the small tensors ``(offset, TensorMeta, bytes)`` into ``values`` (by the tensor's id):
    a remote object's in one batch of ranged reads, a local file's one read each; a read that fails leaves
    its tensor out."""
    from ..formats import torchzip

    if fs.is_remote(path) and torchzip.REMOTE_PREFETCH:  # all small values in one batch
        try:
            raws = fs.read_ranges(path, [(off, n) for off, _, n in small], kept=kept)
        except OSError:
            raws = [None] * len(small)
        for (off, tm, n), raw in zip(small, raws):
            v = decode_small(raw, tm.dtype, tm.numel) if raw is not None else None
            if v is not None:
                values[id(tm)] = v
        return
    with fs.open_binary(path, exact=True, kept=kept) as fh:
        for off, tm, n in small:
            try:
                v = read_small(fh, off, tm.dtype, tm.numel)
            except OSError:
                v = None
            if v is not None:
                values[id(tm)] = v


def safetensors_rows(path: Path, rel: str, unit: str, scan: UnitScan, header, kept=None) -> Dict[str, Any]:
    """The tensors of the valid entries of a safetensors header (a dict, or the columns
    :func:`ckptaudit.formats.safetensors_check.check_safetensors` returns) into ``scan``; returns the file's tree,
    cut at :data:`ckptaudit.layouts.tree.TREE_MAX_ITEMS` entries (:func:`ckptaudit.layouts.tree.cut`)."""
    from ..formats.safetensors_check import ST_DTYPES, valid_entries
    from .tree import TREE_MAX_ITEMS, cut

    hlen = _safetensors_header_len(path, kept)
    if not isinstance(header, dict):  # the columns: a table, not a TensorRow per tensor (issue 45)
        return _safetensors_table(rel, unit, scan, header, 8 + hlen)
    tree: Dict[str, Any] = {}
    # a malformed entry (wrong types) is already an invalid_header_json error: it is not a tensor
    for name, info in valid_entries(header):
        a, b = info["data_offsets"]
        dtype = ST_DTYPES.get(info.get("dtype"), str(info.get("dtype")).lower())
        shape = list(info.get("shape", []))
        numel = 1
        for d in shape:
            numel *= int(d)
        scan.tensors.append(TensorRow(unit, rel, name, dtype, shape, numel, b - a, name, 8 + hlen + a))
        tree[name] = {"__tensor__": dtype, "shape": shape}
    return cut(tree, TREE_MAX_ITEMS)


def _safetensors_table(rel: str, unit: str, scan: UnitScan, cols, data_start: int) -> Dict[str, Any]:
    """The valid entries of header columns ``cols`` as one ``tensors`` table added to ``scan``; the tree of the
    first :data:`ckptaudit.layouts.tree.TREE_MAX_ITEMS` (``"__truncated__"``: how many there are, when more)."""
    import numpy as np
    import pyarrow as pa

    from .. import tables
    from ..formats.safetensors_check import ST_DTYPES
    from ..formats.safetensors_columns import DTYPES
    from .tree import TREE_MAX_ITEMS

    idx = cols.valid_indices()
    n = len(idx)
    begin = np.frombuffer(cols.begin, np.int64)[idx]
    end = np.frombuffer(cols.end, np.int64)[idx]
    dim_ends = np.frombuffer(cols.dim_ends, np.int64)
    dim_starts = np.r_[0, dim_ends[:-1]] if len(dim_ends) else dim_ends
    dims = np.frombuffer(cols.dims, np.int64)
    codes = np.frombuffer(cols.dtype_code, np.int8)[idx]
    torch_names = pa.array([ST_DTYPES.get(d, d.lower()) for d in DTYPES], pa.string())
    # a valid entry's dims are contiguous in file order: the valid ones' offsets into ``dims``
    lens = (dim_ends - dim_starts)[idx]
    offs = np.zeros(n + 1, np.int32 if len(dims) < 2 ** 31 else np.int64)
    np.cumsum(lens, out=offs[1:])
    flat = dims[np.repeat(dim_starts[idx], lens) + (np.arange(offs[-1]) - np.repeat(offs[:-1], lens))] \
        if n else dims[:0]
    shape = (pa.ListArray if offs.dtype == np.int32 else pa.LargeListArray).from_arrays(pa.array(offs),
                                                                                      pa.array(flat, pa.int64()))
    numel = np.multiply.reduceat(np.r_[flat, 1], offs[:-1]) if n else flat  # prod of each shape (int64 wraps as
    numel = np.where(lens == 0, 1, numel)                                   # the bytes it spans cannot: checked)
    names = cols.names_array()
    if n != len(cols):  # some entry is not well formed (an error already): not a tensor
        names = names.take(pa.array(idx))
    schema = tables.SCHEMAS["tensors"]
    table = pa.table({
        "unit": pa.repeat(unit, n),
        "file": pa.repeat(rel, n), "name": names, "dtype": torch_names.take(pa.array(codes.astype(np.int32))),
        "shape": shape.cast(schema.field("shape").type), "numel": pa.array(numel, pa.int64()),
        "nbytes": pa.array(end - begin), "storage_key": names, "data_offset": pa.array(data_start + begin),
        "is_parameter": pa.repeat(False, n), "storage_offset": pa.repeat(0, n),
    }).cast(schema)
    scan.add_tensor_table(table)
    tree: Dict[str, Any] = {}
    for i in idx[:TREE_MAX_ITEMS].tolist():
        dt = cols.dtype(i)
        tree[cols.name(i)] = {"__tensor__": ST_DTYPES.get(dt, dt.lower()), "shape": cols.shape(i)}
    if n > TREE_MAX_ITEMS:
        tree["__truncated__"] = n
    return tree


def json_tree(path: Path, scan: UnitScan, out: Dict[str, Any], key: str, kept=None) -> None:
    """Read a small JSON file as the file's object and tree (nothing when it does not parse)."""
    try:
        with fs.open_binary(path, kept=kept) as fh:
            out["obj"] = fs.loads_json(fh.read(16 << 20))
        scan.tree[key] = out["obj"]
    except (OSError, ValueError):
        pass


def _safetensors_header_len(path: Path, kept=None) -> int:
    with fs.open_binary(path, kept=kept) as fh:
        return struct.unpack("<Q", fh.read(8))[0]
