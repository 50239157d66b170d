"""What each file of a unit is for, and how much a damaged file costs the unit.

A unit's files play roles: ``weights`` (the model's parameters), training
state (``optimizer``, ``scheduler``, ``scaler``, ``rng``, ``sampler``,
``custom``, ``trainer_state``), ``metadata`` (read by people and tools, not by
the resume: ``training_args.bin``, ``config.json`` under a Trainer resume), or
``mixed`` (one file holds everything, as ``torch.save`` of a training dict
does).  Roles come from the layout adapter (file names are the layout's
structure) and, when one matches, the producer contract.

The cost of a file-layer error follows the role: damaged weights leave
nothing (``none``); damaged training state alone leaves the weights for a
warm start; damaged metadata does not stop a resume.
"""

from __future__ import annotations

import json
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["TRAINING_STATE", "roles_for", "damaged_files", "weights_intact", "capped"]

TRAINING_STATE = frozenset({"optimizer", "scheduler", "scaler", "rng", "sampler", "custom", "trainer_state"})

# role -> {layout: base-name pattern}.  A file takes the first role, in this order, whose pattern for its
# layout matches its base name ("mixed" when none does).  Within a layout only the weights pattern overlaps
# another (tokenizer.index.json), and weights comes first.
_ROLE_PATTERNS: Dict[str, Dict[str, str]] = {
    "weights": {
        "hf-trainer": r"(model(-\d+-of-\d+)?\.safetensors|pytorch_model.*\.bin|.*\.index\.json|adapter_model\..*)",
        "accelerate": r"(model(_\d+)?\.safetensors|pytorch_model(_\d+)?\.bin|.*\.index\.json)",
        "deepspeed": r".*model_states\.pt"},
    # ZeRO-3 keeps the weights in the optimizer files: see roles_for
    "optimizer": {"hf-trainer": r"optimizer\.pt", "accelerate": r"optimizer(_\d+)?\.bin",
                  "deepspeed": r".*optim_states\.pt"},
    "scheduler": {"hf-trainer": r"scheduler\.pt", "accelerate": r"scheduler(_\d+)?\.bin"},
    "scaler": {"hf-trainer": r"scaler\.pt", "accelerate": r"scaler\.pt"},
    "sampler": {"accelerate": r"(sampler(_\d+)?\.bin|dl_state_dict(_\d+)?\.bin)"},
    "rng": {"hf-trainer": r"rng_state.*\.pth", "accelerate": r"random_states_\d+\.pkl"},
    "custom": {"accelerate": r"custom_checkpoint_\d+\.pkl"},
    "trainer_state": {"hf-trainer": r"trainer_state\.json"},
    "metadata": {
        "hf-trainer": r"(training_args\.bin|config\.json|generation_config\.json|tokenizer.*|special_tokens_map\.json"
                      r"|.*\.jinja|.*\.md|.*\.txt|vocab\..*|merges\.txt)",
        "deepspeed": r"zero_to_fp32\.py"},
    "mixed": {"dcp": r"\.metadata"},
}
# layout -> [(compiled pattern, role)] in role order
_LAYOUT_ROLES: Dict[str, List[Tuple["re.Pattern[str]", str]]] = {}
for _role, _by_layout in _ROLE_PATTERNS.items():
    for _layout, _pattern in _by_layout.items():
        _LAYOUT_ROLES.setdefault(_layout, []).append((re.compile(_pattern), _role))


def roles_for(layout: str, files: Sequence[str], facts: Optional[dict] = None) -> Dict[str, str]:
    """{run-relative file: role} for a unit's files under its layout (or as the unit's adapter
    read them, ``facts["role_hints"]``: a ckptaudit manifest's declared roles)."""
    facts = facts or {}
    hints = facts.get("role_hints") or {}
    patterns = _LAYOUT_ROLES.get(layout, ())
    out: Dict[str, str] = {}
    for f in files:
        if hints.get(f):
            out[f] = hints[f]
            continue
        base = f.rsplit("/", 1)[-1]
        role = next((r for pat, r in patterns if pat.fullmatch(base)), "mixed")
        if layout == "deepspeed" and role == "optimizer" and (facts.get("zero_stage") or 0) >= 3:
            role = "weights"  # ZeRO-3: the fp32 weights are partitioned into the optimizer files
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
