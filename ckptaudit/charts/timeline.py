"""The run timeline chart: units by step shaped and coloured by usability, the rollback point, gaps, write times.

The upper lane places every unit with a step on a step axis, a green circle / amber diamond / red
triangle for resume / warm-start only / unusable; each unit not usable for resume is numbered under
its mark and its reason is printed, in the headline's words, under the chart.  A gap much longer than
the run's usual save interval is drawn dashed and labelled.  The lower panel plots each unit's write
time (mtime) against its step: a healthy run climbs left to right, and a unit modified after a newer
unit was written stands above its successors and is ringed and labelled (:func:`late_writes`), the
evidence of damage done after the fact.  A blue dashed line marks the rollback point across both.
"""

from __future__ import annotations

import datetime as _dt
import statistics
from typing import Dict, List, Optional, Tuple

from ..outputs.report_headline import unit_sentence
from . import svg
from .svg import LEFT, RIGHT, WIDTH, mark

LATE = "#8e24aa"
ROLLBACK = "#1565c0"
GAP = "#ef6c00"


def late_writes(units: List[dict], mtimes: Dict[str, int]) -> Dict[str, dict]:
    """{unit: the newest unit with a higher step that was written before it} for units written out of order.

    ``units`` carry ``unit`` and ``step``; ``mtimes`` are nanoseconds since the epoch.  "Newest" is the last such
    unit in step order.  O(n log n): the suffix minima of the write times, in step order, are non-decreasing, so
    the last unit written before ``t`` is found by bisection (a scan of every later unit for each unit took 22 s
    of the report of 10,000 units)."""
    from bisect import bisect_left, bisect_right

    known = sorted((u for u in units if u.get("step") is not None and mtimes.get(u["unit"])),
                   key=lambda u: u["step"])
    steps = [u["step"] for u in known]
    suffix_min = [mtimes[u["unit"]] for u in known]  # min of the write times from each position to the end
    for j in range(len(known) - 2, -1, -1):
        suffix_min[j] = min(suffix_min[j], suffix_min[j + 1])
    out: Dict[str, dict] = {}
    for u in known:
        t = mtimes[u["unit"]]
        j = bisect_left(suffix_min, t) - 1  # the last position whose write time is before t
        if j >= bisect_right(steps, u["step"]):  # ... and whose step is higher than u's
            v = known[j]
            out[u["unit"]] = {"unit": v["unit"], "step": v["step"], "seconds": (t - mtimes[v["unit"]]) / 1e9}
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


def build(units: List[dict], mtimes: Dict[str, int], rollback: Optional[dict], newest: Optional[str] = None) -> dict:
    """The timeline chart of the verdict's ``units`` (unit, step, usable_for, findings) with ``mtimes`` (ns).

    ``rollback`` is the verdict's ``{"unit", "step"}``; ``newest`` the newest unit's name (else the one with
    the highest step).  Every unit not usable for resume gets a number under its mark and its reason, in
    words, printed under the chart (``notes``)."""
    drawn = sorted((u for u in units if u.get("step") is not None), key=lambda u: u["step"])
    stepless = [u["unit"] for u in units if u.get("step") is None]
    late = late_writes(units, mtimes)
    steps = sorted({u["step"] for u in drawn})
    newest = newest or (drawn[-1]["unit"] if drawn else None)
    x = svg.step_scale(steps)
    lane_y, t_top, t_bottom = 62, 120, 250
    marks: List[dict] = [svg.label(10, lane_y + 4, "units", 12, weight="600"),
                         svg.label(10, (t_top + t_bottom) / 2, "write time", 12, weight="600"),
                         svg.label(10, (t_top + t_bottom) / 2 + 15, "(mtime)", 11)]
    usable = [(svg.USABLE_COLOUR[k], svg.USABLE_WORDS[k], svg.USABLE_SHAPE[k])
              for k in ("resume", "warm-start", "none")]
    marks += svg.legend(LEFT, 18, usable + [(ROLLBACK, "rollback point", "dash"),
                                            (LATE, "modified after a newer unit was written", "ring")])
    for a, b, irregular in gaps(steps):
        x0, x1 = x(a) + 9, x(b) - 9
        if x1 <= x0:
            continue
        if irregular:
            marks.append(mark("line", "gap gap-irregular", title=f"{b - a} steps between step {a} and step {b}",
                              x1=x0, x2=x1, y1=lane_y, y2=lane_y, stroke=GAP, stroke_width=3, stroke_dasharray="6 4"))
            marks.append(svg.label((x0 + x1) / 2, lane_y - 14, f"gap: {b - a} steps", 11, "middle", cls="gap-label"))
        else:
            marks.append(mark("line", "gap", title=f"{b - a} steps", x1=x0, x2=x1, y1=lane_y, y2=lane_y,
                              stroke="#bdbdbd", stroke_width=2))
    if rollback and rollback.get("step") is not None:
        rx = x(rollback["step"])
        marks.append(mark("line", "rollback-marker", title=f"rollback point: {rollback['unit']}",
                          x1=rx, x2=rx, y1=lane_y - 24, y2=t_bottom, stroke=ROLLBACK, stroke_width=2.5,
                          stroke_dasharray="5 3"))
        marks.append(svg.label(rx, lane_y - 27, f"rollback: {rollback['unit']}", 11, "middle", cls="rollback-label",
                               weight="600"))
    notes = _notes(drawn, newest, (rollback or {}).get("unit"), late)
    number = {n["unit"]: n["n"] for n in notes}
    step_room = svg.spaced((x(u["step"]), str(u["step"])) for u in drawn)
    note_room = svg.spaced((x(u["step"]), f"[{number[u['unit']]}]") for u in drawn if u["unit"] in number)
    for u, room in zip(drawn, step_room):
        ux = x(u["step"])
        kind = u["usable_for"] if u["usable_for"] in svg.USABLE_SHAPE else "none"
        when = f", written {_utc(mtimes[u['unit']])}" if mtimes.get(u["unit"]) else ""
        tip = f"{u['unit']}: step {u['step']}, {svg.USABLE_WORDS.get(u['usable_for'], u['usable_for'])}{when}"
        marks.append(svg.symbol(svg.USABLE_SHAPE[kind], ux, lane_y, 8, svg.USABLE_COLOUR[kind],
                                f"unit-mark usable-{u['usable_for']}", tip, stroke="#ffffff", stroke_width=1.5,
                                data_unit=u["unit"]))
        if room:
            marks.append(svg.label(ux, lane_y + 24, str(u["step"]), 11, "middle", cls="unit-step"))
    for u, room in zip([u for u in drawn if u["unit"] in number], note_room):
        if room:
            marks.append(svg.label(x(u["step"]), lane_y + 39, f"[{number[u['unit']]}]", 11, "middle",
                                   cls="unit-note", weight="700"))
    marks += _write_times(drawn, mtimes, late, x, t_top, t_bottom)
    marks += svg.x_axis(x, t_bottom + 8, svg.step_ticks(x), "step", top=t_top)
    caption = ("Shape and colour say what each unit is usable for; [n] under a unit points to its reason, listed "
               "above. Lower panel: when each unit's files were last written. ")
    if stepless:
        caption += f"Not drawn (no step): {', '.join(stepless)}."
    return svg.chart("chart-timeline", "Run timeline", caption.strip(), t_bottom + 45, marks,
                     [{"n": n["n"], "text": n["text"]} for n in notes])


