"""The stages' rows as values: what each per-part stage's ``run`` returns (:mod:`ckptaudit.stages.context`) and
the next stages read in memory; the rules' CLI writes them as the tables of :mod:`ckptaudit.tables`."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Mapping, Optional, Tuple

from ..fs import read_depth

if TYPE_CHECKING:
    import pyarrow as pa

    from ..findings import Finding
    from ..onepass.facts import ByteFacts


@dataclass(frozen=True)
class TableRow:
    """A row of one of :mod:`ckptaudit.tables`' stage tables (``TABLE``) as a value: a field per column of
    ``tables.SCHEMAS[TABLE]``, named as there, except ``findings_json``, held as ``findings``
    (``Tuple[Finding, ...]``) where the table has it.  :meth:`to_record` is the table's record (what
    :func:`ckptaudit.tables.write` takes), :meth:`of` the typed row of a record read back."""

    TABLE: ClassVar[str] = ""

    def to_record(self) -> Dict[str, Any]:
        """The row as a record of its table: ``findings`` as the ``findings_json`` string (a JSON list of
        :meth:`ckptaudit.findings.Finding.to_dict`), every other field as it is."""
        rec = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "findings"}
        if "findings" in self.__dataclass_fields__:
            found = self.findings  # type: ignore[attr-defined]
            rec["findings_json"] = json.dumps([x.to_dict() for x in found]) if found else "[]"
        return rec

    @classmethod
    def of(cls, record: Mapping[str, Any]):
        """The typed row of a record of its table (a column absent: None; ``findings_json`` parsed)."""
        kw = {f.name: record.get(f.name) for f in fields(cls) if f.name != "findings"}
        has = "findings" in cls.__dataclass_fields__
        parsed = {"findings": findings_of(record.get("findings_json"))} if has else {}
        return cls(**kw, **parsed)  # the row's own findings, as its table holds them: none added


def findings_of(findings_json: Optional[str]) -> Tuple["Finding", ...]:
    """The findings of a ``findings_json`` cell (None or "": none)."""
    if not findings_json or findings_json == "[]":  # most rows: no parse
        return ()
    from ..findings import Finding

    return tuple(Finding.from_dict(d) for d in json.loads(findings_json))


def records(rows) -> List[Dict[str, Any]]:
    """The table records of typed rows (:meth:`TableRow.to_record`), in order."""
    return [r.to_record() for r in rows]


@dataclass(frozen=True)
class HashRow(TableRow):
    """One file's row of table ``hash``: its size (bytes), SHA-256 and the audit's digest, when its bytes were
    hashed, the expected digest and whether it matched, and its findings."""

    TABLE: ClassVar[str] = "hash"
    unit: str
    file: Optional[str] = None
    size_bytes: Optional[int] = None
    sha256_hex: Optional[str] = None
    hash_seconds: Optional[float] = None
    expected_sha256_hex: Optional[str] = None
    expected_source: Optional[str] = None
    verified: Optional[bool] = None
    findings: Tuple["Finding", ...] = ()
    hashed_at_utc: Optional[str] = None
    digest_algorithm: Optional[str] = None
    digest_hex: Optional[str] = None
    mtime_ns: Optional[int] = None


@dataclass(frozen=True)
class LoadRow(TableRow):
    """One file's (or a whole unit's, ``file`` "") row of table ``load``: loaded, shown to load as another file
    did (``loaded_as``; seconds and peak RSS 0), or skipped and why; the load's seconds and peak RSS (bytes), what
    it found, and its findings."""

    TABLE: ClassVar[str] = "load"
    unit: str
    file: Optional[str] = None
    status: Optional[str] = None
    skipped_reason: Optional[str] = None
    error_type: Optional[str] = None
    error_message: Optional[str] = None
    load_seconds: Optional[float] = None
    peak_rss_bytes: Optional[int] = None
    n_top_level_keys: Optional[int] = None
    n_tensors: Optional[int] = None
    #: the file whose load stands for this one's ("" when this file was loaded or skipped): the same bytes but
    #: where torch's load does not look (:mod:`ckptaudit.stages.load.equivalent`)
    loaded_as: Optional[str] = ""
    findings: Tuple["Finding", ...] = ()


@dataclass(frozen=True)
class StructureRow(TableRow):
    """One unit's row of table ``structure``: its weights against the target, its parallel layout, its findings."""

    TABLE: ClassVar[str] = "structure"
    unit: str
    weights_component: Optional[str] = None
    n_weight_keys: Optional[int] = None
    prefix: Optional[str] = None
    n_missing: Optional[int] = None
    n_unexpected: Optional[int] = None
    n_shape_mismatch: Optional[int] = None
    model_params: Optional[int] = None
    optimizer_params: Optional[int] = None
    dp_world_size: Optional[int] = None
    zero_stage: Optional[int] = None
    structure_hash: Optional[str] = None
    findings: Tuple["Finding", ...] = ()


