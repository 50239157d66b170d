"""The facts one pass leaves for later stages: rows of the internal ``bytefacts`` table and their lookups.

The hash stage writes, for each file it read, one row per:

* zip record CRC32 (``kind`` "crc") and, of a remote object, its longest NUL run (``kind`` "nul_run": what
  :func:`ckptaudit.formats.zip.crc.longest_zero_run` asks of a record that fails its CRC; a local file's
  failing record is read again for it);
* safetensors data area scanned for NUL runs (``kind`` "nul_scan", its runs ``kind`` "nul_scan_run");
* tensor value range (``kind`` "values") and range of bytes that only hold tensor data (``kind`` "tensor_data");
* of a remote object, piece of the bytes later stages read again (``kind`` "bytes", served by
  :mod:`ckptaudit.fs.kept` instead of a second GET).

The scan stage (CRC32 of every record, zero spans), the state stage (non-finite counts and norms) and the load
stage (which bytes a remote object's sparse copy may leave out) :func:`load` the rows of their part into a
:class:`ByteFacts` value and hand it to the checks that read bytes, which ask its
:meth:`~ByteFacts.crc_of`, :meth:`~ByteFacts.nul_run_of`, :meth:`~ByteFacts.nul_runs_in`,
:meth:`~ByteFacts.values_of` and :meth:`~ByteFacts.tensor_data_of` before reading any bytes (a check given no
facts reads the bytes).  A fact is keyed by the file and the exact byte range, so a question the pass did not answer
(a damaged archive, a view into a storage) reads bytes as before.  Facts of a file whose size or version (ETag;
local mtime and inode: :func:`ckptaudit.fs.version`) changed since the pass are dropped.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Tuple

if TYPE_CHECKING:
    import pyarrow as pa

from .. import fs
from .fact_table import file_table


def table_of(unit: str, rel: str, ff) -> "pa.Table":
    """The ``bytefacts`` rows of file ``rel`` of ``unit`` from a :class:`~.filepass.FileFacts`, as a ``pyarrow``
    table built column by column (no Python object per row), each row with the file's ``version`` at the pass
    (:func:`ckptaudit.fs.version`)."""
    import numpy as np
    import pyarrow as pa

    from ..tables import SCHEMAS
    from .values import DTYPES

    schema = SCHEMAS["bytefacts"]
    plan = ff.plan
    parts = []

    def part(kind: str, n: int, **cols) -> None:
        if n:
            parts.append((kind, n, cols))

    if ff.crc_value is not None:
        n = len(plan.crc_range)
        common = dict(member=plan.crc_member, data_offset=plan.crc_range[:, 0], length_bytes=plan.crc_range[:, 1])
        part("crc", n, crc32=ff.crc_value[:, 0], seen_bytes=ff.crc_value[:, 1], **common)
        if ff.nul_run is not None:
            part("nul_run", n, zero_offset=ff.nul_run[:, 0], zero_bytes=ff.nul_run[:, 1], **common)
    for (o, n, m), runs in ff.nul_scans.items():  # a scan row (zero_bytes: the shortest run looked for), then its runs
        part("nul_scan", 1, data_offset=[o], length_bytes=[n], zero_bytes=[m],
             seen_bytes=[-1 if runs is None else len(runs)])
        if runs:
            r = np.array(runs, dtype=np.int64).reshape(-1, 2)
            part("nul_scan_run", len(r), data_offset=np.full(len(r), o), length_bytes=np.full(len(r), n),
                 zero_offset=r[:, 0], zero_bytes=r[:, 1])
    if ff.values_seen is not None:
        names = pa.array(list(DTYPES), pa.string())
        part("values", len(plan.values_range), data_offset=plan.values_range[:, 0],
             length_bytes=plan.values_range[:, 1], dtype=names.take(pa.array(plan.values_dtype)),
             nonfinite=ff.values_nonfinite, sum_squares=ff.values_sum_squares, seen_bytes=ff.values_seen)
    td = plan.tensor_data_range
    part("tensor_data", len(td), data_offset=td[:, 0], length_bytes=td[:, 1])
    pieces = [(o + k, b[k:k + _PIECE]) for o, b in ff.kept for k in range(0, len(b), _PIECE)]
    part("bytes", len(pieces), data_offset=[p[0] for p in pieces], length_bytes=[len(p[1]) for p in pieces],
         data=[p[1] for p in pieces])
    if not parts:
        return schema.empty_table()
    return file_table(schema, {"unit": unit, "file": rel, "size_bytes": ff.size_bytes, "version": ff.version}, parts)


def rows_of(unit: str, rel: str, ff) -> List[dict]:
    """:func:`table_of` as a list of row dicts (small files, tests)."""
    return table_of(unit, rel, ff).to_pylist()


#: Bytes per "bytes" row (a kept piece of a remote object is split so no Parquet cell grows large).
_PIECE = 4 << 20


def _now(p) -> Optional[Tuple[int, str]]:
    try:
        return fs.version(p)
    except (OSError, ValueError):
        return None


#: The columns of the ``bytefacts`` table :func:`load` reads.
LOAD_COLUMNS = ["file", "kind", "data_offset", "length_bytes", "crc32", "dtype", "nonfinite", "sum_squares",
                "seen_bytes", "size_bytes", "data", "zero_offset", "zero_bytes", "version"]
#: The columns each kind of fact keeps, beside ``data_offset`` and ``length_bytes``.
_KEEP = {"crc": ("crc32", "seen_bytes"), "values": ("dtype", "nonfinite", "sum_squares", "seen_bytes"),
         "nul_run": ("zero_offset", "zero_bytes"), "tensor_data": ()}


def load(rows, run_dir, tensor_bytes: bool = True, kinds: Optional[Iterable[str]] = None) -> "ByteFacts":
    """The facts of ``rows`` (of the ``bytefacts`` table: a Parquet file's path, read :data:`BATCH_ROWS` rows at a
    time, a ``pyarrow`` table, or a list of row dicts; files relative to ``run_dir``) as a :class:`ByteFacts`
    (``len()``: the facts kept).  Rows of a file whose size or version changed since the pass are dropped.  Kept
    bytes of remote objects go to its ``kept`` (:class:`ckptaudit.fs.kept.KeptBytes`), which the stage's checks
    hand to their remote reads as ``kept=facts.kept``.  Memory: the kept columns (a few int64 per fact)
    and one batch, not the table.  ``tensor_bytes``: the read depth's (:class:`ckptaudit.fs.read_depth.ReadDepth`),
    whether a check with no fact may stream tensor data.  ``kinds``: the kinds of fact the caller asks of it (default: every kind); the
    others are not kept (issue 45: a "values" fact per tensor is ~100 MiB at 1,000,000 tensors, which only the
    state stage asks for)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = ByteFacts(tensor_bytes)
    by_kind = _by_kind(rows, None if kinds is None else frozenset(kinds))
    if not by_kind:
        return out
    keys = ["file", "size_bytes", "version"]  # grouped per kind before the cast: no string per fact (issue 45)
    files = pa.concat_tables([t.select(keys).group_by(keys).aggregate([]).select(keys).cast(_file_version_schema())
                              for t in by_kind.values()])
    good = []  # the files unchanged since the pass (one size and version per file: one pass each)
    for g in files.group_by(keys).aggregate([]).to_pylist():
        now = _now(run_dir / str(g["file"]))
        if now is not None and now[0] == g["size_bytes"] and now[1] == (g["version"] or ""):
            good.append(g["file"])
    good_set = pa.array(good, pa.string())
    kept = 0
    for kind in (*_KEEP, *_ROW_KINDS):  # a nul_scan before its runs
        t = by_kind.pop(kind, None)  # each kind's table let go once kept (issue 45)
        if t is None:
            continue
        if not set(_files_of(t)) <= set(good):  # some file changed since the pass: its facts are dropped
            t = t.filter(pc.is_in(t["file"].cast(pa.string()), value_set=good_set))
        if not t.num_rows:
            continue
        if kind in _KEEP:
            kept += t.num_rows
            _keep_columns(out, run_dir, kind, t.select(["file", "data_offset", "length_bytes", *_KEEP[kind]]))
        else:
            kept += _keep_rows(out, run_dir, kind, t)
    for _m, runs in out._nul_scan.values():
        runs.sort()
    out.count = kept
    pa.default_memory_pool().release_unused()  # the tables read are gone: their pages back to the system
    return out


