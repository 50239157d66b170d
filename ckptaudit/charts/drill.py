"""The drill report's charts: continuation loss and learning rate, step by step, against the schedule.

One chart per device that continued training: the upper panel is the loss of each update after the
restore, the lower the learning rate each update used (points) and, when the restore hook gives
``lr_at(step)``, the schedule's rate for the same steps (a dashed line).  A point off the dashed
line is an LR that does not continue the schedule (a re-warm-up, a reset scheduler): it is numbered,
and the rates it used and the schedule gives are printed under the chart.
"""

from __future__ import annotations

import math
from typing import List, Mapping, Optional, Tuple

from . import svg
from .svg import LEFT, RIGHT, WIDTH, mark

LOSS, LR, SCHEDULE = "#6a1b9a", "#1565c0", "#ef6c00"
PANEL = 130
#: off-schedule updates named one by one in the note; past this many, the first ones and a count
NAMED = 4


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def off_schedule(steps: List[int], lr: List[Optional[float]], sched: List[Optional[float]]
                 ) -> List[Tuple[int, float, float]]:
    """(step, LR used, schedule's LR) of the updates whose LR differs from the schedule's by over 0.1 %."""
    return [(s, v, w) for s, v, w in zip(steps, lr, sched)
            if _finite(v) and _finite(w) and not math.isclose(v, w, rel_tol=1e-3, abs_tol=1e-15)]


def _note(off: List[Tuple[int, float, float]], total: int) -> str:
    said = "; ".join(f"after step {s} it used {svg.value_label(v)} where the schedule gives {svg.value_label(w)}"
                     for s, v, w in off[:NAMED])
    more = f"; and {len(off) - NAMED} more" if len(off) > NAMED else ""
    return f"LR off the schedule at {len(off)} of {total} updates: {said}{more}."


def _panel(x: svg.Scale, steps: List[int], values: List[Optional[float]], top: float, colour: str, cls: str,
           words: str, extra: Optional[List[Optional[float]]] = None) -> List[dict]:
    bottom = top + PANEL
    everything = [v for v in values + (extra or []) if _finite(v)]
    out = [svg.label(10, top + 16, words, 12, weight="600"),
           mark("line", "axis", x1=LEFT, x2=WIDTH - RIGHT, y1=bottom, y2=bottom, stroke=svg.MUTED)]
    if not everything:
        return out + [svg.label(LEFT + 8, top + PANEL / 2, "no finite values", 12)]
    tv = svg.nice_ticks(min(everything), max(everything))
    y = svg.Scale(tv[0], tv[-1], bottom - 6, top + 8)
    out += svg.y_axis(y, LEFT, WIDTH - RIGHT, tv)
    if extra and any(_finite(v) for v in extra):
        out.append(svg.polyline([(x(s), y(v)) for s, v in zip(steps, extra) if _finite(v)], SCHEDULE,
                                "schedule-line", dash="7 4", width=3))
    pts = [(s, v) for s, v in zip(steps, values) if _finite(v)]
    if not extra:  # against a schedule the LR used is drawn as points only, so the dashed line shows through
        out.append(svg.polyline([(x(s), y(v)) for s, v in pts], colour, f"series {cls}-line", width=1.5))
    for s, v in pts:
        out.append(mark("circle", f"{cls}-point", title=f"update after step {s}: {v:.6g}", cx=x(s), cy=y(v), r=4.5,
                        fill=colour))
    if extra:
        off = off_schedule(steps, values, extra)
        for (s, v, _), room in zip(off, svg.spaced((x(s), "[1]") for s, _, _ in off)):
            if room:
                out.append(svg.label(x(s) + 7, y(v) - 7, "[1]", 11, cls="off-schedule-note", weight="700"))
    return out


def build(device: Mapping) -> Optional[dict]:
    """The chart of one device entry of ``drill.json`` (its ``trace``: step, loss, lr and lr_schedule per
    param group); None without a trace.  Updates off the schedule are listed in the chart's ``notes``."""
    trace = [e for e in device.get("trace") or [] if isinstance(e.get("step"), int)]
    if not trace:
        return None
    steps = [e["step"] for e in trace]
    x = svg.step_scale(steps)
    lr = [(e.get("lr") or [None])[0] for e in trace]
    sched = [(e.get("lr_schedule") or [None])[0] for e in trace]
    has_sched = any(_finite(v) for v in sched)
    marks = svg.legend(LEFT, 16, [(LOSS, "loss", "circle"), (LR, "LR used (param group 0)", "circle")]
                       + ([(SCHEDULE, "schedule LR (hook's lr_at)", "dash")] if has_sched else []))
    marks += _panel(x, steps, [e.get("loss") for e in trace], 30, LOSS, "loss", "loss (nats)")
    marks += _panel(x, steps, lr, 30 + PANEL + 24, LR, "lr", "learning rate", sched if has_sched else None)
    bottom = 30 + 2 * PANEL + 24
    marks += svg.x_axis(x, bottom + 8, svg.step_ticks(x), "update after step")
    off = off_schedule(steps, lr, sched) if has_sched else []
    notes = [{"n": 1, "text": _note(off, len(steps))}] if off else []
    how = ("the dashed line is the schedule's LR for the same steps" if has_sched
           else "the hook gives no lr_at(step), so no schedule line is drawn")
    if off:
        how += "; the points marked [1] are off it (listed under the chart)"
    return svg.chart(f"chart-drill-{device.get('device') or 'device'}",
                     f"Continuation on {device.get('device') or 'device'}: loss and learning rate",
                     f"Loss and learning rate of each update after the restore; {how}.", bottom + 50, marks, notes)
