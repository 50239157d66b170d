"""SARIF 2.1.0 of an audit's findings, for GitHub code scanning and other CI viewers.

Built from ``verdict.json``: one ``run`` whose tool is ckptaudit, one ``reportingDescriptor`` (rule) per
finding kind that occurs — its id the kind, its help the kind's next step, its ``properties`` the layer and
the detector that decides it (:data:`ckptaudit.findings.CATALOGUE`) — and one ``result`` per finding of every
unit and pointer.  Levels follow severity (``error`` → ``error``, ``warning`` → ``warning``, ``info`` →
``note``).  Each result is located at the file it is about, relative to the run folder (``uriBaseId``
``RUNROOT``, given as a file URI in ``originalUriBaseIds``); its ``properties`` keep the unit, layer, what the
unit is usable for, the next step and the runnable repair, so nothing the report says is lost.

Format facts from the OASIS SARIF 2.1.0 standard (errata 01): ``version`` "2.1.0", the ``$schema`` URI, result
``level`` values ``none|note|warning|error``, ``artifactLocation.uri`` relative to a ``uriBaseId``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _uri(path: str) -> str:
    """A relative URI reference for a path inside the run (percent-encoded as RFC 3986 wants)."""
    from urllib.parse import quote

    return quote(path.replace("\\", "/"), safe="/")


def _result(f: dict, unit: str, usable_for: str, rules: Dict[str, int]) -> dict:
    where = f.get("path") or unit
    props = {"unit": unit, "layer": f.get("layer"), "next_step": f.get("next_step", "")}
    if usable_for:
        props["unit_usable_for"] = usable_for
    if f.get("repair"):
        props["repair"] = f["repair"]
    return {
        "ruleId": f["kind"],
        "ruleIndex": rules[f["kind"]],
        "level": _LEVEL.get(f.get("severity"), "none"),
        "message": {"text": f.get("message") or f["kind"]},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(where), "uriBaseId": "RUNROOT"}}}],
        "properties": props,
    }


def from_verdict(v: dict) -> dict:
    """The SARIF log (a dict, ready for ``json.dump``) of verdict ``v``."""
    from .._version import __version__
    from ..findings import CATALOGUE

    found: List[tuple] = [(f, u["unit"], u["usable_for"]) for u in v.get("units") or [] for f in u["findings"]]
    on_units = {json.dumps(f, sort_keys=True) for f, _, _ in found}  # a pointer's finding may be a unit's too
    found += [(f, f.get("path") or "", "") for f in v.get("pointer_findings") or []
              if f and json.dumps(f, sort_keys=True) not in on_units]
    found += [(f, f.get("path") or ".", "") for f in v.get("run_findings") or [] if f]
    first_of: Dict[str, dict] = {}
    for f, _, _ in found:  # one pass: each kind's first finding describes its rule
        first_of.setdefault(f["kind"], f)
    kinds = sorted(first_of)
    rules = {k: i for i, k in enumerate(kinds)}
    descriptors = []
    for k in kinds:
        entry = CATALOGUE.get(k)
        first = first_of[k]
        descriptors.append({
            "id": k,
            "name": "".join(w.capitalize() for w in k.split("_")),
            "shortDescription": {"text": k.replace("_", " ")},
            "fullDescription": {"text": first.get("message") or k},
            "help": {"text": (entry.next_step if entry else first.get("next_step")) or k},
            "defaultConfiguration": {"level": _LEVEL.get(entry.severity if entry else first.get("severity"), "none")},
            "properties": {"layer": entry.layer if entry else first.get("layer"),
                           "detector": entry.detector if entry else first.get("detector", "")},
        })
    root = Path(v.get("run_dir") or ".")
    base = root.resolve().as_uri() + "/" if "://" not in str(root) else str(root).rstrip("/") + "/"
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "ckptaudit", "version": __version__, "rules": descriptors}},
            "originalUriBaseIds": {"RUNROOT": {"uri": base}},
            "results": [_result(f, unit, use, rules) for f, unit, use in found],
            "properties": {"recommendation": v.get("recommendation"), "rollback": v.get("rollback")},
        }],
    }


def write(v: dict, path: str | Path) -> None:
    """Write the SARIF log of verdict ``v`` to ``path`` (UTF-8 JSON)."""
    Path(path).write_text(json.dumps(from_verdict(v), indent=2) + "\n", encoding="utf-8")


__all__ = ["from_verdict", "write", "SCHEMA_URI"]