def _notes(drawn: List[dict], newest: Optional[str], rollback: Optional[str], late: Dict[str, dict]) -> List[dict]:
    """``{"n", "unit", "text"}`` for each drawn unit not usable for resume, left to right: why, in words."""
    out = []
    for u in drawn:
        if u.get("usable_for") == "resume":
            continue
        words = unit_sentence({**u, "findings": u.get("findings") or []}, newest, rollback, late.get(u["unit"]))
        out.append({"n": len(out) + 1, "unit": u["unit"], "text": words})
    return out


def _write_times(drawn: List[dict], mtimes: Dict[str, int], late: Dict[str, dict], x: svg.Scale,
                 top: float, bottom: float) -> List[dict]:
    timed = [u for u in drawn if mtimes.get(u["unit"])]
    if not timed:
        return [svg.label(LEFT, (top + bottom) / 2, "no write times recorded", 12)]
    t0 = min(mtimes[u["unit"]] for u in timed)
    rel = {u["unit"]: (mtimes[u["unit"]] - t0) / 1e9 for u in timed}
    span = max(rel.values())
    name, size = _time_unit(span)
    tv = svg.nice_ticks(0.0, span / size or 1.0, most=5)
    y = svg.Scale(tv[0], tv[-1], bottom - 6, top + 6)
    out = svg.y_axis(y, LEFT, WIDTH - RIGHT, tv, [f"+{t} {name}" for t in svg.tick_labels(tv)])
    out.append(svg.label(LEFT, top - 8, f"time since the first write ({_utc(t0)})", 11, cls="axis-label"))
    out.append(svg.polyline([(x(u["step"]), y(rel[u["unit"]] / size)) for u in timed], "#9e9e9e", "write-order",
                            width=1.2))
    for u in timed:
        px, py = x(u["step"]), y(rel[u["unit"]] / size)
        kind = u["usable_for"] if u["usable_for"] in svg.USABLE_SHAPE else "none"
        out.append(svg.symbol(svg.USABLE_SHAPE[kind], px, py, 5.6, svg.USABLE_COLOUR[kind], "write-mark",
                              f"{u['unit']} written {_utc(mtimes[u['unit']])}"))
        if u["unit"] in late:
            v = late[u["unit"]]
            out.append(mark("circle", "late-write", title=f"{u['unit']} was modified after {v['unit']} "
                            f"(step {v['step']}) was written", cx=px, cy=py, r=12, fill="none", stroke=LATE,
                            stroke_width=4))
            right = px > WIDTH * 0.6  # keep the words inside the chart
            words = f"modified {v['seconds']:.3g} s after {v['unit']} was written"
            out.append(svg.label(px - 17 if right else px + 17, py + 4, words, 11,
                                 "end" if right else "start", cls="late-label", weight="600"))
    return out
