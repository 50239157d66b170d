"""The report's headline box in plain words: the recommendation, then one sentence per damaged unit.

Each unit that is not usable for resume gets one sentence without byte offsets or hashes (those stay
in the findings section): the cause in words (:data:`PHRASES`, else the finding's kind spelt out),
whether an *older* unit was silently corrupted (its bytes changed after a newer unit was saved, and
whether it was modified after a newer unit was written) and, for a warm-start-only unit, what it lacks.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from ..resume_hint import instruction
from ..text import step_text

#: kind -> the cause in a few plain words
PHRASES = {
    "checksum_mismatch": "its bytes changed after it was saved (its SHA-256 differs from the recorded one)",
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
    hint = instruction(verdict)  # the framework's own call when its default resume would take another unit
    if hint:
        out.append(hint)
    newest = (verdict.get("newest") or {}).get("unit")
    rollback = (verdict.get("rollback") or {}).get("unit")
    for u in reversed(verdict.get("units", [])):
        s = unit_sentence(u, newest, rollback, late.get(u["unit"]))
        if s:
            out.append(s)
    poisoned = [u for u in verdict.get("units", []) if any(f["kind"] == "nan_in_weights" for f in u["findings"])]
    if poisoned:
        first = poisoned[0]
        out.append(f"The first unit with NaN or Inf weights is {first['unit']} ({step_text(first['step'])}); "
                   "every later unit inherits the divergence.")
    if any(u["unit"] == rollback and any(f.get("repair") for f in u["findings"]) for u in verdict.get("units", [])):
        out.append(f"Before using {rollback}, apply the repair printed under its findings.")
    out += [pointer_sentence(p) for p in verdict.get("pointers", []) if not p.get("ok")]
    out += [f"{e['unit']} {_entry_state(e)}: replace it or resume with an explicit path."
            for e in verdict.get("resume_entries", []) if not e.get("ok")]
    if verdict.get("salvage"):  # the salvage offer and its command, as the terminal summary gives it
        out.append(verdict["salvage"]["sentence"])
    return out


def _entry_state(e: dict) -> str:
    """What is wrong with resume entry ``e`` of the verdict and what its call would do, as a predicate."""
    if (e.get("finding") or {}).get("kind") == "resume_entry_weights_only":
        return f"holds weights only, so {e['call']} would not restore the training state"
    return f"is damaged, so {e['call']} would fail"


def pointer_sentence(p: dict) -> str:
    """One sentence for a broken pointer (``latest``, a symlink, a Megatron tracker) of the verdict."""
    path, target, kind = p["path"], p.get("target") or "nothing", p.get("kind") or ""
    if kind in ("latest_pointer_dangling", "dangling_symlink"):
        return f"The pointer {path} names {target}, which does not exist."
    if kind in ("latest_pointer_incomplete", "symlink_target_unusable"):
        return f"The pointer {path} names {target}, which is not usable."
    if kind == "megatron_tracker_invalid":
        return f"The pointer {path} does not hold an iteration number."
    if kind == "pointer_refused":
        return f"The pointer {path} is a link the audit does not follow."
    return f"The pointer {path} is not usable ({phrase(kind)})."
