"""Which unit the drill restores: the verdict's rollback point or ``--unit``, never a refused one; the exit code."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from .contract import EXIT_FAILED, EXIT_NO_UNIT, EXIT_PASSED, EXIT_PROBLEM, INFRA_CHECKS


def security_errors(unit: Mapping[str, Any]) -> List[dict]:
    """The unit's findings of layer ``security`` and severity ``error``."""
    return [f for f in unit.get("findings", []) if f.get("layer") == "security" and f.get("severity") == "error"]


def refusal(unit: Mapping[str, Any]) -> Optional[str]:
    """Why the drill must not restore ``unit`` (a verdict entry), or None."""
    sec = security_errors(unit)
    if sec:
        kinds = ", ".join(sorted({f["kind"] for f in sec}))
        return (f"{unit['unit']}: refused: the audit found security errors ({kinds}); the drill never loads "
                "such a unit, not even with weights_only=True")
    if unit.get("usable_for") == "none":
        kinds = ", ".join(sorted({f["kind"] for f in unit.get("findings", []) if f.get("severity") == "error"}))
        return (f"{unit['unit']}: refused: the audit marks it unusable ({kinds or 'usable_for none'}); "
                "drill a unit the verdict can use")
    return None


def drill_order(u: Mapping[str, Any]) -> int:
    """Sort key of a verdict unit: its step (-1 when unknown)."""
    return u["step"] if u.get("step") is not None else -1


def _hits(units: Sequence[Mapping[str, Any]], unit: str) -> List[Any]:
    return [u for u in units if u["unit"] == unit] or [u for u in units if u["unit"].rsplit("/", 1)[-1] == unit]


def unknown_unit(verdict: Mapping[str, Any], unit: Optional[str]) -> bool:
    """True when ``unit`` (``--unit``/``drill.unit``) names no unit of the verdict: a usage error (exit 3)."""
    return bool(unit) and not _hits(list(verdict.get("units") or []), unit or "")


def select_unit(verdict: Mapping[str, Any], unit: Optional[str] = None
                ) -> Tuple[Optional[dict], Optional[dict], str]:
    """(the unit to drill, the next later drillable unit or None, why none) from a verdict.

    ``unit`` (a path relative to the run folder, or a base name) overrides the verdict's rollback point.
    The first element is None when there is nothing to drill; the third then says why.  A refused
    unit is returned as None too (see :func:`refusal`)."""
    units = list(verdict.get("units") or [])
    if unit:
        hits = _hits(units, unit)
        if not hits:
            names = ", ".join(repr(u["unit"]) for u in units) or "none"
            return None, None, f"{unit}: not a unit of the audited run (units: {names})"
        chosen = hits[0]
    else:
        rb = verdict.get("rollback")
        if not rb:
            return None, None, (f"the audit found no restorable unit (recommendation "
                                f"{verdict.get('recommendation', '?')!r}, no rollback point)")
        chosen = next((u for u in units if u["unit"] == rb["unit"]), None)
        if chosen is None:
            return None, None, f"{rb['unit']}: the verdict's rollback point is not among its units"
    why = refusal(chosen)
    if why:
        return None, None, why
    later = sorted((u for u in units if u.get("step") is not None and chosen.get("step") is not None
                    and u["step"] > chosen["step"] and refusal(u) is None), key=drill_order)
    return chosen, (later[0] if later else None), ""


def exit_code(rows: Sequence[Mapping[str, Any]], infra_failed: bool, no_unit: bool) -> int:
    """0 passed, 1 a check failed, 2 no restorable unit, 3 the drill itself failed (1 wins over 3, except
    when the unit changed during the drill: then no check speaks for it)."""
    if no_unit:
        return EXIT_NO_UNIT
    if any(r["check"] == "unit_stable" and r["status"] == "fail" for r in rows):
        return EXIT_FAILED
    if any(r["status"] == "fail" and r["check"] not in INFRA_CHECKS for r in rows):
        return EXIT_PROBLEM
    if infra_failed:
        return EXIT_FAILED
    return EXIT_PASSED
