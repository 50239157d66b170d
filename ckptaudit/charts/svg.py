"""Chart primitives: linear scales, round tick values and their labels, and SVG marks as plain data.

A chart is a dict ``{"id", "title", "caption", "width", "height", "marks", "notes"}``; each mark is
``{"tag", "attrs", "text", "title"}`` (an SVG element, its attributes, its text and its tooltip) and
each note ``{"n", "text"}`` (a numbered line printed under the chart, its number printed by the marks
it explains).  Coordinates are in the chart's own ``viewBox`` units; the page scales the SVG to its width.
``templates/_charts.html.j2`` writes the marks out, escaped, so no chart holds markup of its own.

Nothing a reader needs is only in a tooltip: values are read off axes with 3 to 7 round ticks
(:func:`nice_ticks`, labelled by :func:`tick_labels`), reasons are printed as labels or notes, and
each kind of mark has its own shape as well as its colour (:data:`USABLE_SHAPE`), so a page printed
in black and white still reads.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

WIDTH = 1000
LEFT, RIGHT = 150, 40
INK, GRID, MUTED = "#1b1b1b", "#e3e3e3", "#666666"
USABLE_COLOUR = {"resume": "#2e7d32", "warm-start": "#f9a825", "none": "#c62828"}
USABLE_WORDS = {"resume": "resume", "warm-start": "warm-start only", "none": "unusable"}
USABLE_SHAPE = {"resume": "circle", "warm-start": "diamond", "none": "triangle"}
#: multiples of ten each tick step may be (times a power of ten)
NICE = (1, 2, 5)
SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
BINARY = ((1024.0 ** 4, "TiB"), (1024.0 ** 3, "GiB"), (1024.0 ** 2, "MiB"), (1024.0, "KiB"))
CHAR_W = 6.5  # width of one character of 11-unit text, for deciding whether a label has room

Mark = Dict[str, Any]


def mark(tag: str, cls: str = "", title: str = "", text: str = "", **attrs: Any) -> Mark:
    """One SVG element; ``stroke_width`` becomes ``stroke-width``; floats are rounded to 0.1."""
    a = {k.replace("_", "-"): (round(v, 1) if isinstance(v, float) else v) for k, v in attrs.items()
         if v is not None}
    if cls:
        a = {"class": cls, **a}
    return {"tag": tag, "attrs": a, "text": text, "title": title}


def chart(cid: str, title: str, caption: str, height: int, marks: List[Mark],
          notes: Optional[List[dict]] = None) -> dict:
    """The chart dict the template draws; ``notes`` are ``{"n", "text"}`` printed under it."""
    return {"id": cid, "title": title, "caption": caption, "width": WIDTH, "height": height, "marks": marks,
            "notes": notes or []}


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


def step_scale(steps: Sequence[int], r0: float = LEFT, r1: float = WIDTH - RIGHT) -> Scale:
    """The x scale of training ``steps``: their range padded by 4 %, and by at least one step each side, so
    that :func:`nice_ticks` (``integer=True, outer=False``) finds three whole steps to label."""
    lo, hi = min(steps, default=0), max(steps, default=1)
    a, b = padded(lo, hi, 0.04)
    return Scale(min(a, lo - 1.04), max(b, hi + 1.04), r0, r1)


def step_ticks(scale: Scale) -> List[float]:
    """Whole-step ticks inside ``scale``'s domain, 3 to 7 of them."""
    return nice_ticks(scale.d0, scale.d1, outer=False, integer=True)


def _candidates(lo: float, hi: float, outer: bool, integer: bool):
    """(step, [multiples of the step]) from fine to coarse: steps 1, 2, 5 × 10^k around the span."""
    k = math.floor(math.log10(hi - lo))
    for e in range(k - 2, k + 2):
        for m in NICE:
            step = float(f"{m}e{e}")
            if integer and step < 1:
                continue
            a, b = lo / step, hi / step
            i0, i1 = (math.floor(a + 1e-9), math.ceil(b - 1e-9)) if outer else (math.ceil(a - 1e-9),
                                                                                math.floor(b + 1e-9))
            # i·m × 10^e written out in decimal, so 3 × 0.0002 is 0.0006, not 0.0006000000000000001
            yield step, [float(f"{i * m}e{e}") for i in range(i0, i1 + 1)]


