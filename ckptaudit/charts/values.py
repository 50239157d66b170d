"""The values-over-steps chart: weight norm, loss and best metric of each unit, one panel each, on one step axis.

Values come from the ``state`` table (the weight norm from the streamed value scan, loss and best
metric from the unit's own counters).  A unit whose value is not known (not measured, or not
recorded in the checkpoint) gets a hollow grey mark on its panel's floor, so a missing point is
visible rather than silently interpolated.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

from . import svg
from .svg import LEFT, RIGHT, WIDTH, mark

SERIES = (("weight_norm", "weight norm (L2)", "#1565c0"),
          ("loss", "loss at the save step", "#6a1b9a"),
          ("best_metric", "best metric", "#00838f"))
PANEL, GAP_Y, TOP = 92, 26, 12


def _value(row: Optional[dict], key: str) -> Optional[float]:
    v = (row or {}).get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def build(units: List[dict], state_rows: List[dict], why_missing: Dict[str, str]) -> Optional[dict]:
    """The chart for the verdict's ``units`` (unit, step); None when no unit has any of the values.

    ``why_missing``: {unit: words} for units whose state was not checked (the tooltip of their mark)."""
    by_unit = {r["unit"]: r for r in state_rows}
    drawn = sorted((u for u in units if u.get("step") is not None), key=lambda u: u["step"])
    if not any(_value(by_unit.get(u["unit"]), k) is not None for u in drawn for k, _, _ in SERIES):
        return None
    steps = [u["step"] for u in drawn]
    x = svg.Scale(*svg.padded(min(steps), max(steps), 0.04), LEFT, WIDTH - RIGHT)
    marks: List[dict] = []
    top = TOP
    for key, words, colour in SERIES:
        pts = [(u, _value(by_unit.get(u["unit"]), key)) for u in drawn]
        have = [(u, v) for u, v in pts if v is not None]
        bottom = top + PANEL
        marks.append(svg.label(10, top + 16, words, 12, fill=colour, weight="600"))
        marks.append(mark("line", "axis", x1=LEFT, x2=WIDTH - RIGHT, y1=bottom, y2=bottom, stroke=svg.MUTED))
        if not have:
            marks.append(svg.label(LEFT + 8, top + PANEL / 2, "not recorded in this run's checkpoints", 12,
                                   fill=svg.MUTED, cls="no-values"))
            top = bottom + GAP_Y
            continue
        lo, hi = min(v for _, v in have), max(v for _, v in have)
        y = svg.Scale(*svg.padded(lo, hi, 0.12), bottom - 4, top + 6)
        tv = svg.ticks(y.d0, y.d1, 3)
        marks += svg.y_axis(y, LEFT, WIDTH - RIGHT, tv, fmt=svg.tick_format(tv))
        spread = svg.relative_spread(lo, hi)
        if spread:  # a tiny change drawn over the panel's full height: say how small it is
            marks.append(svg.label(WIDTH - RIGHT, top + 12, spread, 11, anchor="end", fill=svg.MUTED,
                                   cls="value-spread"))
        marks.append(svg.polyline([(x(u["step"]), y(v)) for u, v in have], colour, f"series series-{key}"))
        for u, v in pts:
            if v is None:
                why = why_missing.get(u["unit"]) or "not recorded in this unit"
                marks.append(mark("circle", f"value-missing missing-{key}", title=f"{u['unit']}: {why}",
                                  cx=x(u["step"]), cy=bottom - 6, r=4, fill="#ffffff", stroke="#9e9e9e",
                                  stroke_width=1.5))
            else:
                marks.append(mark("circle", f"value-point point-{key}", title=f"{u['unit']} (step {u['step']}): "
                                  f"{v:.6g}", cx=x(u["step"]), cy=y(v), r=4, fill=colour))
        top = bottom + GAP_Y
    marks += svg.x_axis(x, top - GAP_Y + 8, steps if len(steps) <= 16 else svg.ticks(x.d0, x.d1, 8), "step")
    caption = ("Weight norm, loss and best metric recorded in each unit, by step. Hollow grey marks: units whose "
               "value is not known (hover for why).")
    return svg.chart("chart-values", "Weight norm, loss and best metric over steps", caption, top + 24, marks)
