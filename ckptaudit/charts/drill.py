"""The drill report's charts: continuation loss and learning rate, step by step, against the schedule.

One chart per device that continued training: the upper panel is the loss of each update after the
restore, the lower the learning rate each update used (points) and, when the restore hook gives
``lr_at(step)``, the schedule's rate for the same steps (a dashed line).  A point off the dashed
line is an LR that does not continue the schedule (a re-warm-up, a reset scheduler).
"""

from __future__ import annotations

import math
from typing import List, Mapping, Optional

from . import svg
from .svg import LEFT, RIGHT, WIDTH, mark

LOSS, LR, SCHEDULE = "#6a1b9a", "#1565c0", "#ef6c00"
PANEL = 110


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _panel(x: svg.Scale, steps: List[int], values: List[Optional[float]], top: float, colour: str, cls: str,
           words: str, extra: Optional[List[Optional[float]]] = None) -> List[dict]:
    bottom = top + PANEL
    everything = [v for v in values + (extra or []) if _finite(v)]
    out = [svg.label(10, top + 16, words, 12, fill=colour, weight="600"),
           mark("line", "axis", x1=LEFT, x2=WIDTH - RIGHT, y1=bottom, y2=bottom, stroke=svg.MUTED)]
    if not everything:
        return out + [svg.label(LEFT + 8, top + PANEL / 2, "no finite values", 12, fill=svg.MUTED)]
    y = svg.Scale(*svg.padded(min(everything), max(everything), 0.12), bottom - 4, top + 8)
    out += svg.y_axis(y, LEFT, WIDTH - RIGHT, svg.ticks(y.d0, y.d1, 3))
    if extra and any(_finite(v) for v in extra):
        out.append(svg.polyline([(x(s), y(v)) for s, v in zip(steps, extra) if _finite(v)], SCHEDULE,
                                "schedule-line", dash="7 4", width=3))
    pts = [(s, v) for s, v in zip(steps, values) if _finite(v)]
    if not extra:  # against a schedule the LR used is drawn as points only, so the dashed line shows through
        out.append(svg.polyline([(x(s), y(v)) for s, v in pts], colour, f"series {cls}-line", width=1.5))
    for s, v in pts:
        out.append(mark("circle", f"{cls}-point", title=f"update after step {s}: {v:.6g}", cx=x(s), cy=y(v), r=4.5,
                        fill=colour))
    return out


def build(device: Mapping) -> Optional[dict]:
    """The chart of one device entry of ``drill.json`` (its ``trace``); None without a trace."""
    trace = [e for e in device.get("trace") or [] if isinstance(e.get("step"), int)]
    if not trace:
        return None
    steps = [e["step"] for e in trace]
    x = svg.Scale(*svg.padded(min(steps), max(steps), 0.04), LEFT, WIDTH - RIGHT)
    lr = [(e.get("lr") or [None])[0] for e in trace]
    sched = [(e.get("lr_schedule") or [None])[0] for e in trace]
    has_sched = any(_finite(v) for v in sched)
    marks = svg.legend(LEFT, 16, [(LOSS, "loss"), (LR, "LR used (param group 0)")]
                       + ([(SCHEDULE, "schedule LR (hook's lr_at)")] if has_sched else []))
    marks += _panel(x, steps, [e.get("loss") for e in trace], 30, LOSS, "loss", "loss (nats)")
    marks += _panel(x, steps, lr, 30 + PANEL + 24, LR, "lr", "learning rate", sched if has_sched else None)
    bottom = 30 + 2 * PANEL + 24
    marks += svg.x_axis(x, bottom + 8, steps if len(steps) <= 20 else svg.ticks(x.d0, x.d1, 8), "update after step")
    how = ("the dashed line is the schedule's LR for the same steps" if has_sched
           else "the hook gives no lr_at(step), so no schedule line is drawn")
    return svg.chart(f"chart-drill-{device.get('device') or 'device'}",
                     f"Continuation on {device.get('device') or 'device'}: loss and learning rate",
                     f"Loss and learning rate of each update after the restore; {how}.", bottom + 45, marks)