def nice_ticks(lo: float, hi: float, most: int = 7, fewest: int = 3, outer: bool = True, integer: bool = False,
               unit: float = 1.0) -> List[float]:
    """Round tick values for data from ``lo`` to ``hi``: ``fewest`` to ``most`` of them, 1, 2 or 5 × 10^k apart.

    ``outer``: the first tick is at or below ``lo`` and the last at or above ``hi`` (a value axis whose
    domain is then ``ticks[0]..ticks[-1]``); else every tick lies inside ``[lo, hi]`` (an axis whose domain
    is already set).  ``integer``: steps of at least 1 (training steps).  ``unit``: ticks are round
    multiples of it (1024**3 gives round GiB).  Equal values get a span of 10 % of their size around them
    (one unit around 0), so a flat series still has ``fewest`` distinct ticks."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    lo, hi = min(lo, hi) / unit, max(lo, hi) / unit
    if hi - lo <= 1e-12 * max(abs(lo), abs(hi)):
        d = abs(lo) * 0.1 or 1.0
        lo, hi = lo - (max(d, 1.0) if integer else d), hi + (max(d, 1.0) if integer else d)
    prev: List[float] = []
    for _, ts in _candidates(lo, hi, outer, integer):  # fine to coarse: fewer ticks each time
        if len(ts) <= most:
            if len(ts) < fewest and fewest <= len(prev) <= 2 * most:
                ts = prev  # a step between two nice ones would fit: take the finer one's few extra ticks
            return [t * unit for t in ts]  # fewer than fewest only for whole steps over a span under 2
        prev = ts
    return [t * unit for t in prev]


def byte_ticks(lo: float, hi: float, most: int = 7) -> List[float]:
    """:func:`nice_ticks` for byte counts: round numbers of the binary unit (KiB … TiB) of the larger end."""
    big = max(abs(lo), abs(hi))
    return nice_ticks(lo, hi, most, unit=next((s for s, _ in BINARY if big >= s), 1.0))


def _sci(v: float) -> str:
    """``v`` in the fewest significant digits that give it back: ``1.25e-4``, ``2.5e-4``, ``1e-3``."""
    for p in range(13):
        s = f"{v:.{p}e}"
        if math.isclose(float(s), v, rel_tol=1e-9):
            break
    mant, exp = s.split("e")
    return f"{mant}e{int(exp)}"


def _decimals(vals: Sequence[float]) -> int:
    """The fewest decimals that write every value exactly (at most 12)."""
    scale = max(abs(v) for v in vals) or 1.0
    return next((d for d in range(13) if all(abs(round(v, d) - v) <= 1e-9 * scale for v in vals)), 12)


def tick_labels(ticks: Sequence[float], kind: str = "number") -> List[str]:
    """Short labels that tell neighbouring ``ticks`` apart.

    ``kind="number"``: ``0.25``/``0.50`` (one decimal count for the axis), ``12 k``/``1.5 M`` from 10 000 up,
    ``1.25e-4`` below 0.01 and from 10^15 up.  ``kind="bytes"`` (ticks from :func:`byte_ticks`): ``512 MiB``,
    ``1.5 GiB``, in the largest binary unit that writes every tick in two decimals at most."""
    ts = list(ticks)
    if not ts:
        return []
    big = max(abs(t) for t in ts)
    if kind == "bytes":  # the largest unit that writes every tick in two decimals at most
        size, name = next(((s, n) for s, n in BINARY if big >= s and _decimals([t / s for t in ts]) <= 2),
                          (1.0, "B"))
        d = _decimals([t / size for t in ts])
        return [f"{t / size:.{d}f} {name}" for t in ts]
    if big == 0:
        return ["0" for _ in ts]
    if big < 1e-2 or big >= 1e15:
        return ["0" if t == 0 else _sci(t) for t in ts]
    if big >= 1e4:
        size, name = next((s, n) for s, n in SI if big >= s)
        d = _decimals([t / size for t in ts])
        return ["0" if t == 0 else f"{t / size:.{d}f} {name}" for t in ts]
    d = _decimals(ts)
    return [f"{t:.{d}f}" for t in ts]


def value_label(v: float) -> str:
    """One value on its own, compactly: ``4.25``, ``0.000125`` → ``1.25e-4``, ``12500`` → ``12.5 k``."""
    return tick_labels([float(f"{v:.4g}")])[0]


def relative_spread(lo: float, hi: float) -> Optional[str]:
    """Words for a spread far below the values' magnitude (under 0.1 %), e.g. ``varies by 0.00082 %``."""
    big = max(abs(lo), abs(hi))
    if not (big > 0 and 0 < hi - lo < 1e-3 * big):
        return None
    return f"varies by {(hi - lo) / big * 100:.2g} % ({lo:.7g} to {hi:.7g})"


def x_axis(scale: Scale, y: float, values: Sequence[float], label: str = "", top: Optional[float] = None,
           labels: Optional[Sequence[str]] = None) -> List[Mark]:
    """A horizontal axis line at ``y`` with tick marks and labels; grid lines up to ``top`` when given."""
    out = [mark("line", "axis", x1=scale.r0, x2=scale.r1, y1=y, y2=y, stroke=MUTED)]
    for v, words in zip(values, labels or tick_labels(values)):
        x = scale(v)
        if top is not None:
            out.append(mark("line", "grid", x1=x, x2=x, y1=top, y2=y, stroke=GRID))
        out.append(mark("line", "tick-mark", x1=x, x2=x, y1=y, y2=y + 4, stroke=MUTED))
        out.append(mark("text", "tick", text=words, x=x, y=y + 16, text_anchor="middle", font_size=11, fill=INK))
    if label:
        out.append(mark("text", "axis-label", text=label, x=scale.r1, y=y + 31, text_anchor="end", font_size=11,
                        fill=INK))
    return out


