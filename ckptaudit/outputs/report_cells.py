"""What each unit × layer cell of report.html says: the layer's findings, ``ok``, or ``not checked`` and why.

A layer a unit was not checked at (its structure and state when the file layer already failed, say)
reads ``not checked (not loaded: file errors)``, never a blank cell that looks like a pass.
Whether a layer was checked is read from the stage's own row: a hash or scan row (file), the scan's
``security_ok`` (security), the structure row's ``weights_component`` and the state row's ``has_weights``.
"""

from __future__ import annotations

from typing import Dict, List, Optional

SEVERITY = ("error", "warning", "info")


def skip_reason(findings: List[dict], scan_row: Optional[dict]) -> str:
    """Why the structure and state layers of a unit were not checked."""
    if any(f["layer"] == "security" and f["severity"] == "error" for f in findings):
        return "not loaded: security findings"
    if any(f["layer"] == "file" and f["severity"] == "error" for f in findings):
        return "not loaded: file errors"
    if scan_row is None:
        return "not scanned"
    if any(f["kind"] == "missing_model_weights" for f in findings):
        return "no model weights found"
    return "nothing readable to check"


def _checked(layer: str, unit: str, rows: Dict[str, Dict[str, dict]]) -> bool:
    if layer == "file":
        return unit in rows["hash"] or unit in rows["scan"]
    if layer == "security":
        return rows["scan"].get(unit, {}).get("security_ok") is not None
    if layer == "structure":
        return rows["structure"].get(unit, {}).get("weights_component") is not None
    return rows["state"].get(unit, {}).get("has_weights") is not None


def layer_cells(verdict: dict, all_tables: Dict[str, List[dict]], layers) -> Dict[str, Dict[str, dict]]:
    """{unit: {layer: {"status": error|warning|info|ok|not-checked, "findings": [...], "why": words}}}."""
    rows = {t: {r["unit"]: r for r in all_tables.get(t, [])} for t in ("hash", "scan", "structure", "state")}
    out: Dict[str, Dict[str, dict]] = {}
    for u in verdict.get("units", []):
        cells = out.setdefault(u["unit"], {})
        for layer in layers:
            fs = [f for f in u["findings"] if f["layer"] == layer]
            status = next((s for s in SEVERITY if any(f["severity"] == s for f in fs)), "ok")
            why = ""
            if not fs and not _checked(layer, u["unit"], rows):
                status = "not-checked"
                why = skip_reason(u["findings"], rows["scan"].get(u["unit"])) if layer in ("structure", "state") \
                    else "not scanned"
            cells[layer] = {"status": status, "findings": fs, "why": why}
    return out
