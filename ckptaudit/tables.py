"""One pyarrow schema per table, in one place.

Every stage writes exactly one of these tables (one row per unit, per file, per tensor or per key).  Units are in
the column names: ``*_bytes`` are bytes, ``*_seconds`` wall-clock seconds, ``*_ns`` nanoseconds since the epoch,
``step`` optimizer steps.  ``findings_json`` holds a JSON list of findings (see :class:`ckptaudit.findings.Finding`)
so every table carries its own diagnosis and the report can join them.

Only pyarrow is imported (≈0.2 s); pandas is not needed to write (a stage job blocks it:
:mod:`ckptaudit.stages.jobs.process`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Collection, Dict, Iterator, List, Optional, Tuple

import pyarrow as pa
import pyarrow.parquet as pq

from ._io import atomic_write


S, I, F, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()
LS = pa.list_(pa.string())
LI = pa.list_(pa.int64())

SCHEMAS: Dict[str, pa.Schema] = {
    # inventory: one row per unit
    "inventory": pa.schema([
        ("unit", S), ("layout", S), ("kind", S), ("files", LS), ("size_bytes", I), ("mtime_ns", I),
        ("step_from_name", I), ("in_progress", S), ("sidecars", LS), ("manifest", S), ("missing_files", LS),
        ("part", S),
    ]),
    # pointers: one row per pointer file or symlink
    "pointers": pa.schema([
        ("path", S), ("kind", S), ("target", S), ("resolved", S), ("exists", B), ("is_symlink", B),
        ("ok", B), ("finding_kind", S), ("findings_json", S),
    ]),
    # hash: one row per file
    "hash": pa.schema([
        ("unit", S), ("file", S), ("size_bytes", I), ("sha256_hex", S), ("hash_seconds", F),
        ("expected_sha256_hex", S), ("expected_source", S), ("verified", B), ("findings_json", S),
        ("hashed_at_utc", S),  # ISO 8601 UTC when this file's bytes were hashed; null when they were not
        # the file's digest as this audit recorded it: "sha256" (then equal to sha256_hex) where a sidecar, a
        # manifest or integrity.json records one, else the audit's own fast digest ("blake3",
        # ckptaudit.formats.digest_purpose); "" when none was computed.  sha256_hex is only ever a SHA-256.
        ("digest_algorithm", S), ("digest_hex", S),
        ("mtime_ns", I),  # the file's mtime as the pass found it (local files; null for objects)
    ]),
    # bytefacts (internal, <out>/work/bytefacts/): what the hash stage's one pass computed for later stages,
    # one row per zip record CRC32 (kind "crc"), tensor value range ("values"), tensor-data range ("tensor_data")
    # or kept piece of a remote object ("bytes", its bytes in "data"); see ckptaudit.onepass.facts
    "bytefacts": pa.schema([
        ("unit", S), ("file", S), ("kind", S), ("member", S), ("data_offset", I), ("length_bytes", I),
        ("crc32", I), ("dtype", S), ("nonfinite", I), ("sum_squares", F), ("seen_bytes", I), ("size_bytes", I),
        ("data", pa.binary()), ("zero_offset", I), ("zero_bytes", I), ("version", S),
    ]),
    # scan (file + security layers from bytes): one row per unit
    "scan": pa.schema([
        ("unit", S), ("layout", S), ("n_files", I), ("n_tensors", I), ("n_imports", I), ("pickle_bytes", I),
        ("walk_seconds", F), ("file_ok", B), ("security_ok", B), ("benign_globals", LS), ("facts_json", S),
        ("tree_json", S), ("findings_json", S),
    ]),
    # imports: one row per GLOBAL/STACK_GLOBAL/INST import of every pickle
    "imports": pa.schema([
        ("unit", S), ("file", S), ("member", S), ("module", S), ("name", S), ("category", S), ("source", S),
        ("add_safe", S),
    ]),
    # tensors: one row per tensor
    "tensors": pa.schema([
        ("unit", S), ("file", S), ("name", S), ("dtype", S), ("shape", LI), ("numel", I), ("nbytes", I),
        ("storage_key", S), ("data_offset", I), ("is_parameter", B), ("storage_offset", I),
    ]),
    # load: one row per loadable file
    "load": pa.schema([
        ("unit", S), ("file", S), ("status", S), ("skipped_reason", S), ("error_type", S), ("error_message", S),
        ("load_seconds", F), ("peak_rss_bytes", I), ("n_top_level_keys", I), ("n_tensors", I), ("loaded_as", S),
        ("findings_json", S),
    ]),
    # structure: one row per unit
    "structure": pa.schema([
        ("unit", S), ("weights_component", S), ("n_weight_keys", I), ("prefix", S), ("n_missing", I),
        ("n_unexpected", I), ("n_shape_mismatch", I), ("model_params", I), ("optimizer_params", I),
        ("dp_world_size", I), ("zero_stage", I), ("structure_hash", S), ("findings_json", S),
    ]),
    # configdiff: one row per unit and compared key
    "configdiff": pa.schema([
        ("unit", S), ("source", S), ("key", S), ("saved", S), ("target", S), ("klass", S), ("findings_json", S),
    ]),
    # state: one row per unit
    "state": pa.schema([
        ("unit", S), ("step", I), ("step_source", S), ("has_weights", B), ("has_optimizer", B),
        ("optimizer_nonempty", B), ("optimizer_step", F), ("has_scheduler", B), ("scheduler_last_epoch", I),
        ("has_scaler", B), ("has_rng", B), ("has_sampler", B), ("has_ema", B), ("epoch", F), ("best_metric", F), ("loss", F),
        ("n_float_tensors", I), ("n_nonfinite_tensors", I), ("nonfinite_tensors", LS), ("weight_norm", F),
        ("tensor_norms_json", S), ("scanned_bytes", I), ("scan_seconds", F), ("run_needs_json", S),
        ("findings_json", S),
    ]),
    # units: the joined verdict, one row per unit
    "units": pa.schema([
        ("unit", S), ("step", I), ("layout", S), ("usable_for", S), ("n_errors", I), ("n_warnings", I),
        ("kinds", LS), ("layers", LS), ("size_bytes", I), ("findings_json", S),
    ]),
    # drill (ckptaudit drill, rules/drill.smk): one row per device and check of a restore drill (ckptaudit.drill.CHECKS)
    "drill": pa.schema([
        ("unit", S), ("step", I), ("device", S), ("check", S), ("status", S), ("expected", S), ("actual", S),
        ("message", S), ("check_seconds", F), ("wall_seconds", F), ("peak_rss_bytes", I),
    ]),
}


def write(name: str, rows: List[dict], path: str | Path) -> None:
    """Write ``rows`` as table ``name`` to ``path`` (Parquet), atomically; as :func:`table` builds it."""
    write_table(name, table(name, rows), path)


def table(name: str, rows: List[dict]) -> pa.Table:
    """``rows`` as table ``name`` in memory: missing columns null, int64 values out of range saturated
    (:func:`_saturated`); extra keys raise ``KeyError`` (a schema drift)."""
    schema = SCHEMAS[name]
    cols = set(schema.names)
    for r in rows:
        extra = set(r) - cols
        if extra:
            raise KeyError(f"table {name}: unexpected columns {sorted(extra)}")
    data = [{c: r.get(c) for c in schema.names} for r in rows]
    try:
        return pa.Table.from_pylist(data, schema=schema)
    except (OverflowError, pa.ArrowInvalid):  # a hostile header's 2**63 offset or (2**40, 2**40) shape
        return pa.Table.from_pylist(_saturated(data, schema), schema=schema)


def write_table(name: str, t: pa.Table, path: str | Path) -> None:
    """Write ``t`` (table ``name``, :func:`table`) to ``path`` (Parquet), atomically."""
    schema = SCHEMAS[name]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a JSON cell can be tens of MB (norms of 1,000,000 weights): no dictionary or min/max of it (issue 45: +107 MiB)
    plain = [c for c in schema.names if not c.endswith("_json")]
    atomic_write(path, lambda f: pq.write_table(t, f, use_dictionary=plain, write_statistics=plain))


def from_columns(name: str, cols: Dict[str, list]) -> pa.Table:
    """Table ``name`` from ``{column: values}`` (every column of the schema, equal lengths), one array per column
    rather than a dict per row; int64 values out of range are saturated as :func:`write` does."""
    schema = SCHEMAS[name]
    try:
        return pa.Table.from_pydict({c: cols[c] for c in schema.names}, schema=schema)
    except (OverflowError, pa.ArrowInvalid):  # a hostile header's 2**63 offset or (2**40, 2**40) shape
        n = len(cols[schema.names[0]]) if schema.names else 0
        rows = [{c: cols[c][i] for c in schema.names} for i in range(n)]
        return pa.Table.from_pylist(_saturated(rows, schema), schema=schema)


class BatchWriter:
    """Table ``name`` written to ``path`` (Parquet) a ``pyarrow`` table at a time, as its rows are produced; the
    file appears whole at :meth:`close` (a temp file renamed), or not at all; :meth:`write` is thread-safe.

    Small tables are gathered into row groups of at least :data:`ROW_GROUP_ROWS` rows: the hash stage writes a
    few facts per file, and 49,200 rank files made as many row groups of 7 rows, which every reader then
    filtered one by one (the state stage took 48 s instead of 2.5 on the 50,000-file run)."""

    #: rows gathered before a row group is written (memory: that many rows of this table)
    ROW_GROUP_ROWS = 1 << 16

    def __init__(self, name: str, path: str | Path) -> None:
        import threading

        from ._io import tmp_name

        self.schema = SCHEMAS[name]
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.with_name(tmp_name(self.path.name))
        self._writer = pq.ParquetWriter(self._tmp, self.schema)
        self._lock = threading.Lock()
        self._buf: list = []
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        """Append ``table`` (of this table's schema, or castable to it: a dictionary column for a repeated string).
        A table of :data:`ROW_GROUP_ROWS` rows or more becomes row groups of its own, cast a slice at a time, so
        the writer holds no copy of it (issue 45: 1,000,000 rows of facts or tensors)."""
        if table.num_rows >= self.ROW_GROUP_ROWS:
            with self._lock:
                self._flush()
                for a in range(0, table.num_rows, self.ROW_GROUP_ROWS):
                    self._writer.write_table(table.slice(a, self.ROW_GROUP_ROWS).cast(self.schema).combine_chunks())
            return
        t = table.cast(self.schema)
        with self._lock:
            self._buf.append(t)
            self._rows += t.num_rows
            if self._rows >= self.ROW_GROUP_ROWS:
                self._flush()

    def _flush(self) -> None:
        if self._buf:
            self._writer.write_table(pa.concat_tables(self._buf).unify_dictionaries().combine_chunks())
        self._buf, self._rows = [], 0

    def close(self) -> None:
        """Finish the file and put it at ``path``."""
        import os

        with self._lock:
            self._flush()
        self._writer.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        """Drop what was written: no file at ``path``, no temp file left beside it."""
        self._buf, self._rows = [], 0
        self._writer.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "BatchWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Whole file on success, nothing on an exception (which then propagates)."""
        if exc_type is None:
            self.close()
        else:
            self.abort()


INT64_MAX = (1 << 63) - 1


def _clamp(v):
    if type(v) is int and not -INT64_MAX <= v <= INT64_MAX:
        return INT64_MAX if v > 0 else -INT64_MAX
    return v


def _saturated(data: List[dict], schema: pa.Schema) -> List[dict]:
    """``data`` with every int64 (and list-of-int64) value outside ±(2**63 - 1) saturated to that bound.

    Parquet int64 columns cannot hold the numbers a hostile safetensors header or DCP
    ``.metadata`` may claim; the exact values stay in the findings (``findings_json`` is JSON,
    whose integers are unbounded), so the table keeps a row and the report its evidence.
    """
    ints = [f.name for f in schema if f.type == I]
    lists = [f.name for f in schema if f.type == LI]
    for r in data:
        for c in ints:
            r[c] = _clamp(r[c])
        for c in lists:
            if isinstance(r[c], (list, tuple)):
                r[c] = [_clamp(x) for x in r[c]]
    return data


def read_table(path: str | Path, columns=None) -> pa.Table:
    """A Parquet table (its ``columns``, default all) as a ``pyarrow`` table (no pandas, no Python object per row);
    string columns stay dictionary-encoded where the file has them so (a value repeated per row stored once)."""
    f = pq.ParquetFile(path, read_dictionary=[c for c in (columns or []) if c in ("file", "kind", "dtype",
                                                                                    "unit", "version")])
    return f.read(columns=columns)


def iter_batches(path: str | Path, columns: List[str], batch_size: int, dictionary: List[str],
                 where: Optional[Tuple[str, Collection[str]]] = None):
    """The record batches of a Parquet table, ``batch_size`` rows each, of those of ``columns`` it has (a file
    written before a column existed lacks it), string columns in ``dictionary`` read dictionary-encoded.
    ``where``: ``(string column, values)``: row groups whose min/max statistics show none of ``values`` in that
    column are not read (the rows read still need filtering).  Raises what ``pyarrow`` raises for a missing or
    damaged file."""
    pf = pq.ParquetFile(path, read_dictionary=dictionary)
    names = pf.schema_arrow.names
    groups = None
    if where is not None and where[0] in names:
        i, groups = names.index(where[0]), []
        for g in range(pf.metadata.num_row_groups):
            st = pf.metadata.row_group(g).column(i).statistics
            lo, hi = (st.min, st.max) if st is not None and st.has_min_max else (None, None)
            if not (isinstance(lo, str) and isinstance(hi, str)) or any(lo <= v <= hi for v in where[1]):
                groups.append(g)
    return pf.iter_batches(batch_size=batch_size, columns=[c for c in columns if c in names], use_threads=False,
                           row_groups=groups)


def read_rows(path: str | Path, columns=None) -> List[dict]:
    """Rows of a Parquet table (its ``columns``, default all) as dicts (no pandas).

    A string column whose values repeat (``unit``, ``file``, ``dtype`` of the tensors table: one value for
    100,000 rows) gives every row the same ``str`` object instead of a copy per row (Arrow's ``to_pylist``
    makes one per row): at 100,000 tensors this is ~18 MB of the structure and state jobs' memory."""
    return rows_of(pq.ParquetFile(path).read(columns=columns))  # ParquetFile avoids importing pyarrow.dataset


def rows_of(t: pa.Table) -> List[dict]:
    """Rows of ``t`` as dicts, as :func:`read_rows` gives them (a repeated string value shared)."""
    cols = [_column_values(t.column(i)) for i in range(t.num_columns)]
    names = t.column_names
    return [dict(zip(names, vals)) for vals in zip(*cols)] if cols else []


class UnitRows:
    """The rows of a table with a ``unit`` column, one unit at a time: the table is held as Arrow columns, made
    Python values :data:`UNIT_BATCH_ROWS` rows at a time, and a unit's rows become dicts as they are iterated, so
    a consumer holds one window of values, not a dict per row of the part (issue 22: state at 100,000 tensors)."""

    def __init__(self, path: Optional[str | Path], columns=None, table: Optional[pa.Table] = None) -> None:
        """The rows of the Parquet table at ``path``, or of ``table`` (in memory, ``path`` None)."""
        import numpy as np

        if table is not None:
            self.table = table.select(columns) if columns is not None else table
        else:  # the columns that repeat one value per unit or file read as dictionaries: 4 bytes a row (issue 45)
            self.table = pq.ParquetFile(path, read_dictionary=[c for c in ("unit", "file", "dtype")
                                                               if columns is None or c in columns]
                                      ).read(columns=columns).unify_dictionaries()
        self.ranges: Dict[str, List[Tuple[int, int]]] = {}  # unit -> its runs of rows [start, stop)
        self._win: Tuple[int, int, list] = (0, 0, [])  # (first row, rows, column values): the window :meth:`rows` made
        if self.table.num_rows:
            enc = self.table.column("unit").combine_chunks()
            if not pa.types.is_dictionary(enc.type):
                enc = enc.dictionary_encode()
            idx = enc.indices.to_numpy(zero_copy_only=False)
            names = enc.dictionary.to_pylist()
            cuts = (np.flatnonzero(np.diff(idx)) + 1).tolist()
            for a, b in zip([0] + cuts, cuts + [len(idx)]):
                self.ranges.setdefault(names[idx[a]], []).append((a, b))

    def of(self, unit: str) -> "UnitView":
        """The rows of ``unit`` as an iterable that can be iterated again (each time a fresh :meth:`rows`)."""
        return UnitView(self, unit)

    def rows(self, unit: str) -> Iterator[dict]:
        """The rows of ``unit`` in table order, as dicts (a repeated string value shared, :func:`read_rows`).  The
        column values of :data:`UNIT_BATCH_ROWS` rows are made at once and kept for the next units, whose rows
        usually follow: Arrow's cost per call is paid per window of rows, not per unit (issue 45)."""
        names = self.table.column_names
        for a, b in self.ranges.get(unit, ()):
            while a < b:
                if not self._win[0] <= a < self._win[0] + self._win[1]:
                    t = self.table.slice(a, UNIT_BATCH_ROWS)
                    self._win = (a, t.num_rows, [_column_values(t.column(i)) for i in range(t.num_columns)])
                w0, n, cols = self._win
                end = min(b, w0 + n)
                yield from (dict(zip(names, vals)) for vals in zip(*(c[a - w0:end - w0] for c in cols)))
                a = end


class UnitView:
    """One unit's rows of a :class:`UnitRows`: each iteration makes them dicts again, a batch at a time."""

    def __init__(self, owner: UnitRows, unit: str) -> None:
        self.owner, self.unit = owner, unit

    def __iter__(self) -> Iterator[dict]:
        return self.owner.rows(self.unit)


#: Rows made Python values at once by :meth:`UnitRows.rows` (the most it holds).
UNIT_BATCH_ROWS = 1 << 14


def _column_values(col) -> list:
    """The Python values of ``col`` (Arrow array or chunked array); a string column's repeats one object each."""
    if pa.types.is_dictionary(col.type):  # read as a dictionary: its values made Python objects once
        enc = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        values = enc.dictionary.to_pylist()
        return [None if i is None else values[i] for i in enc.indices.to_pylist()]
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)) or len(col) < 2:
        return col.to_pylist()
    enc = (col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col).dictionary_encode()
    if len(enc.dictionary) * 2 > len(col):  # mostly distinct (tensor names): nothing to share
        return col.to_pylist()
    values = enc.dictionary.to_pylist()
    return [None if i is None else values[i] for i in enc.indices.to_pylist()]


