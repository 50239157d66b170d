"""The stages' rows as values: what each per-part stage's ``run`` returns (:mod:`ckptaudit.stages.context`) and
the next stages read in memory; the rules' CLI writes them as the tables of :mod:`ckptaudit.tables`."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple

from ..fs import read_depth

if TYPE_CHECKING:
    import pyarrow as pa

    from ..findings import Finding
    from ..onepass.facts import ByteFacts


@dataclass(frozen=True)
class HashRows:
    """The hash stage's rows of a part: ``rows``, one per file (table ``hash``); ``facts``: the pass's byte
    facts (table ``bytefacts``: CRC32s, NUL runs, value statistics) as ``pyarrow`` tables of that schema."""

    rows: Tuple[dict, ...]
    facts: Tuple["pa.Table", ...] = ()

    def byte_facts(self, run_dir, depth: read_depth.ReadDepth = read_depth.FULL, kinds=None) -> "ByteFacts":
        """The facts as a :class:`ckptaudit.onepass.facts.ByteFacts` (those of ``kinds``; None: all), with
        ``depth``'s ``tensor_bytes``."""
        import pyarrow as pa

        from ..onepass import facts as byte_facts
        from ..tables import SCHEMAS

        rows = pa.concat_tables([t.cast(SCHEMAS["bytefacts"]) for t in self.facts]) if self.facts else []
        return byte_facts.load(rows, run_dir, depth.tensor_bytes, kinds)


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
        import json

        from ..findings import Finding

        return cls(row["unit"], row, tuple(Finding.from_dict(d) for d in json.loads(row.get("findings_json") or "[]")))


@dataclass(frozen=True)
class ScanRows:
    """The scan stage's rows of a part: ``scans``, one per unit; ``tensors`` (table ``tensors``, one row per
    tensor, as columns) and ``imports`` (table ``imports``, one row per global a pickle imports)."""

    scans: Tuple[ScanRow, ...]
    tensors: "pa.Table"
    imports: Tuple[dict, ...]

    def by_unit(self) -> Dict[str, ScanRow]:
        return {s.unit: s for s in self.scans}


@dataclass(frozen=True)
class LoadRows:
    """The load stage's rows of a part: one per file loaded or skipped (table ``load``), in the part's unit order;
    ``loadtest_bytes``: what the load children read."""

    rows: Tuple[dict, ...]
    loadtest_bytes: int = 0


@dataclass(frozen=True)
class StructureRows:
    """The structure stage's rows of a part: one per scanned unit (table ``structure``)."""

    rows: Tuple[dict, ...]


@dataclass(frozen=True)
class ConfigdiffRows:
    """The configdiff stage's rows of a part: one per unit and compared key (table ``configdiff``)."""

    rows: Tuple[dict, ...]


@dataclass(frozen=True)
class StateRows:
    """The state stage's rows of a part: one per scanned unit (table ``state``)."""

    rows: Tuple[dict, ...]


@dataclass(frozen=True)
class EarlierRows:
    """The earlier stages' rows a stage reads: ``hash`` (its byte facts: scan, load of a remote object, state)
    and ``scan`` (trees, findings, tensors: load, structure, configdiff, state)."""

    hash: Optional[HashRows] = None
    scan: Optional[ScanRows] = None
