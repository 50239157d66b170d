"""Chart primitives: linear scales, round tick values, and SVG marks as plain data for the template to draw.

A chart is a dict ``{"id", "title", "caption", "width", "height", "marks"}``; each mark is
``{"tag", "attrs", "text", "title"}`` (an SVG element, its attributes, its text and its tooltip).
Coordinates are in the chart's own ``viewBox`` units; the page scales the SVG to its width.
``templates/_charts.html.j2`` writes the marks out, escaped, so no chart holds markup of its own.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

WIDTH = 1000
LEFT, RIGHT = 150, 40
INK, GRID, MUTED = "#1b1b1b", "#e3e3e3", "#666666"
USABLE_COLOUR = {"resume": "#2e7d32", "warm-start": "#f9a825", "none": "#c62828"}
USABLE_WORDS = {"resume": "resume", "warm-start": "warm-start only", "none": "unusable"}

Mark = Dict[str, Any]


def mark(tag: str, cls: str = "", title: str = "", text: str = "", **attrs: Any) -> Mark:
    """One SVG element; ``stroke_width`` becomes ``stroke-width``; floats are rounded to 0.1."""
    a = {k.replace("_", "-"): (round(v, 1) if isinstance(v, float) else v) for k, v in attrs.items()
         if v is not None}
    if cls:
        a = {"class": cls, **a}
    return {"tag": tag, "attrs": a, "text": text, "title": title}


def chart(cid: str, title: str, caption: str, height: int, marks: List[Mark]) -> dict:
    return {"id": cid, "title": title, "caption": caption, "width": WIDTH, "height": height, "marks": marks}


class Scale:
    """Linear map from a data interval to a pixel interval (an empty interval is widened by one unit)."""

    def __init__(self, d0: float, d1: float, r0: float, r1: float):
        if d1 <= d0:
            d0, d1 = d0 - 1, d1 + 1
        self.d0, self.d1, self.r0, self.r1 = float(d0), float(d1), float(r0), float(r1)

    def __call__(self, v: float) -> float:
        return self.r0 + (float(v) - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)


def padded(lo: float, hi: float, frac: float = 0.05) -> Tuple[float, float]:
    """``(lo, hi)`` widened by ``frac`` of the span on each side (one unit when the span is 0)."""
    span = hi - lo
    pad = span * frac if span > 0 else max(abs(lo) * frac, 1.0)
    return lo - pad, hi + pad


def ticks(lo: float, hi: float, n: int = 5) -> List[float]:
    """Round values (1, 2 or 5 times a power of ten) between ``lo`` and ``hi``, about ``n`` of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    out, v = [], first
    while v <= hi + step * 1e-9:
        out.append(round(v, 12))
        v += step
    return out


def num(v: float) -> str:
    """A tick label: ``250``, ``2.5``, ``0.0003``, ``1.2e+06``."""
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.4g}"


def tick_format(values: Sequence[float]):
    """A label format with just enough decimals that neighbouring ``values`` (round ticks) read differently."""
    vs = sorted(set(values))
    steps = [b - a for a, b in zip(vs, vs[1:]) if b > a]
    if not steps or max(abs(v) for v in vs) >= 1e6:
        return num
    dec = min(12, max(0, -math.floor(math.log10(min(steps)) + 1e-9)))
    return lambda v: f"{v:.{dec}f}"


def relative_spread(lo: float, hi: float) -> Optional[str]:
    """Words for a spread far below the values' magnitude (under 0.1 %), e.g. ``varies by 0.00082 %``."""
    big = max(abs(lo), abs(hi))
    if not (big > 0 and 0 < hi - lo < 1e-3 * big):
        return None
    return f"varies by {(hi - lo) / big * 100:.2g} % ({lo:.7g} to {hi:.7g})"


def x_axis(scale: Scale, y: float, values: Iterable[float], label: str = "", top: Optional[float] = None,
           fmt=num) -> List[Mark]:
    """A horizontal axis line at ``y`` with tick labels; grid lines up to ``top`` when given."""
    out = [mark("line", "axis", x1=scale.r0, x2=scale.r1, y1=y, y2=y, stroke=MUTED)]
    for v in values:
        x = scale(v)
        if top is not None:
            out.append(mark("line", "grid", x1=x, x2=x, y1=top, y2=y, stroke=GRID))
        out.append(mark("text", "tick", text=fmt(v), x=x, y=y + 15, text_anchor="middle", font_size=11, fill=MUTED))
    if label:
        out.append(mark("text", "axis-label", text=label, x=scale.r1, y=y + 30, text_anchor="end", font_size=11,
                        fill=MUTED))
    return out


def y_axis(scale: Scale, x0: float, x1: float, values: Iterable[float], fmt=num) -> List[Mark]:
    """Tick labels left of ``x0`` and grid lines across to ``x1`` (``scale`` maps values to y)."""
    out = []
    for v in values:
        y = scale(v)
        out.append(mark("line", "grid", x1=x0, x2=x1, y1=y, y2=y, stroke=GRID))
        out.append(mark("text", "tick", text=fmt(v), x=x0 - 6, y=y + 4, text_anchor="end", font_size=11, fill=MUTED))
    return out


def label(x: float, y: float, text: str, size: int = 12, anchor: str = "start", fill: str = INK,
          cls: str = "label", weight: str = "") -> Mark:
    return mark("text", cls, text=text, x=x, y=y, text_anchor=anchor, font_size=size, fill=fill,
                font_weight=weight or None)


def polyline(points: Sequence[Tuple[float, float]], colour: str, cls: str, dash: str = "", width: float = 2.0) -> Mark:
    return mark("polyline", cls, points=" ".join(f"{x:.1f},{y:.1f}" for x, y in points), fill="none",
                stroke=colour, stroke_width=width, stroke_dasharray=dash or None)


def legend(x: float, y: float, items: Sequence[Tuple[str, str]]) -> List[Mark]:
    """Colour swatches with their words, left to right from ``(x, y)``."""
    out: List[Mark] = []
    for colour, words in items:
        out.append(mark("rect", "legend-swatch", x=x, y=y - 9, width=12, height=12, fill=colour))
        out.append(label(x + 17, y + 1, words, 11, fill=INK, cls="legend-label"))
        x += 30 + 6.5 * len(words)
    return out