def _files_of(t: "pa.Table") -> List[str]:
    """The distinct files of facts ``t`` (its ``file`` column, a dictionary or strings)."""
    import pyarrow.compute as pc

    return [str(f) for f in pc.unique(t["file"]).to_pylist()]


#: Rows of the ``bytefacts`` table :func:`load` reads from a file at a time.
BATCH_ROWS = 1 << 16
#: The kinds :func:`load` keeps as rows (few per file) rather than as columns.
_ROW_KINDS = ("nul_scan", "nul_scan_run", "bytes")


def _file_version_schema():
    import pyarrow as pa

    return pa.schema([("file", pa.string()), ("size_bytes", pa.int64()), ("version", pa.string())])


def _columns_of(wanted: Optional[frozenset]) -> List[str]:
    """The columns of :data:`LOAD_COLUMNS` that the kinds ``wanted`` keep (None: every kind)."""
    if wanted is None:
        return list(LOAD_COLUMNS)
    need = {"file", "kind", "data_offset", "length_bytes", "size_bytes", "version"}
    for kind in wanted:
        need.update(_KEEP.get(kind, ()))
    if wanted & set(_ROW_KINDS):  # what :func:`_keep_rows` reads of them
        need.update(("seen_bytes", "zero_offset", "zero_bytes", "data"))
    return [c for c in LOAD_COLUMNS if c in need]


