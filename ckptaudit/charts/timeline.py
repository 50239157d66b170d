"""The run timeline chart: units by step coloured by usability, the rollback point, gaps and write times.

The upper lane places every unit with a step on a step axis, coloured resume / warm-start only /
unusable; a gap much longer than the run's usual save interval is drawn dashed and labelled.  The
lower panel plots each unit's write time (mtime) against its step: a healthy run climbs left to right,
and a unit modified after a newer unit was written stands above its successors and is ringed
(:func:`late_writes`), the evidence of damage done after the fact.  A blue dashed line marks the
rollback point across both.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from typing import Dict, List, Optional, Tuple

from . import svg
from .svg import LEFT, RIGHT, WIDTH, mark

LATE = "#8e24aa"
ROLLBACK = "#1565c0"
GAP = "#ef6c00"


def late_writes(units: List[dict], mtimes: Dict[str, int]) -> Dict[str, dict]:
    """{unit: the newest unit with a higher step that was written before it} for units written out of order.

    ``units`` carry ``unit`` and ``step``; ``mtimes`` are nanoseconds since the epoch."""
    known = sorted((u for u in units if u.get("step") is not None and mtimes.get(u["unit"])),
                   key=lambda u: u["step"])
    out: Dict[str, dict] = {}
    for i, u in enumerate(known):
        later = [v for v in known[i + 1:] if v["step"] > u["step"] and mtimes[v["unit"]] < mtimes[u["unit"]]]
        if later:
            v = later[-1]
            out[u["unit"]] = {"unit": v["unit"], "step": v["step"],
                              "seconds": (mtimes[u["unit"]] - mtimes[v["unit"]]) / 1e9}
    return out


def _time_unit(span_s: float) -> Tuple[str, float]:
    for name, size, limit in (("s", 1.0, 120), ("min", 60.0, 7200), ("h", 3600.0, 172800)):
        if span_s < limit:
            return name, size
    return "d", 86400.0


def _utc(ns: int) -> str:
    return _dt.datetime.fromtimestamp(ns / 1e9, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def gaps(steps: List[int]) -> List[Tuple[int, int, bool]]:
    """(step, next step, irregular) between consecutive steps; irregular = over 1.5 × the median interval."""
    pairs = list(zip(steps, steps[1:]))
    if not pairs:
        return []
    med = statistics.median(b - a for a, b in pairs)
    return [(a, b, len(pairs) > 1 and (b - a) > 1.5 * med) for a, b in pairs]


def build(units: List[dict], mtimes: Dict[str, int], rollback: Optional[dict]) -> dict:
    """The timeline chart of the verdict's ``units`` (unit, step, usable_for) with ``mtimes`` (ns) per unit."""
    drawn = sorted((u for u in units if u.get("step") is not None), key=lambda u: u["step"])
    stepless = [u["unit"] for u in units if u.get("step") is None]
    late = late_writes(units, mtimes)
    steps = sorted({u["step"] for u in drawn})
    x = svg.Scale(*svg.padded(min(steps, default=0), max(steps, default=1), 0.04), LEFT, WIDTH - RIGHT)
    lane_y, t_top, t_bottom = 62, 120, 250
    marks: List[dict] = [svg.label(10, lane_y + 4, "units", 12, weight="600"),
                         svg.label(10, (t_top + t_bottom) / 2, "write time", 12, weight="600"),
                         svg.label(10, (t_top + t_bottom) / 2 + 15, "(mtime)", 11, fill=svg.MUTED)]
    usable = [(svg.USABLE_COLOUR[k], svg.USABLE_WORDS[k]) for k in ("resume", "warm-start", "none")]
    marks += svg.legend(LEFT, 18, usable + [(ROLLBACK, "rollback point"),
                                            (LATE, "modified after a newer unit was written")])
    for a, b, irregular in gaps(steps):
        x0, x1 = x(a) + 9, x(b) - 9
        if x1 <= x0:
            continue
        if irregular:
            marks.append(mark("line", "gap gap-irregular", title=f"{b - a} steps between step {a} and step {b}",
                              x1=x0, x2=x1, y1=lane_y, y2=lane_y, stroke=GAP, stroke_width=3, stroke_dasharray="6 4"))
            marks.append(svg.label((x0 + x1) / 2, lane_y - 14, f"gap: {b - a} steps", 11, "middle", GAP, "gap-label"))
        else:
            marks.append(mark("line", "gap", title=f"{b - a} steps", x1=x0, x2=x1, y1=lane_y, y2=lane_y,
                              stroke="#bdbdbd", stroke_width=2))
    if rollback and rollback.get("step") is not None:
        rx = x(rollback["step"])
        marks.append(mark("line", "rollback-marker", title=f"rollback point: {rollback['unit']}",
                          x1=rx, x2=rx, y1=lane_y - 24, y2=t_bottom, stroke=ROLLBACK, stroke_width=2,
                          stroke_dasharray="5 3"))
        marks.append(svg.label(rx, lane_y - 27, f"rollback: {rollback['unit']}", 11, "middle", ROLLBACK,
                               "rollback-label", "600"))
    few = len(drawn) <= 16
    for u in drawn:
        ux = x(u["step"])
        colour = svg.USABLE_COLOUR.get(u["usable_for"], svg.USABLE_COLOUR["none"])
        when = f", written {_utc(mtimes[u['unit']])}" if mtimes.get(u["unit"]) else ""
        tip = f"{u['unit']}: step {u['step']}, {svg.USABLE_WORDS.get(u['usable_for'], u['usable_for'])}{when}"
        marks.append(mark("circle", f"unit-mark usable-{u['usable_for']}", title=tip, cx=ux, cy=lane_y, r=8,
                          fill=colour, stroke="#ffffff", stroke_width=1.5, data_unit=u["unit"]))
        if few:
            marks.append(svg.label(ux, lane_y + 24, str(u["step"]), 11, "middle", svg.MUTED, "unit-step"))
    marks += _write_times(drawn, mtimes, late, x, t_top, t_bottom)
    marks += svg.x_axis(x, t_bottom + 8, [] if few else svg.ticks(x.d0, x.d1, 8), "step")
    caption = ("Units by step, coloured by what they are usable for; the dashed blue line is the rollback point. "
               "Lower panel: when each unit's files were last written. ")
    if late:
        caption += "Ringed: " + "; ".join(f"{u} was modified {late[u]['seconds']:.3g} s after {late[u]['unit']} "
                                          f"(step {late[u]['step']}) was written" for u in late) + ". "
    if stepless:
        caption += f"Not drawn (no step): {', '.join(stepless)}."
    return svg.chart("chart-timeline", "Run timeline", caption.strip(), t_bottom + 45, marks)


