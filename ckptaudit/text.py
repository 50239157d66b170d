"""Short words the front prints about a unit: its step as ``step 500`` or ``no step``."""

from __future__ import annotations

from typing import Optional


def step_text(step: Optional[int]) -> str:
    """``step 500``, or ``no step`` when neither the unit's name nor its contents give one.

    ``verdict._step_txt`` says the same for the verdict's reasons."""
    return "no step" if step is None else f"step {step}"
