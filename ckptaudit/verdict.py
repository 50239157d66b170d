"""The verdict: join every layer, read the run as a whole, pick the rollback point.

``verdict.json`` (schema ``ckptaudit.verdict/1``) is a stable contract; every key it has::

    {"schema": "ckptaudit.verdict/1", "run_dir": "...",
     "recommendation": "resume" | "warm-start" | "retrain",
     "rollback": {"unit": "<path relative to run_dir>", "step": 400} | null,
     "steps_lost": 100 | null,
     "newest": {"unit", "step"} | null,
     "alternatives": [{"unit", "step", "usable_for", "steps_lost"}],
     "reasons": ["plain words", ...],
     "units": [{"unit", "step", "layout", "usable_for", "findings": [...],
                "last_hashed_utc": "2026-12-03T15:46:38+00:00" | null, "reverified": true,
                "last_verified_utc": "2026-12-03T15:46:38+00:00" | null,
                "verification_note": "" | "not verified since 2026-11-28 02:14 UTC" | "never verified",
                "digests": [{"file", "digest_algorithm": "sha256" | "blake3", "digest_hex"}]}],
     "pointers": [{"path", "target", "ok", "kind"}],
     "pointer_findings": [{finding}, ...],
     "run_findings": [{finding}, ...],      # about the run, no unit's: leftovers of dead writers
     "resume_entries": [{"unit", "framework", "call", "ok", "finding"}],
     "resume_hint": "Resume from … explicitly: trainer.train(resume_from_checkpoint=…); …" | null,
     "bytes_verified": {"audit_started_utc", "reuse": false, "units_reverified": 6, "units_reused": 0,
                        "verified_bytes": 7288498, "verify_budget": "2TiB" | null, "verify_budget_bytes": … | null,
                        "over_budget": false, "units_never_verified": 0, "oldest_verification_utc": … | null,
                        "digest_algorithms": {"blake3": 4, "sha256": 2}}}

:func:`build` writes all but the byte-verification keys, which the report adds from the hash table
(``bytes_verified``, each unit's ``last_hashed_utc`` — its least recently hashed file — and ``reverified``:
hashed by this audit; :func:`ckptaudit.stages.report.run_report`), and when each unit's bytes were last verified
(``last_verified_utc``, ``verification_note``: :func:`ckptaudit.verification.budget.annotate`);
``digests``: each file's digest named by its algorithm, SHA-256 where a sidecar, manifest or integrity.json records
one, else the audit's own BLAKE3 (:func:`ckptaudit.stages.report.run_report`).

A unit's ``usable_for`` is the minimum of its findings' caps (see
:mod:`ckptaudit.findings`), taken once, after every detector that judges the unit ran (:func:`build`);
the pointers are judged against it by their own detector (:mod:`ckptaudit.pointer_judgements`).  The rollback point is the newest unit usable for
``resume``; newer warm-start units are listed as alternatives with the steps
each option loses.  With no resumable unit the newest warm-start unit is the
rollback point; with neither the recommendation is ``retrain``.  ``steps_lost``
counts from the newest unit's step (damaged or not).

``resume_entries`` are the files a framework resumes from when told "the latest"
(:mod:`ckptaudit.resume_entry`: Lightning's ``last.ckpt``); ``resume_hint`` says how to
resume from the rollback point in its framework's own terms when that framework's default
would take another unit (:mod:`ckptaudit.resume_hint`), else null.

Exit codes (:func:`exit_code`): 0 when the newest unit is usable for resume *and* every resume
entry is intact; 1 when a roll back is needed and possible — also when the newest intact unit is
the rollback point but the run's configured resume entry is damaged (a cron job resuming with
``ckpt_path="last"`` would crash: exit 0 would tell it to go ahead); 2 retrain; 3 audit failed.
"""

from __future__ import annotations

import json
from typing import Dict, List, Optional

from . import findings as F
from . import cut_walk, dead_writers, pointer_judgements, resume_entry, resume_hint, roles, save_groups
from .run_findings import name_counts_saves, run_findings, save_key, save_order, unit_step
from .text import step_text

SCHEMA = "ckptaudit.verdict/1"
EXIT_NEWEST_OK, EXIT_ROLLBACK, EXIT_RETRAIN, EXIT_FAILED = 0, 1, 2, 3


def _loads(s: Optional[str]) -> List[dict]:
    return json.loads(s) if s else []


_STAGES = ("hash", "scan", "load", "structure", "configdiff", "state")