@dataclass(frozen=True)
class ConfigdiffRow(TableRow):
    """One compared key of a unit, a row of table ``configdiff``: its saved and target values (JSON text unless a
    string), how a difference counts (``klass``), its findings."""

    TABLE: ClassVar[str] = "configdiff"
    unit: str
    source: Optional[str] = None
    key: Optional[str] = None
    saved: Optional[str] = None
    target: Optional[str] = None
    klass: Optional[str] = None
    findings: Tuple["Finding", ...] = ()


@dataclass(frozen=True)
class StateRow(TableRow):
    """One unit's row of table ``state``: its step and counters, what it holds to resume from, its tensors'
    value statistics (``tensor_norms_json``: the weights' L2 norms, :mod:`ckptaudit.stages.weight_norms`), what the
    run-wide judgement of missing components reads of it (``run_needs_json``, :mod:`ckptaudit.components.run_needs`),
    its findings."""

    TABLE: ClassVar[str] = "state"
    unit: str
    step: Optional[int] = None
    step_source: Optional[str] = None
    has_weights: Optional[bool] = None
    has_optimizer: Optional[bool] = None
    optimizer_nonempty: Optional[bool] = None
    optimizer_step: Optional[float] = None
    has_scheduler: Optional[bool] = None
    scheduler_last_epoch: Optional[int] = None
    has_scaler: Optional[bool] = None
    has_rng: Optional[bool] = None
    has_sampler: Optional[bool] = None
    has_ema: Optional[bool] = None
    epoch: Optional[float] = None
    best_metric: Optional[float] = None
    loss: Optional[float] = None
    n_float_tensors: Optional[int] = None
    n_nonfinite_tensors: Optional[int] = None
    nonfinite_tensors: Optional[Tuple[str, ...]] = None
    weight_norm: Optional[float] = None
    tensor_norms_json: Optional[str] = None
    scanned_bytes: Optional[int] = None
    scan_seconds: Optional[float] = None
    run_needs_json: Optional[str] = None
    findings: Tuple["Finding", ...] = ()


@dataclass(frozen=True)
class HashRows:
    """The hash stage's rows of a part: ``rows``, one per file (table ``hash``); ``facts``: the pass's byte
    facts (table ``bytefacts``: CRC32s, NUL runs, value statistics) as ``pyarrow`` tables of that schema, held in
    memory (the in-process audit); ``facts_file``: the same table as the Parquet file a rule's hash job wrote,
    which :meth:`byte_facts` reads a batch at a time keeping only the kinds asked for (a rule's job: memory of
    those kinds' columns, not of the table, issue 45; 1,200,012 facts at 300,000 tensors)."""

    rows: Tuple[HashRow, ...]
    facts: Tuple["pa.Table", ...] = ()
    facts_file: Optional[str] = None

    def byte_facts(self, run_dir, depth: read_depth.ReadDepth = read_depth.FULL, kinds=None) -> "ByteFacts":
        """The facts as a :class:`ckptaudit.onepass.facts.ByteFacts` (those of ``kinds``; None: all), with
        ``depth``'s ``tensor_bytes`` and ``damage_detail``."""
        import pyarrow as pa

        from ..onepass import facts as byte_facts
        from ..tables import SCHEMAS

        if self.facts_file is not None:
            got = byte_facts.load(self.facts_file, run_dir, depth.tensor_bytes, kinds)
        else:
            rows = pa.concat_tables([t.cast(SCHEMAS["bytefacts"]) for t in self.facts]) if self.facts else []
            got = byte_facts.load(rows, run_dir, depth.tensor_bytes, kinds)
        got.damage_detail = depth.damage_detail
        return got