def concat_batches(name: str, paths: List[str], out: str | Path) -> int:
    """Concatenate the part tables ``paths`` of table ``name`` into ``out`` a record batch at a time, no Python
    object per row (``tensors``: 1,000,000 rows of one safetensors header); returns the rows written."""
    n = 0
    with BatchWriter(name, out) as w:
        for p in paths:
            for batch in pq.ParquetFile(p).iter_batches(batch_size=1 << 16):
                w.write(pa.Table.from_batches([batch]))
                n += batch.num_rows
    return n


def concat(name: str, paths: List[str], out: str | Path) -> List[dict]:
    """The part tables ``paths`` of ``name`` joined into ``out`` (no Python row in between); their rows, made a
    part at a time (:func:`rows_of` of the whole would copy a mostly distinct column twice to look for repeats)."""
    schema = SCHEMAS[name]
    parts = [_conformed(pq.ParquetFile(p).read(), schema) for p in paths]
    write_table(name, pa.concat_tables(parts) if parts else schema.empty_table(), out)
    return [r for t in parts for r in rows_of(t)]


def _conformed(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` as ``schema``; a column ``t`` lacks (written before it existed) null, as :func:`write` makes it."""
    return pa.table([t.column(c).cast(f.type) if c in t.column_names else pa.nulls(t.num_rows, f.type)
                     for c, f in zip(schema.names, schema)], schema=schema)