def _by_kind(rows, wanted: Optional[frozenset] = None) -> Dict[str, "pa.Table"]:
    """{kind: its rows} of ``rows`` (see :func:`load`), each with the columns of :data:`LOAD_COLUMNS` it has,
    dictionaries unified and one chunk; a file is read one batch at a time.  ``wanted``: the kinds kept (None: all)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from ..tables import SCHEMAS, iter_batches

    if isinstance(rows, (str, os.PathLike)):  # the columns and row groups of the kinds asked for (issue 45)
        batches = iter_batches(rows, _columns_of(wanted), BATCH_ROWS, ["file", "kind", "dtype", "version"],
                               where=None if wanted is None else ("kind", wanted))
    else:
        t = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows), schema=SCHEMAS["bytefacts"])
        batches = t.select([c for c in LOAD_COLUMNS if c in t.column_names]).to_batches(BATCH_ROWS)
    parts: Dict[str, list] = {}
    for b in batches:
        kinds = b.column(b.schema.get_field_index("kind"))
        for kind in (*_KEEP, *_ROW_KINDS):
            if wanted is not None and kind not in wanted:
                continue
            sub = b.filter(pc.equal(kinds.cast(pa.string()), kind))
            if sub.num_rows:
                want = ["file", "data_offset", "length_bytes", "size_bytes", "version",
                        *(_KEEP[kind] if kind in _KEEP else [c for c in sub.schema.names if c not in ("kind",)])]
                parts.setdefault(kind, []).append(sub.select(list(dict.fromkeys(c for c in want
                                                                                 if c in sub.schema.names))))
        del b
    return {k: pa.Table.from_batches(v).unify_dictionaries().combine_chunks() for k, v in parts.items()}


def _keep_rows(out: "ByteFacts", run_dir, kind: str, t: "pa.Table") -> int:
    """Keep the few rows of ``kind`` (:data:`_ROW_KINDS`) of ``t``; returns how many were kept."""
    kept = 0
    for r in t.to_pylist():
        key = fs.fspath(run_dir / r["file"])
        if kind == "nul_scan" and r["seen_bytes"] >= 0:
            out._nul_scan.setdefault((key, r["data_offset"], r["length_bytes"]), (r["zero_bytes"], []))
            kept += 1
        elif kind == "bytes" and r.get("data") is not None:
            out.kept.put(key, r["data_offset"], r["data"], r["size_bytes"])
            kept += 1
        elif kind == "nul_scan_run":
            scan = out._nul_scan.get((key, r["data_offset"], r["length_bytes"]))
            if scan is not None:
                scan[1].append((r["zero_offset"], r["zero_bytes"]))
                kept += 1
    return kept


def _keep_columns(out: "ByteFacts", run_dir, kind: str, sub: "pa.Table") -> None:
    """The rows ``sub`` of one kind into ``out``, per file, sorted by ``(data_offset, length_bytes)``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(sub["file"]).combine_chunks()
    idx = enc.indices.to_numpy(zero_copy_only=False)
    names = enc.dictionary.to_pylist()
    cols = {c: sub[c].to_numpy(zero_copy_only=False) for c in sub.column_names if c not in ("file", "dtype")}
    if "dtype" in sub.column_names:  # as codes into one list of names: a lookup compares ints, no Arrow scalar each
        dt = pc.dictionary_encode(sub["dtype"].cast(pa.string()).fill_null("")).combine_chunks()
        cols["dtype"] = dt.indices.to_numpy(zero_copy_only=False)
        dtype_names = dt.dictionary.to_pylist()
    order = np.lexsort((cols["length_bytes"], cols["data_offset"], idx))
    if not np.array_equal(order, np.arange(len(order))):  # the hash stage writes them sorted: rarely taken
        cols = {c: v.take(order) for c, v in cols.items()}
        idx = idx[order]
    bounds = np.flatnonzero(np.diff(idx)) + 1
    for a, b in zip(np.r_[0, bounds].tolist(), np.r_[bounds, len(idx)].tolist()):
        got = out._files.setdefault(fs.fspath(run_dir / names[idx[a]]), {})[kind] = {c: v[a:b] for c, v in cols.items()}
        if "dtype" in cols:
            got["dtype_names"] = dtype_names


