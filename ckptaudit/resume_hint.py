"""How to resume from the rollback point in its framework's own terms, when the framework's default pick is another unit.

The framework is the producer that resumes the rollback unit (:func:`ckptaudit.producers.for_unit`: by its
layout, or a plain ``.ckpt`` claimed by Lightning); each producer's module gives its resume call, its
default resume call and the unit that default takes, read from the framework's installed source.  A unit
of no such producer (plain ``torch.save`` files, safetensors) is resumed by a script that names the file
itself, so the hint is the path whenever the rollback point is not the newest unit.

:func:`instruction` is the one sentence the verdict's reasons, the end-of-audit summary and the
report's headline all print; None when the framework's default already resumes from the
rollback point (or there is nothing to resume).
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Tuple

from . import producers
from .producers.contract import Producer
from .producers.paths import base, join, parent

__all__ = ["instruction", "call", "framework_of", "default_pick", "PLAIN_CALL"]

#: The resume call of a unit no framework resumes.
PLAIN_CALL = 'load "{path}" in the resume script'


def _resumer(unit: dict) -> Optional[Producer]:
    p = producers.for_unit(unit)
    return p if p is not None and p.resume_call else None


def framework_of(unit: dict) -> str:
    """The key of the producer whose resume call resumes ``unit`` ("" for a plain file / unknown)."""
    p = _resumer(unit)
    return p.key if p is not None else ""


def call(framework: str, run_dir: str, unit: str) -> str:
    """The framework's own resume call for ``unit`` (run-relative) of the run at ``run_dir``: its template's
    ``{path}``, ``{dir}``, ``{tag}`` (the unit's base name) and ``{step}`` (the step its producer's naming puts
    in that name, :func:`ckptaudit.producers.name_step`; the name itself when none)."""
    p = producers.by_key(framework)
    template = p.resume_call if p is not None and p.resume_call else PLAIN_CALL
    step = producers.name_step(base(unit))
    return template.format(path=join(run_dir, unit), dir=join(run_dir, parent(unit)), tag=base(unit),
                           step=step if step is not None else base(unit))


def default_pick(v: dict, framework: str, rollback: str) -> Tuple[Optional[str], bool]:
    """(the unit the framework's default resume would take, whether a default exists) for the rollback
    unit's folder; the unit is None when the default names nothing the audit found."""
    p = producers.by_key(framework)
    if p is None or p.default_pick is None:
        return None, False
    return p.default_pick(v, parent(rollback))


def _same_state(v: dict, a: Optional[str], b: str) -> bool:
    """Whether resuming from ``a`` is resuming from ``b``: the same unit, or a copy of it usable for resume at
    the same step (Lightning's ``last.ckpt`` beside ``epoch=E-step=S.ckpt``)."""
    if a == b:
        return True
    by = {u["unit"]: u for u in v.get("units") or []}
    ua, ub = by.get(a or ""), by.get(b)
    return bool(ua and ub and ua["usable_for"] == "resume" and ua.get("step") is not None
                and ua.get("step") == ub.get("step"))


def instruction(v: Dict) -> Optional[str]:
    """One sentence: how to resume from the verdict's rollback point in its framework's terms, when the
    framework's default would resume from another unit (or fail); None when the default is right."""
    rb = v.get("rollback")
    if not rb or v.get("recommendation") != "resume":
        return None
    by = {u["unit"]: u for u in v.get("units") or []}
    unit = by.get(rb["unit"]) or {"unit": rb["unit"], "layout": ""}
    p = _resumer(unit)
    fw = p.key if p is not None else ""
    run_dir = str(v.get("run_dir") or "")
    if run_dir and "://" not in run_dir:  # printed where someone will paste it: never relative to another folder
        run_dir = os.path.abspath(run_dir)
    how = call(fw, run_dir, rb["unit"])
    pick, has_default = default_pick(v, fw, rb["unit"])
    if has_default and p is not None:
        if _same_state(v, pick, rb["unit"]):
            return None
        picked = f"would take {pick}" if pick else "would not find it"
        return (f"Resume from {rb['unit']} explicitly: {how}; {p.name}'s default "
                f"{p.default_call or 'resume'} {picked}.")
    newest = v.get("newest") or {}
    if newest.get("unit") in (None, rb["unit"]) or _same_state(v, newest.get("unit"), rb["unit"]):
        return None
    if p is not None:
        return f"Resume from {rb['unit']} explicitly: {how}; the newest unit is {newest['unit']}."
    return f"To resume, {how}, not the newest unit {newest['unit']}."