def rows_by_unit(tables: Dict[str, List[dict]]) -> Dict[str, List[dict]]:
    """{unit: its rows of every stage's table, in stage order}: one pass over the tables, so the verdict
    costs rows + units, not rows × units."""
    out: Dict[str, List[dict]] = {}
    for name in _STAGES:
        for r in tables.get(name, []):
            out.setdefault(r["unit"], []).append(r)
    return out


def unit_findings(unit: str, tables: Dict[str, List[dict]], by_unit: Optional[Dict[str, List[dict]]] = None
                  ) -> List[dict]:
    """Every stage's findings on ``unit``, de-duplicated; ``by_unit`` (:func:`rows_by_unit`) saves a scan."""
    out: List[dict] = []
    for r in (by_unit if by_unit is not None else rows_by_unit(tables)).get(unit, []):
        out.extend(_loads(r.get("findings_json")))
    # de-duplicate identical findings (a kind on the same path with the same message)
    seen, uniq = set(), []
    for f in out:
        k = (f["kind"], f.get("path"), f["message"])
        if k not in seen:
            seen.add(k)
            uniq.append(f)
    return uniq


def _weigh_by_role(fl: List[dict], scan_row: Optional[dict]) -> List[dict]:
    """File-layer findings weighed by what the damaged file is for (:mod:`ckptaudit.roles`):
    a damaged optimizer or RNG file leaves intact weights usable for a warm start."""
    if not scan_row:
        return fl
    file_roles = (json.loads(scan_row.get("facts_json") or "{}").get("file_roles")) or {}
    intact = roles.weights_intact(scan_row)
    out = []
    for f in fl:
        caps = roles.capped(f, file_roles, intact)
        if caps != f.get("caps"):
            f = {**f, "caps": caps, "detail": {**(f.get("detail") or {}), "file_role": file_roles.get(f.get("path"))}}
        out.append(f)
    return out


def build(inv: dict, tables: Dict[str, List[dict]], cfg: dict) -> dict:
    """The verdict document from the inventory and every stage's rows.

    Each unit's findings are gathered from the detectors that judge it (every stage's, the run's, the cut
    walk's, the files that changed during the audit), and its ``usable_for`` is taken from them once
    (:func:`_judged`).  Before that judgement the verdict still edits two things of the stages' findings: a
    file-layer finding's cap is weighed by the damaged file's role (:func:`_weigh_by_role`), and
    ``step_name_disagrees`` (capped ``resume``) is dropped when the run shows its names count saves.  Detectors that run on those judgements then add findings without changing one:
    pointer judgements (:mod:`ckptaudit.pointer_judgements`) and resume entries (:mod:`ckptaudit.resume_entry`)
    join a unit only findings capped at a level it already holds.  One exception lowers a judgement: a file of
    a save loaded with other ranks' files (NVRx) is judged alone first, and ``save_spoiled_by_another_rank``
    (:mod:`ckptaudit.save_groups`) then lowers it to ``none`` — its usability is taken a second time, from
    that finding and the level it held.  No detector's list is changed in place: each unit's list is built anew.
    """
    state_rows = {r["unit"]: r for r in tables.get("state", [])}
    scan_rows = {r["unit"]: r for r in tables.get("scan", [])}
    gathered = _gathered(inv, tables, cfg, state_rows, scan_rows)
    units_out, leftovers = dead_writers.split(gathered)  # one run finding, not a unit each
    if name_counts_saves(units_out):  # a save index, not a step: the name's step is no evidence against the unit
        units_out = [{**u, "findings": [f for f in u["findings"] if f["kind"] != "step_name_disagrees"],
                      "name_is_save_index": True} for u in units_out]
    units_out = [_judged(u) for u in units_out]
    spoiled = save_groups.findings(units_out)  # a rank's file is no rollback point when its save's other is damaged
    units_out = [_lowered(u, spoiled[u["unit"]]) if u["unit"] in spoiled else u for u in units_out]
    pointers = pointer_judgements.judge(inv.get("pointers", []), units_out)
    units_out = _joined(units_out, pointers.on_units)
    entries = resume_entry.entry_findings(units_out, inv["run_dir"])
    units_out = _joined(units_out, {e["unit"]: [e["finding"]] for e in entries if e["finding"]})
    doc = decide(inv["run_dir"], units_out, pointers.rows, entries)
    left = dead_writers.finding(leftovers, inv["run_dir"])
    doc["run_findings"] = [left] if left else []
    return doc