def _write_times(drawn: List[dict], mtimes: Dict[str, int], late: Dict[str, dict], x: svg.Scale,
                 top: float, bottom: float) -> List[dict]:
    timed = [u for u in drawn if mtimes.get(u["unit"])]
    if not timed:
        return [svg.label(LEFT, (top + bottom) / 2, "no write times recorded", 12, fill=svg.MUTED)]
    t0 = min(mtimes[u["unit"]] for u in timed)
    rel = {u["unit"]: (mtimes[u["unit"]] - t0) / 1e9 for u in timed}
    span = max(rel.values())
    name, size = _time_unit(span)
    y = svg.Scale(*svg.padded(0.0, span / size, 0.08), bottom, top)
    out = svg.y_axis(y, LEFT, WIDTH - RIGHT, svg.ticks(y.d0, y.d1, 4), lambda v: f"+{svg.num(v)} {name}")
    out.append(svg.label(LEFT, top - 8, f"time since the first write ({_utc(t0)})", 11, fill=svg.MUTED,
                         cls="axis-label"))
    out.append(svg.polyline([(x(u["step"]), y(rel[u["unit"]] / size)) for u in timed], "#9e9e9e", "write-order",
                            width=1.2))
    for u in timed:
        px, py = x(u["step"]), y(rel[u["unit"]] / size)
        colour = svg.USABLE_COLOUR.get(u["usable_for"], svg.USABLE_COLOUR["none"])
        out.append(mark("rect", "write-mark", title=f"{u['unit']} written {_utc(mtimes[u['unit']])}",
                        x=px - 5, y=py - 5, width=10, height=10, fill=colour))
        if u["unit"] in late:
            v = late[u["unit"]]
            out.append(mark("circle", "late-write", title=f"{u['unit']} was modified after {v['unit']} "
                            f"(step {v['step']}) was written", cx=px, cy=py, r=11, fill="none", stroke=LATE,
                            stroke_width=3))
            right = px > WIDTH * 0.65  # keep the words inside the chart
            out.append(svg.label(px - 15 if right else px + 15, py + 4, f"modified after {v['unit']} was written", 11,
                                 "end" if right else "start", LATE, "late-label"))
    return out
