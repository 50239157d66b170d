"""Short words the front prints: a unit's step as ``step 500`` or ``no step``, and long text clipped at a word."""

from __future__ import annotations

from typing import Optional


def step_text(step: Optional[int]) -> str:
    """``step 500``, or ``no step`` when neither the unit's name nor its contents give one.

    ``verdict._step_txt`` says the same for the verdict's reasons."""
    return "no step" if step is None else f"step {step}"


def clip(text: str, limit: int) -> str:
    """``text`` when it fits in ``limit`` characters, else cut at the last word boundary before it and ended
    with ``…`` (a single word longer than half the limit is cut inside, still with ``…``)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:([{'\"") + "…"


def size_text(n: int) -> str:
    """``n`` bytes in binary units with three significant figures: ``0 bytes``, ``512 bytes``, ``132 MiB``,
    ``1.25 GiB``."""
    if n < 1024:
        return f"{n} byte{'s' * (n != 1)}"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if n < 1000 else f"{n:.0f} {unit}"
    raise AssertionError("unreachable")