def _gathered(inv: dict, tables: Dict[str, List[dict]], cfg: dict, state_rows: Dict[str, dict],
              scan_rows: Dict[str, dict]) -> List[dict]:
    """The verdict units, in the inventory's order, each with the findings of every detector that judges it
    (``unit``, ``step``, ``name_step``, ``layout``, ``size_bytes``, ``findings``); no ``usable_for`` yet."""
    structure_rows = {r["unit"]: r for r in tables.get("structure", [])}
    by_run = run_findings(inv["units"], state_rows, structure_rows, cfg, scan_rows)
    load_rows = rows_by_unit({"load": tables.get("load", [])})
    cuts = cut_walk.findings([u["unit"] for u in inv["units"]], scan_rows, state_rows, load_rows)
    changed = inv.get("changed_during_audit") or {}
    by_unit = rows_by_unit(tables)
    out = []
    for u in inv["units"]:
        name = u["unit"]
        fl = _weigh_by_role(unit_findings(name, tables, by_unit) + by_run.get(name, []) + cuts.get(name, [])
                            + changed.get(name, []), scan_rows.get(name))
        out.append({"unit": name, "step": unit_step(u, state_rows.get(name)), "name_step": u.get("step_from_name"),
                    "layout": u["layout"], "size_bytes": u["size_bytes"], "findings": fl})
    return out


def _judged(u: dict) -> dict:
    """Verdict unit ``u`` with its ``usable_for``: the minimum of its findings' caps, taken once
    (:func:`ckptaudit.findings.usable_for`)."""
    return {**u, "usable_for": F.usable_for(u["findings"])}


def _lowered(u: dict, added: List[dict]) -> dict:
    """Judged unit ``u`` with ``added`` (findings about it that only its save group shows) after its own, and its
    ``usable_for`` lowered by their caps from the level it held."""
    return {**u, "findings": u["findings"] + added, "usable_for": F.usable_for(added, start=u["usable_for"])}


def _joined(units_out: List[dict], added: Dict[str, List[dict]]) -> List[dict]:
    """The judged units, each with the findings ``added`` to it (``{unit: [finding dict]}``) after its own; the
    detectors that make them join a unit only findings capped at a level it holds, so ``usable_for`` stands."""
    return [{**u, "findings": u["findings"] + added[u["unit"]]} if u["unit"] in added else u for u in units_out]


def decide(run_dir: str, units_out: List[dict], pointers: List[dict], entries: List[dict] = ()) -> dict:
    ordered = sorted(units_out, key=save_key)
    newest = ordered[-1] if ordered else None
    lost = _steps_lost(ordered)
    rollback, rec, alternatives = _rollback_of(ordered)
    reasons = _reasons(ordered, rollback, rec, alternatives, lost, pointers)
    for e in entries:
        if not e["ok"] and e.get("finding"):
            reasons.append(e["finding"]["message"] + " " + e["finding"]["next_step"])
    doc = {
        "schema": SCHEMA,
        "run_dir": run_dir,
        "recommendation": rec,
        "rollback": {"unit": rollback["unit"], "step": rollback["step"]} if rollback else None,
        "steps_lost": lost(rollback) if rollback else None,
        "newest": {"unit": newest["unit"], "step": newest["step"]} if newest else None,
        "alternatives": [{"unit": a["unit"], "step": a["step"], "usable_for": a["usable_for"],
                          "steps_lost": lost(a)} for a in reversed(alternatives)],
        "reasons": reasons,
        "units": [{k: u[k] for k in ("unit", "step", "layout", "usable_for", "findings")} for u in ordered],
        "pointers": [{"path": p["path"], "target": p["target"], "ok": p["ok"], "kind": p["kind"]} for p in pointers],
        "pointer_findings": [p["finding"] for p in pointers if p.get("finding")],
        "resume_entries": [dict(e) for e in entries],
    }
    doc["resume_hint"] = resume_hint.instruction(doc)
    if doc["resume_hint"]:
        reasons.insert(1, doc["resume_hint"])
    return doc


def _steps_lost(ordered: List[dict]):
    """``lost(unit)``: the steps between ``unit`` and the newest unit of the run (units in save order), from
    the steps recorded in the units when the name is a save index or has no step, else from the names'
    order; None when unknown."""
    newest_step = max((save_order(u) for u in ordered if save_order(u) >= 0), default=None)
    content = [u["step"] for u in ordered if u["step"] is not None]

    def lost(u):
        if u["step"] is not None and content and (u.get("name_is_save_index") or u.get("name_step") is None):
            return max(content) - u["step"]  # steps recorded in the units themselves
        if newest_step is None or save_order(u) < 0:
            return None
        return newest_step - save_order(u)

    return lost


