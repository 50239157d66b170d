"""Inline-SVG charts of the audit and drill reports, built as data (marks with coordinates) in Python.

:func:`report_charts` gives report.html its run timeline (:mod:`.timeline`), values over steps
(:mod:`.values`) and per-stage cost (:mod:`.cost`); :func:`drill_charts` gives drill.html the
continuation loss and LR against the schedule (:mod:`.drill`).  ``templates/_charts.html.j2`` draws
them: no scripts, no external assets, so each report stays one file; what a tooltip says is also
printed (axis ticks, labels by the marks, numbered notes under a chart), so a printed report reads.
"""

from __future__ import annotations

from typing import Dict, List, Mapping

from . import cost, drill, timeline, values


def mtimes_of(inventory_units: List[dict]) -> Dict[str, int]:
    """{unit: mtime in ns} from the inventory's units."""
    return {u["unit"]: u["mtime_ns"] for u in inventory_units if isinstance(u.get("mtime_ns"), int)}


def report_charts(verdict: dict, inventory_units: List[dict], all_tables: Dict[str, List[dict]],
                  bench_costs: List[dict], state_why: Dict[str, str]) -> List[dict]:
    """The charts of report.html, in page order (charts with nothing to show are left out).

    ``state_why``: {unit: why its state was not checked}, printed under the values chart."""
    units = verdict.get("units", [])
    newest = (verdict.get("newest") or {}).get("unit")
    out = [timeline.build(units, mtimes_of(inventory_units), verdict.get("rollback"), newest)] if units else []
    out.append(values.build(units, all_tables.get("state", []), state_why))
    out.append(cost.build(bench_costs, all_tables))
    return [c for c in out if c]


def drill_charts(doc: Mapping) -> List[dict]:
    """One chart per device of ``drill.json`` that continued training."""
    return [c for c in (drill.build(d) for d in doc.get("devices") or []) if c]
