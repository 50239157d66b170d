"""The report's plain words: one headline sentence per damaged unit, and why a layer of a unit was not checked.

The headline box of report.html says what happened to each unit that is not usable for resume in one
sentence without byte offsets or hashes (those stay in the findings section): the cause in words
(:data:`PHRASES`, else the finding's kind spelt out), whether an *older* unit was silently corrupted
(its bytes changed after a newer unit was saved) and, for a warm-start-only unit, what it lacks.
:func:`layer_cells` gives every unit × layer cell of the table its findings, ``ok``, or
``not checked`` with the reason (``not loaded: file errors``), never a blank.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from .text import step_text

#: kind -> the cause in a few plain words
PHRASES = {
    "checksum_mismatch": "its bytes changed after it was saved (SHA-256 differs from its sidecar)",
    "chunk_checksum_mismatch": "part of its bytes changed after it was saved (chunk checksum differs)",
    "zip_crc_mismatch": "a member fails its CRC check (its bytes changed after the save)",
    "size_mismatch_vs_manifest": "its size differs from the manifest",
    "truncated_zip_no_central_directory": "the file is cut short (the save did not finish)",
    "truncated_in_data": "the file is cut short inside its tensor data",
    "truncated_legacy_pickle": "the file is cut short",
    "dcp_shard_too_short": "a shard is cut short",
    "dcp_metadata_missing": "the save never committed (no .metadata)",
    "dcp_shard_missing": "a shard file is missing",
    "ds_rank_files_missing": "files of some ranks are missing",
    "megatron_rank_missing": "model-parallel rank folders are missing",
    "unit_file_missing": "a file of the unit is missing",
    "manifest_file_missing": "a file its manifest lists is missing",
    "empty_file": "the file is empty",
    "all_zero_file": "the file holds only zero bytes",
    "zero_filled_head": "its first bytes are zeros",
    "zero_filled_span": "a span of its bytes is zeroed",
    "zero_filled_tail": "its last bytes are zeros",
    "git_lfs_pointer": "it is a Git LFS pointer, not the checkpoint",
    "html_error_page": "it is an HTML error page, not a checkpoint",
    "text_error_page": "it is a text error page, not a checkpoint",
    "unit_in_progress": "the save was still in progress",
    "unit_changed_during_audit": "it changed while it was audited",
    "load_failed": "torch.load fails on it",
    "nan_in_weights": "its weights hold NaN or Inf values",
    "missing_model_weights": "no model weights were found in it",
    "missing_optimizer_state": "optimizer state missing",
    "empty_optimizer_state": "optimizer state empty",
    "nonfinite_optimizer_state": "optimizer state holds NaN or Inf values",
    "weights_only_checkpoint": "it holds weights only (no optimizer or step)",
    "state_file_unreadable": "a training-state file cannot be read",
    "step_not_increasing": "its step does not follow the run's order",
    "malicious_pickle_code_exec": "its pickle would run code when loaded",
    "pickle_obfuscation": "its pickle hides what it imports",
    "missing_keys": "weights the model needs are missing",
    "size_mismatch": "tensor shapes do not match the model",
    "model_args_mismatch": "it was saved for a different model configuration",
}
#: kinds that mean the bytes changed after the save: silent corruption when the unit is not the newest
CORRUPTION = {"checksum_mismatch", "chunk_checksum_mismatch", "zip_crc_mismatch", "zip_member_header_corrupted",
              "zip_central_directory_corrupted", "zero_filled_span", "zero_filled_head", "size_mismatch_vs_manifest",
              "legacy_storage_size_mismatch"}
SEVERITY = ("error", "warning", "info")


def phrase(kind: str) -> str:
    return PHRASES.get(kind) or kind.replace("_", " ")


def _causes(findings: List[dict], caps: str) -> List[dict]:
    """The findings that set the unit's use to ``caps`` (errors first); all errors when none carries caps."""
    hit = [f for f in findings if f.get("caps") == caps] or [f for f in findings if f.get("severity") == "error"]
    return sorted(hit, key=lambda f: SEVERITY.index(f["severity"]) if f.get("severity") in SEVERITY else 9)


def _join(words: List[str]) -> str:
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def unit_sentence(u: dict, newest: Optional[str], rollback: Optional[str], late: Optional[dict]) -> Optional[str]:
    """One plain sentence for a damaged unit (None for a unit usable for resume)."""
    if u["usable_for"] == "resume":
        return None
    name = f"{u['unit']} ({step_text(u['step'])})"
    causes = _causes(u["findings"], "warm-start" if u["usable_for"] == "warm-start" else "none")
    words = _join([phrase(f["kind"]) for f in causes]) if causes else "it could not be checked"
    if u["usable_for"] == "warm-start":
        so = "the run can only warm-start from it" if u["unit"] == rollback else "it is usable for warm-start only"
        return f"{words[:1].upper()}{words[1:]} in {name}, so {so}."
    kinds = {f["kind"] for f in causes}
    older = newest is not None and u["unit"] != newest
    if kinds & CORRUPTION and older:
        s = f"{name} is unusable: silent corruption of an older unit — {words}"
    else:
        s = f"{name}{', the newest unit,' if u['unit'] == newest else ''} is unusable: {words}"
    if late:
        s += f"; it was modified after {late['unit']} ({step_text(late['step'])}), a newer unit, was written"
    return s + "."


def headline(verdict: dict, late: Dict[str, dict]) -> List[str]:
    """The headline box: the recommendation, then one sentence per damaged unit (newest first), then pointers."""
    out = list(verdict.get("reasons", [])[:1])
    newest = (verdict.get("newest") or {}).get("unit")
    rollback = (verdict.get("rollback") or {}).get("unit")
    for u in reversed(verdict.get("units", [])):
        s = unit_sentence(u, newest, rollback, late.get(u["unit"]))
        if s:
            out.append(s)
    for p in verdict.get("pointers", []):
        if not p.get("ok"):
            out.append(f"The pointer {p['path']} names {p['target'] or 'nothing'}, which is not usable ({phrase(p['kind'])}).")
    return out


def skip_reason(findings: List[dict], scan_row: Optional[dict]) -> str:
    """Why the structure and state layers of a unit were not checked."""
    if any(f["layer"] == "security" and f["severity"] == "error" for f in findings):
        return "not loaded: security findings"
    if any(f["layer"] == "file" and f["severity"] == "error" for f in findings):
        return "not loaded: file errors"
    if scan_row is None:
        return "not scanned"
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