def _rollback_of(ordered: List[dict]) -> tuple:
    """``(rollback unit, recommendation, alternatives)``: the newest unit usable for resume (with the newer
    warm-start units as alternatives), else the newest usable for a warm start, else retrain."""
    resume = [u for u in ordered if u["usable_for"] == "resume"]
    warm = [u for u in ordered if u["usable_for"] == "warm-start"]
    if resume:
        return resume[-1], "resume", [u for u in warm if save_key(u) > save_key(resume[-1])]
    if warm:
        return warm[-1], "warm-start", []
    return None, "retrain", []


def _first_error(u: dict) -> Optional[dict]:
    errs = [f for f in u["findings"] if f["severity"] == "error"]
    order = {"security": 0, "file": 1, "structure": 2, "state": 3}
    return sorted(errs, key=lambda f: order.get(f["layer"], 9))[0] if errs else None


def _reasons(ordered, rollback, rec, alternatives, lost, pointers) -> List[str]:
    """The verdict's reasons, in plain words: what to do first, then why each newer unit is passed over, where
    non-finite weights begin, the repairs the rollback point needs, the alternatives, and pointer problems."""
    if not ordered:
        return ["No checkpoint unit was found in the run folder."]
    newer = [u for u in ordered if rollback is None or save_key(u) > save_key(rollback)]
    r = [why for u in reversed(newer) for why in [_passed_over(u)] if why]
    poisoned = [u for u in ordered if any(f["kind"] == "nan_in_weights" for f in u["findings"])]
    if poisoned:
        r.append(f"The first checkpoint with non-finite weights is {poisoned[0]['unit']} "
                 f"({step_text(poisoned[0]['step'])}); every later one inherits the divergence.")
    if rollback:
        r[:0] = [_rollback_line(rollback, rec, lost)]
        repairs = [f["repair"] for f in rollback["findings"] if f.get("repair")]
        if repairs:
            r.append(f"Before using {rollback['unit']}, apply: " + " | ".join(repairs))
        r.extend(f"Alternative: warm-start from {a['unit']} ({step_text(a['step'])}) loses "
                 f"{lost(a) or 0} steps of weights but restarts the optimizer state." for a in alternatives)
    else:
        r.insert(0, "Retrain: no checkpoint of this run has usable weights.")
    r.extend(p["finding"]["message"] + " " + p["finding"]["next_step"] for p in pointers
             if p.get("finding") and (not p["ok"] or p["finding"].get("repair")))
    return r


def _passed_over(u: dict) -> str:
    """Why unit ``u``, newer than the rollback point, is not used ("" when no finding says so)."""
    e = _first_error(u)
    if e:
        return (f"{u['unit']} ({step_text(u['step'])}) is not usable for resume: {e['message']} "
                f"Next: {e['next_step']}")
    if u["usable_for"] != "resume":
        w = next((f for f in u["findings"] if F.CATALOGUE[f["kind"]].caps != "resume"), None)
        if w:
            return f"{u['unit']} ({step_text(u['step'])}) is usable for {u['usable_for']} only: {w['message']}"
    return ""


def _rollback_line(rollback: dict, rec: str, lost) -> str:
    """``Resume from …`` or ``Warm-start from …``, with the steps lost."""
    n = lost(rollback)
    lost_txt = f", losing {n} steps" if n else ""
    verb = "Resume" if rec == "resume" else "Warm-start (weights only, fresh optimizer)"
    return f"{verb} from {rollback['unit']} ({step_text(rollback['step'])}){lost_txt}."


def exit_code(verdict: dict) -> int:
    """0 newest unit usable for resume and every resume entry intact; 1 roll back needed and possible (or the
    configured resume entry is damaged); 2 retrain."""
    if verdict["recommendation"] == "retrain":
        return EXIT_RETRAIN
    rb, newest = verdict["rollback"], verdict.get("newest")
    if any(not e.get("ok") for e in verdict.get("resume_entries") or []):
        return EXIT_ROLLBACK
    if verdict["recommendation"] == "resume" and rb and newest and rb["unit"] == newest["unit"]:
        return EXIT_NEWEST_OK
    return EXIT_ROLLBACK


def units_rows(verdict: dict, sizes: Dict[str, int]) -> List[dict]:
    rows = []
    for u in verdict["units"]:
        fl = u["findings"]
        rows.append({"unit": u["unit"], "step": u["step"], "layout": u["layout"], "usable_for": u["usable_for"],
                     "n_errors": sum(f["severity"] == "error" for f in fl),
                     "n_warnings": sum(f["severity"] == "warning" for f in fl),
                     "kinds": sorted({f["kind"] for f in fl}), "layers": sorted({f["layer"] for f in fl}),
                     "size_bytes": sizes.get(u["unit"]), "findings_json": json.dumps(fl)})
    return rows