def y_axis(scale: Scale, x0: float, x1: float, values: Sequence[float],
           labels: Optional[Sequence[str]] = None) -> List[Mark]:
    """Tick labels left of ``x0`` and grid lines across to ``x1`` (``scale`` maps values to y)."""
    out = []
    for v, words in zip(values, labels or tick_labels(values)):
        y = scale(v)
        out.append(mark("line", "grid", x1=x0, x2=x1, y1=y, y2=y, stroke=GRID))
        out.append(mark("text", "tick", text=words, x=x0 - 6, y=y + 4, text_anchor="end", font_size=11, fill=INK))
    return out


def label(x: float, y: float, text: str, size: int = 12, anchor: str = "start", fill: str = INK,
          cls: str = "label", weight: str = "") -> Mark:
    """A text mark at ``(x, y)`` (the baseline), ``anchor`` start/middle/end."""
    return mark("text", cls, text=text, x=x, y=y, text_anchor=anchor, font_size=size, fill=fill,
                font_weight=weight or None)


def polyline(points: Sequence[Tuple[float, float]], colour: str, cls: str, dash: str = "", width: float = 2.0) -> Mark:
    """A line through ``points`` (chart units)."""
    return mark("polyline", cls, points=" ".join(f"{x:.1f},{y:.1f}" for x, y in points), fill="none",
                stroke=colour, stroke_width=width, stroke_dasharray=dash or None)


def symbol(shape: str, x: float, y: float, r: float, fill: str, cls: str = "", title: str = "", **attrs: Any) -> Mark:
    """A filled mark of about the area of a circle of radius ``r`` centred on ``(x, y)``.

    ``shape``: circle, square, diamond (a square on its corner) or triangle (pointing up)."""
    if shape == "square":
        s = r * 1.77
        return mark("rect", cls, title, x=x - s / 2, y=y - s / 2, width=s, height=s, fill=fill, **attrs)
    if shape in ("diamond", "triangle"):
        if shape == "diamond":
            d = r * 1.25
            pts = ((x, y - d), (x + d, y), (x, y + d), (x - d, y))
        else:
            s = r * 2.7  # the side of an equilateral triangle of the circle's area
            h = s * 0.866
            pts = ((x, y - h * 2 / 3), (x + s / 2, y + h / 3), (x - s / 2, y + h / 3))
        return mark("polygon", cls, title, points=" ".join(f"{a:.1f},{b:.1f}" for a, b in pts), fill=fill, **attrs)
    return mark("circle", cls, title, cx=x, cy=y, r=r, fill=fill, **attrs)


def legend(x: float, y: float, items: Sequence[Tuple[str, str, str]]) -> List[Mark]:
    """``(colour, words, shape)`` left to right from ``(x, y)``, each drawn as its marks are.

    ``shape``: one of :func:`symbol`'s, or ``line`` / ``dash`` (a solid or dashed stroke), ``ring`` (a circle
    outline), ``hollow`` (a white circle with a grey outline)."""
    out: List[Mark] = []
    for colour, words, shape in items:
        if shape in ("line", "dash"):
            out.append(mark("line", "legend-swatch", x1=x - 2, x2=x + 14, y1=y - 3, y2=y - 3, stroke=colour,
                            stroke_width=3, stroke_dasharray="5 3" if shape == "dash" else None))
        elif shape in ("ring", "hollow"):
            ring = shape == "ring"
            out.append(mark("circle", "legend-swatch", cx=x + 6, cy=y - 3, r=6.5 if ring else 5, stroke=colour,
                            fill="none" if ring else "#ffffff", stroke_width=3.5 if ring else 1.5))
        else:
            out.append(symbol(shape, x + 6, y - 3, 6, colour, "legend-swatch"))
        out.append(label(x + 19, y + 1, words, 11, fill=INK, cls="legend-label"))
        x += 32 + CHAR_W * len(words)
    return out


def spaced(xs: Iterable[Tuple[float, str]], size: int = 11, gap: float = 6.0) -> List[bool]:
    """For labels centred on ``x``, in order, which can be printed without touching the last one printed."""
    out, end = [], -math.inf
    for x, words in xs:
        half = len(words) * CHAR_W * size / 11 / 2
        fits = x - half >= end + gap
        out.append(fits)
        if fits:
            end = x + half
    return out
