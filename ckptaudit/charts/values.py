"""The values-over-steps chart: weight norm, loss and best metric of each unit, one panel each, on one step axis.

Values come from the ``state`` table (the weight norm from the streamed value scan, loss and best
metric from the unit's own counters).  A unit whose value is not known (not measured, or not
recorded in the checkpoint) gets a hollow grey mark on its panel's floor, so a missing point is
visible rather than silently interpolated; a number beside the mark points to the reason, printed
under the chart (one note per reason, naming its units).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

from . import svg
from .svg import LEFT, RIGHT, WIDTH, mark

#: (state column, panel title in lines short enough to clear the tick labels, colour)
SERIES = (("weight_norm", ("weight norm", "(L2)"), "#1565c0"),
          ("loss", ("loss at the", "save step"), "#6a1b9a"),
          ("best_metric", ("best metric",), "#00838f"))
SHORT = {"weight_norm": "weight norm", "loss": "loss", "best_metric": "best metric"}
PANEL, GAP_Y, TOP = 92, 26, 12
NOT_RECORDED = "not recorded in this unit"


def _value(row: Optional[dict], key: str) -> Optional[float]:
    v = (row or {}).get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _missing(drawn: List[dict], by_unit: Dict[str, dict], why_missing: Dict[str, str],
             shown: List[str]) -> Tuple[Dict[Tuple[str, str], int], List[dict]]:
    """({(unit, key): note number}, notes): one note per reason, listing its units (and values, when not all)."""
    groups: Dict[str, List[Tuple[dict, List[str]]]] = {}
    for u in drawn:
        keys = [k for k in shown if _value(by_unit.get(u["unit"]), k) is None]
        if keys:
            groups.setdefault(why_missing.get(u["unit"]) or NOT_RECORDED, []).append((u, keys))
    number: Dict[Tuple[str, str], int] = {}
    notes = []
    for n, (why, members) in enumerate(groups.items(), 1):
        said = []
        for u, keys in members:
            number.update({(u["unit"], k): n for k in keys})
            which = "" if len(keys) == len(shown) else "; " + ", ".join(SHORT[k] for k in keys)
            said.append(f"{u['unit']} (step {u['step']}{which})")
        notes.append({"n": n, "text": f"No value — {why}: {', '.join(said)}."})
    return number, notes


def build(units: List[dict], state_rows: List[dict], why_missing: Dict[str, str]) -> Optional[dict]:
    """The chart for the verdict's ``units`` (unit, step); None when no unit has any of the values.

    ``state_rows``: the ``state`` table (unit, weight_norm, loss, best_metric; floats or None).
    ``why_missing``: {unit: words} for units whose state was not checked, printed under the chart."""
    by_unit = {r["unit"]: r for r in state_rows}
    drawn = sorted((u for u in units if u.get("step") is not None), key=lambda u: u["step"])
    if not any(_value(by_unit.get(u["unit"]), k) is not None for u in drawn for k, _, _ in SERIES):
        return None
    shown = [k for k, _, _ in SERIES if any(_value(by_unit.get(u["unit"]), k) is not None for u in drawn)]
    number, notes = _missing(drawn, by_unit, why_missing, shown)
    steps = [u["step"] for u in drawn]
    x = svg.step_scale(steps)
    marks: List[dict] = []
    top = TOP
    for key, words, colour in SERIES:
        pts = [(u, _value(by_unit.get(u["unit"]), key)) for u in drawn]
        have = [(u, v) for u, v in pts if v is not None]
        bottom = top + PANEL
        marks += [svg.label(10, top + 16 + 15 * i, line, 12, weight="600") for i, line in enumerate(words)]
        marks.append(mark("line", "axis", x1=LEFT, x2=WIDTH - RIGHT, y1=bottom, y2=bottom, stroke=svg.MUTED))
        if not have:
            marks.append(svg.label(LEFT + 8, top + PANEL / 2, "not recorded in this run's checkpoints", 12,
                                   cls="no-values"))
            top = bottom + GAP_Y
            continue
        lo, hi = min(v for _, v in have), max(v for _, v in have)
        tv = svg.nice_ticks(lo, hi, most=5)
        y = svg.Scale(tv[0], tv[-1], bottom - 6, top + 6)
        marks += svg.y_axis(y, LEFT, WIDTH - RIGHT, tv)
        spread = svg.relative_spread(lo, hi)
        if spread:  # a tiny change drawn over the panel's full height: say how small it is
            marks.append(svg.label(WIDTH - RIGHT, top + 12, spread, 11, anchor="end", cls="value-spread"))
        marks.append(svg.polyline([(x(u["step"]), y(v)) for u, v in have], colour, f"series series-{key}"))
        for u, v in pts:
            if v is None:
                why = why_missing.get(u["unit"]) or NOT_RECORDED
                marks.append(mark("circle", f"value-missing missing-{key}", title=f"{u['unit']}: {why}",
                                  cx=x(u["step"]), cy=bottom - 6, r=4, fill="#ffffff", stroke="#757575",
                                  stroke_width=1.5))
                marks.append(svg.label(x(u["step"]) + 7, bottom - 10, f"[{number[(u['unit'], key)]}]", 10,
                                       cls="missing-note", weight="700"))
            else:
                marks.append(mark("circle", f"value-point point-{key}", title=f"{u['unit']} (step {u['step']}): "
                                  f"{v:.6g}", cx=x(u["step"]), cy=y(v), r=4, fill=colour))
        top = bottom + GAP_Y
    marks += svg.x_axis(x, top - GAP_Y + 8, svg.step_ticks(x), "step")
    caption = "Weight norm, loss and best metric recorded in each unit, by step."
    if notes:
        caption += " A hollow grey circle is a value not known; its [n] is the reason, listed above."
    return svg.chart("chart-values", "Weight norm, loss and best metric over steps", caption, top + 24, marks, notes)
