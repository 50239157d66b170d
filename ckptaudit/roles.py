"""What each file of a unit is for, and how much a damaged file costs the unit.

A unit's files play roles: ``weights`` (the model's parameters), training
state (``optimizer``, ``scheduler``, ``scaler``, ``rng``, ``sampler``,
``custom``, ``trainer_state``), ``metadata`` (read by people and tools, not by
the resume: ``training_args.bin``, ``config.json`` under a Trainer resume), or
``mixed`` (one file holds everything, as ``torch.save`` of a training dict
does).  Roles come from the base-name patterns of the producer whose layout
the unit has (:func:`ckptaudit.producers.for_layout`: file names are the layout's
structure) and, when one matches, the producer contract.

The cost of a file-layer error follows the role: damaged weights leave
nothing (``none``); damaged training state alone leaves the weights for a
warm start; damaged metadata does not stop a resume.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from . import producers

__all__ = ["TRAINING_STATE", "roles_for", "damaged_files", "weights_intact", "capped"]

TRAINING_STATE = frozenset({"optimizer", "scheduler", "scaler", "rng", "sampler", "custom", "trainer_state"})


@lru_cache(maxsize=None)
def _compiled(roles: Tuple[Tuple[str, str], ...]) -> Tuple[Tuple["re.Pattern[str]", str], ...]:
    """A producer's ``(role, pattern)`` pairs compiled, in order (one per producer: its roles are constant)."""
    return tuple((re.compile(pattern), role) for role, pattern in roles)


def roles_for(layout: str, files: Sequence[str], facts: Optional[dict] = None) -> Dict[str, str]:
    """{run-relative file: role} for a unit's files under its layout (or as the unit's adapter
    read them, ``facts["role_hints"]``: a ckptaudit manifest's declared roles)."""
    facts = facts or {}
    hints = facts.get("role_hints") or {}
    producer = producers.for_layout(layout)
    patterns = _compiled(producer.roles) if producer is not None else ()
    out: Dict[str, str] = {}
    for f in files:
        if hints.get(f):
            out[f] = hints[f]
            continue
        base = f.rsplit("/", 1)[-1]
        role = next((r for pat, r in patterns if pat.fullmatch(base)), "mixed")
        if producer is not None and producer.adjust_role is not None:
            role = producer.adjust_role(role, facts)
        out[f] = role
    return out


def damaged_files(findings: Iterable[dict]) -> List[str]:
    """Files named by file-layer errors."""
    return sorted({f.get("path", "") for f in findings if f.get("layer") == "file" and f.get("severity") == "error"})


def weights_intact(scan_row: dict) -> bool:
    """True when no file the weights depend on has a file-layer error."""
    if scan_row.get("file_ok"):
        return True
    facts = json.loads(scan_row.get("facts_json") or "{}")
    roles = facts.get("file_roles") or {}
    bad = damaged_files(json.loads(scan_row.get("findings_json") or "[]"))
    return bool(bad) and all(roles.get(p) in TRAINING_STATE or roles.get(p) == "metadata" for p in bad)


def capped(finding: dict, roles: Dict[str, str], intact: bool) -> str:
    """The caps of a file-layer finding given the role of the file it names."""
    if finding.get("layer") != "file" or finding.get("caps") != "none" or not intact:
        return finding.get("caps", "resume")
    role = roles.get(finding.get("path", ""))
    if role in TRAINING_STATE:
        return "warm-start"
    if role == "metadata":
        return "resume"
    return finding["caps"]
