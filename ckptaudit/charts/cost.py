"""The per-stage cost chart: wall seconds spent in each audit stage, one horizontal bar per stage.

Seconds come from Snakemake's ``benchmark:`` files when the workflow wrote them (the wall time of the
stage's jobs), else from the timings the stages record in their own tables (hash, scan, load and state
value-scan seconds), so an in-process audit still shows where its time went.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from . import svg
from .svg import LEFT, RIGHT, WIDTH, mark

BAR = "#5c6bc0"
ROW = 26
#: (stage, table, seconds column) of the timings each stage records in its own table
TABLE_SECONDS = (("hash", "hash", "hash_seconds"), ("scan", "scan", "walk_seconds"),
                 ("load", "load", "load_seconds"), ("state", "state", "scan_seconds"))


def from_tables(all_tables: Dict[str, List[dict]]) -> List[Tuple[str, float]]:
    """(stage, seconds) summed from the stages' own timing columns."""
    out = []
    for stage, table, col in TABLE_SECONDS:
        vals = [r.get(col) for r in all_tables.get(table, [])]
        vals = [float(v) for v in vals if isinstance(v, (int, float))]
        if vals:
            out.append((stage, sum(vals)))
    return out


def build(bench_costs: List[dict], all_tables: Dict[str, List[dict]]) -> Optional[dict]:
    """The chart from :func:`ckptaudit.stages.report.stage_costs` rows (stage, seconds), else from ``all_tables``.

    None when neither gives a time.  Each bar's seconds are printed beside it."""
    if bench_costs:
        rows = [(c["stage"], float(c["seconds"])) for c in bench_costs]
        source = "Snakemake benchmark files (wall seconds summed over each stage's jobs)"
    else:
        rows = from_tables(all_tables)
        source = "the stages' own timing columns (hash_seconds, walk_seconds, load_seconds, scan_seconds)"
    if not rows:
        return None
    rows.sort(key=lambda r: -r[1])
    tv = svg.nice_ticks(0.0, max(max(s for _, s in rows), 1e-3))
    x = svg.Scale(tv[0], tv[-1], LEFT, WIDTH - RIGHT - 60)
    top = 10
    bottom = top + len(rows) * ROW + 4
    marks = svg.x_axis(x, bottom, tv, "seconds", top=top)  # first, so the grid lies under the bars
    for i, (stage, sec) in enumerate(rows):
        y = top + i * ROW
        marks.append(svg.label(LEFT - 8, y + 15, stage, 12, "end", cls="cost-stage"))
        marks.append(mark("rect", "cost-bar", title=f"{stage}: {sec:.3f} s", x=LEFT, y=y + 3,
                          width=max(x(sec) - LEFT, 1.0), height=ROW - 8, fill=BAR, data_stage=stage))
        marks.append(svg.label(max(x(sec), LEFT + 1) + 6, y + 15, f"{sec:.2f} s" if sec >= 0.1 else f"{sec:.2g} s", 11,
                               cls="cost-value"))
    return svg.chart("chart-cost", "Cost of each stage", f"Seconds per stage, from {source}.", bottom + 40, marks)