@dataclass(frozen=True)
class ScanRow:
    """One unit's scan: ``row``, its row of the ``scan`` table (``findings_json``, ``tree_json``, ``facts_json``,
    …), and its findings as values; :attr:`parsed` its tree parsed once for every stage that reads it."""

    unit: str
    row: Mapping[str, Any]
    findings: Tuple["Finding", ...]

    @functools.cached_property
    def parsed(self) -> Tuple[Any, Dict[str, Any], Dict[str, Any]]:
        """(components, tree, facts) of the unit (:func:`ckptaudit.components.of_scan_row`), parsed on first use."""
        from ..components import of_scan_row

        return of_scan_row(self.row)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> "ScanRow":
        """The typed row of a ``scan`` table row."""
        return cls(row["unit"], row, findings_of(row.get("findings_json")))


@dataclass(frozen=True)
class ImportRow(TableRow):
    """One global a unit's pickle imports, a row of table ``imports``: where (``file``, ``member``), what
    (``module``, ``name``), how the security layer counts it (``category``, ``source``) and the
    ``torch.serialization.add_safe_globals`` line that allows it (``add_safe``)."""

    TABLE: ClassVar[str] = "imports"
    unit: str
    file: Optional[str] = None
    member: Optional[str] = None
    module: Optional[str] = None
    name: Optional[str] = None
    category: Optional[str] = None
    source: Optional[str] = None
    add_safe: Optional[str] = None


@dataclass(frozen=True)
class ScanRows:
    """The scan stage's rows of a part: ``scans``, one per unit; ``tensors`` (table ``tensors``, one row per
    tensor, as columns) and ``imports`` (table ``imports``, one row per global a pickle imports)."""

    scans: Tuple[ScanRow, ...]
    tensors: "pa.Table"
    imports: Tuple[ImportRow, ...]

    def by_unit(self) -> Dict[str, ScanRow]:
        return {s.unit: s for s in self.scans}


@dataclass(frozen=True)
class LoadRows:
    """The load stage's rows of a part: one per file loaded or skipped (table ``load``), in the part's unit order;
    ``loadtest_bytes``: what the load children read."""

    rows: Tuple[LoadRow, ...]
    loadtest_bytes: int = 0


@dataclass(frozen=True)
class StructureRows:
    """The structure stage's rows of a part: one per scanned unit (table ``structure``)."""

    rows: Tuple[StructureRow, ...]


@dataclass(frozen=True)
class ConfigdiffRows:
    """The configdiff stage's rows of a part: one per unit and compared key (table ``configdiff``)."""

    rows: Tuple[ConfigdiffRow, ...]


@dataclass(frozen=True)
class StateRows:
    """The state stage's rows of a part: one per scanned unit (table ``state``)."""

    rows: Tuple[StateRow, ...]


@dataclass(frozen=True)
class EarlierRows:
    """The earlier stages' rows a stage reads: ``hash`` (its byte facts: scan, load of a remote object, state)
    and ``scan`` (trees, findings, tensors: load, structure, configdiff, state)."""

    hash: Optional[HashRows] = None
    scan: Optional[ScanRows] = None