class ByteFacts:
    """The hash stage's facts of one part's files, as a value a stage loads (:func:`load`) and hands to its checks.

    Per file (``fs.fspath``) and kind, columns sorted by ``(data_offset, length_bytes)``: a lookup is a binary
    search, memory a few int64 per fact.  An empty ``ByteFacts()`` answers None to every question (the check then
    reads the bytes, unless ``tensor_bytes`` is false: the reader's run pass, which reads metadata only and skips
    the streams over tensor data, :data:`ckptaudit.fs.read_depth.METADATA_ONLY`).  ``damage_detail``: the read
    depth's (:class:`ckptaudit.fs.read_depth.ReadDepth`), whether a record that fails its CRC is read again."""

    __slots__ = ("_files", "_layouts", "_nul_scan", "_walks", "count", "damage_detail", "kept", "tensor_bytes")

    def __init__(self, tensor_bytes: bool = True, damage_detail: bool = True) -> None:
        self.tensor_bytes = tensor_bytes  # whether a check with no fact may stream tensor data
        self.damage_detail = damage_detail  # whether a damaged record is read again for the finding's detail
        self._files: Dict[str, Dict[str, dict]] = {}  # file -> kind -> columns
        self._nul_scan: Dict[Tuple[str, int, int], Tuple[int, List[Tuple[int, int]]]] = {}  # -> (min_run, runs)
        self.count = 0  # facts kept
        self.kept = fs.kept.KeptBytes()  # bytes of remote objects the pass kept for later reads
        self._walks = None
        self._layouts = None

    @property
    def walks(self):
        """The checks' data.pkl walks, one per shape (:class:`ckptaudit.pickle_walk.templates.WalkTemplates`)."""
        from ..pickle_walk.templates import WalkTemplates

        self._walks = self._walks or WalkTemplates()
        return self._walks

    def __len__(self) -> int:
        return self.count

    def _find(self, path: str, kind: str, offset: int, length: int):
        """``(columns, row)`` of the fact of ``kind`` at exactly ``(offset, length)`` of ``path``, or None."""
        cols = self._files.get(path, {}).get(kind)
        if cols is None:  # nothing loaded: numpy stays unimported (the file layer's promise)
            return None
        import numpy as np

        offs, lens = cols["data_offset"], cols["length_bytes"]
        i = int(np.searchsorted(offs, offset, side="left"))
        while i < len(offs) and offs[i] == offset:
            if lens[i] == length:
                return cols, i
            i += 1
        return None

    def knows(self, path: str, kind: str) -> bool:
        """Whether the pass left facts of ``kind`` ("crc", "values", "tensor_data", "nul_run") for ``path``
        (``fs.fspath``): a check that would read bytes only to find no fact can skip the file."""
        return kind in self._files.get(path, {})

    @property
    def zip_layouts(self):
        """The checks' zip layouts, one parse each (:class:`ckptaudit.onepass.zip_layouts.ZipLayouts`)."""
        from .zip_layouts import ZipLayouts

        self._layouts = self._layouts or ZipLayouts()
        return self._layouts

    def crcs_of(self, path: str, offsets, lengths):
        """``(crc32s, bytes seen)`` (numpy int64) of each ``(offset, length)`` range of ``path`` (``fs.fspath``;
        ``offsets``, ``lengths``: numpy int64), as :meth:`crc_of` answers each; None when one finds no fact."""
        import numpy as np

        cols = self._files.get(path, {}).get("crc")
        if cols is None or not len(offsets):
            return None
        offs, lens = np.asarray(cols["data_offset"]), np.asarray(cols["length_bytes"])
        i = np.searchsorted(offs, offsets, side="left")
        if (i >= len(offs)).any():
            return None
        if not ((offs[i] == offsets) & (lens[i] == lengths)).all():
            return None  # a range without its fact, or one of several facts at one offset: asked one by one
        return np.asarray(cols["crc32"])[i].astype(np.int64), np.asarray(cols["seen_bytes"])[i].astype(np.int64)

    def crc_of(self, path: str, offset: int, length: int) -> Optional[Tuple[int, int]]:
        """``(crc32, bytes seen)`` of ``length`` bytes of ``path`` (``fs.fspath``) from ``offset``, or None."""
        hit = self._find(path, "crc", offset, length)
        return None if hit is None else (int(hit[0]["crc32"][hit[1]]), int(hit[0]["seen_bytes"][hit[1]]))

    def nul_run_of(self, path: str, offset: int, length: int) -> Tuple[bool, Optional[Tuple[int, int]]]:
        """``(known, run)``: whether the pass looked at ``length`` bytes of ``path`` (``fs.fspath``) from
        ``offset`` for NUL runs (a remote object's zip records only), and the ``(offset, length)`` of the longest
        run of at least 64 NUL bytes it found there (None: none)."""
        hit = self._find(path, "nul_run", offset, length)
        if hit is None:
            return False, None
        cols, i = hit
        n = int(cols["zero_bytes"][i])
        return True, ((int(cols["zero_offset"][i]), n) if n else None)

    def nul_runs_in(self, path: str, offset: int, length: int, min_run: int) -> Optional[List[Tuple[int, int]]]:
        """Every ``(offset, length)`` NUL run of at least ``min_run`` bytes the pass listed in ``length`` bytes of
        ``path`` (``fs.fspath``) from ``offset``, in order, or None when it did not list that range so."""
        scan = self._nul_scan.get((path, offset, length))
        return list(scan[1]) if scan is not None and scan[0] == min_run else None

    def tensor_data_of(self, path: str) -> Optional[List[Tuple[int, int]]]:
        """``(offset, length)`` of the bytes of ``path`` (``fs.fspath``) that only hold tensor data, or None."""
        cols = self._files.get(path, {}).get("tensor_data")
        if cols is None:
            return None
        return list(zip(cols["data_offset"].tolist(), cols["length_bytes"].tolist()))

    def values_of(self, path: str, offset: int, nbytes: int, dtype: str) -> Optional[Tuple[int, float, int]]:
        """``(non-finite count, Σx², bytes seen)`` of a tensor's bytes of ``path`` (``fs.fspath``), or None."""
        cols = self._files.get(path, {}).get("values")
        if cols is None:
            return None
        offs, lens, codes, names = cols["data_offset"], cols["length_bytes"], cols["dtype"], cols["dtype_names"]
        i, n = int(offs.searchsorted(offset, side="left")), len(offs)  # one call per tensor: a state stage's most
        while i < n and offs[i] == offset:
            if lens[i] == nbytes and names[codes[i]] == dtype:
                return int(cols["nonfinite"][i]), float(cols["sum_squares"][i]), int(cols["seen_bytes"][i])
            i += 1
        return None
