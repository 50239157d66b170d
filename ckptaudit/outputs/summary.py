"""The summary printed at the end of every audit (``ckptaudit audit`` and ``snakemake … audit``), from verdict.json.

One headline (recommendation, rollback point and its step, steps lost), the run folder that every unit name
and shell repair below is relative to (other paths are printed absolute), the verdict's first
reason when it is not a plain resume, one line per damaged unit or pointer (what is wrong, in
the finding's own words), runs of healthy units collapsed into one line
(``ckpt_000100.pt .. ckpt_000400.pt: 4 units intact`` where a digest or zip CRC-32 proved every byte, "no
damage found, not verifiable without a checksum" where a file had neither), and where report.html is.  The CLI
prints it itself; the Snakefile's ``onsuccess:`` handler prints it for ``snakemake … audit``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Dict, List

from ..resume_hint import instruction
from ..terminal_text import shown_lines
from ..text import clip, step_text

#: longest "what is wrong" text on a unit's line (the report has the rest)
WHAT_CHARS = 100
_HEX = re.compile(r"\b[0-9a-f]{32,}\b")  # digests are said by their first 12 digits
_USE_WORDS = {"none": "not usable", "warm-start": "warm-start only"}
#: digest findings over a whole file or a 64 MiB chunk: shown after a finding that names the changed record
_BROAD = {"checksum_mismatch", "chunk_checksum_mismatch"}
#: first words of a repair that is a shell command (its paths are relative to the run folder); others are code
_SHELL_WORDS = {"cp", "mv", "ln", "rm", "printf", "echo", "ckptaudit", "python", "python3", "cd", "truncate", "cat",
                "mkdir", "sha256sum"}


def headline(v: Dict) -> str:
    """``ckptaudit: RESUME from ckpt_000250.pt (step 250), 50 steps lost`` (``RETRAIN`` without a rollback)."""
    rb = v.get("rollback")
    out = f"ckptaudit: {v['recommendation'].upper()}"
    if rb:
        out += f" from {rb['unit']} ({step_text(rb['step'])})"
        lost = v.get("steps_lost")
        out += f", {lost} steps lost" if lost else ", no steps lost" if lost == 0 else ", steps lost unknown"
    return out


def _what(unit: Dict, cap: str) -> str:
    """The first sentence of the worst finding that limits ``unit`` to ``cap``, and how many more there are."""
    order = {"error": 0, "warning": 1, "info": 2}
    limiting = [f for f in unit["findings"] if f.get("caps") == cap] or \
        [f for f in unit["findings"] if f.get("severity") == "error"]
    if not limiting:
        return "see the report"
    # of equal severity, a finding that names the record or tensor goes before a digest over a whole chunk
    limiting.sort(key=lambda f: (order.get(f.get("severity"), 3), f.get("kind") in _BROAD))
    first = limiting[0]
    msg = _HEX.sub(lambda m: m.group(0)[:12] + "…", " ".join(str(first.get("message") or first["kind"]).split()))
    for prefix in (f"{first.get('path')}: ", f"{unit['unit']}: "):
        if prefix.strip(": ") and msg.startswith(prefix):
            msg = msg[len(prefix):]
    msg = _top_level_cut(msg, ". ").rstrip(".")
    head = _top_level_cut(msg, ": ")
    if head != msg and len(head) >= 20:  # "ckpt_000300.pt is a torch.save zip cut short: it is 722283 bytes …"
        msg = head
    msg = clip(msg, WHAT_CHARS)
    more = len({f["kind"] for f in limiting}) - 1
    return msg + (f" (+{more} more)" if more > 0 else "")


def repair_where(repair: str, run_dir: str) -> str:
    """Where a finding's ``repair`` runs: ``run in <run_dir>`` for a shell command (its paths are relative to the
    run folder, and a ``ckptaudit`` command's are absolute), ``in the resume script`` for Python code."""
    return f"run in {run_dir}" if repair.split(" ", 1)[0] in _SHELL_WORDS else "in the resume script"


def _top_level_cut(text: str, sep: str) -> str:
    """``text`` up to the first ``sep`` outside parentheses (``text`` when there is none): a sentence or clause
    is never cut inside "(122920 bytes: chunk(s) 0 of 1)"."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(sep, i):
            return text[:i]
    return text


def severity_counts(findings: List[Dict]) -> str:
    """``1 error, 2 warnings`` over the errors and warnings of ``findings`` ("" when there are none)."""
    n = {sev: sum(1 for f in findings if f.get("severity") == sev) for sev in ("error", "warning")}
    return ", ".join(f"{k} {sev}{'s' * (k != 1)}" for sev, k in n.items() if k)


def unverified(u: Dict) -> int:
    """How many files of unit ``u`` (a verdict unit) neither a recorded digest nor a zip record CRC-32 covered:
    for those the audit found no damage but could not prove the bytes (``sidecar_missing``'s detail)."""
    return sum(int((f.get("detail") or {}).get("n_unverified") or 0) for f in u["findings"]
               if f.get("kind") == "sidecar_missing")


#: a healthy unit whose every byte a digest or CRC proved, and one with bytes nothing could check
INTACT, NO_DAMAGE_FOUND = "intact", "no damage found, not verifiable without a checksum (ckptaudit seal)"


def _healthy_run(run: List[Dict]) -> str:
    counted = severity_counts([f for u in run for f in u["findings"]])
    proven = INTACT if not any(unverified(u) for u in run) else NO_DAMAGE_FOUND
    state = proven if not counted else f"usable for resume, {counted} (see the report)"
    if len(run) == 1:
        return f"  {run[0]['unit']} ({step_text(run[0]['step'])}): {state}"
    return f"  {run[0]['unit']} .. {run[-1]['unit']}: {len(run)} units {state}"


def _to_act_on(u: Dict) -> List[Dict]:
    """The findings of ``u`` a resume from it must act on: each error, and each finding with a repair."""
    return [f for f in u["findings"] if f.get("severity") == "error" or f.get("repair")]


def _rollback_lines(u: Dict, v: Dict) -> List[str]:
    """The rollback unit's line with what to do before resuming from it, one line per finding (repairs run in
    the run folder, which is said, since the summary is read where ``snakemake`` or ``ckptaudit`` ran)."""
    use = _USE_WORDS.get(u["usable_for"], f"usable for {u['usable_for']}")
    counted = severity_counts(u["findings"])
    out = [f"  {u['unit']} ({step_text(u['step'])}): the rollback point, {use}"
           + (f", {counted}" if counted else "") + "; before resuming from it:"]
    run_dir = v.get("run_dir") or "the run folder"
    for f in _to_act_on(u):
        msg = clip(" ".join(str(f.get("message") or f["kind"]).split()), 2 * WHAT_CHARS)
        line = f"    {f.get('severity', 'info')}: {msg}"
        code: List[str] = []
        if f.get("repair"):
            code = [c for c in str(f["repair"]).splitlines() if c.strip()]
            where = repair_where(code[0], run_dir)
            # one line stays on the line; Python of several lines (imports, then the statement) is printed as
            # a block, as it must be pasted: joined into one line it would not run
            line += f" Repair ({where}): {code[0]}" if len(code) == 1 else f" Repair ({where}):"
        elif f.get("next_step"):
            line += f" {' '.join(str(f['next_step']).split())}"
        out.append(line)
        if len(code) > 1:
            out.extend("      " + c for c in code)
    return out


def unit_lines(v: Dict) -> List[str]:
    """One line per damaged unit, healthy neighbours (by step; units without a step last) collapsed."""
    units = sorted(v.get("units") or [], key=lambda u: (u["step"] is None, u["step"] or 0, u["unit"]))
    out: List[str] = []
    run: List[Dict] = []
    rollback = (v.get("rollback") or {}).get("unit")
    for u in units:
        if u["unit"] == rollback and _to_act_on(u):
            if run:
                out.append(_healthy_run(run))
                run = []
            out += _rollback_lines(u, v)
            continue
        if u["usable_for"] == "resume":
            run.append(u)
            continue
        if run:
            out.append(_healthy_run(run))
            run = []
        out.append(f"  {u['unit']} ({step_text(u['step'])}): {_USE_WORDS.get(u['usable_for'], u['usable_for'])}: "
                   f"{_what(u, u['usable_for'])}")
    if run:
        out.append(_healthy_run(run))
    for f in v.get("run_findings") or []:  # one line each: dead writers' leftovers
        out.append(f"  {' '.join(str(f.get('message')).split())} Repair (run anywhere): {f['repair']}"
                   if f.get("repair") else f"  {' '.join(str(f.get('message')).split())}")
    for f in v.get("pointer_findings") or []:
        if f.get("severity") == "error":
            out.append(f"  pointer {f.get('path')}: {clip(' '.join(str(f.get('message')).split()), WHAT_CHARS)}")
    return out


def summary(v: Dict, out_dir: str | Path) -> str:
    """The whole summary of verdict ``v`` whose report is in ``out_dir``."""
    lines = [headline(v)]
    if v.get("run_dir"):  # unit names and shell repairs below are relative to the run folder: say which
        lines.append(f"  run folder {v['run_dir']} (unit names below are relative to it)")
    reasons = v.get("reasons") or []
    if reasons and v.get("recommendation") != "resume":
        lines.append(f"  {reasons[0]}")
    hint = instruction(v)  # how to resume from the rollback point when the framework's default picks another
    if hint:
        lines.append(f"  {hint}")
    lines += unit_lines(v)
    if v.get("salvage"):
        lines.append(f"  {v['salvage']['sentence']}")
    from ..verification.budget import budget_line  # a budgeted audit: which bytes it did not read, and since when

    lines += budget_line(v)
    for e in v.get("resume_entries") or []:
        if not e.get("ok") and e.get("finding"):
            repair = e["finding"].get("repair")
            what = ("weights only, {call} would not restore the training state"
                    if e["finding"].get("kind") == "resume_entry_weights_only" else "damaged, {call} would fail")
            lines.append(f"  resume entry {e['unit']}: " + what.format(call=e["call"])
                         + (f"; repair (run in {v.get('run_dir') or 'the run folder'}): {repair}" if repair else ""))
    lines.append(f"report: {Path(out_dir) / 'report.html'}")
    return shown_lines(lines)  # names from the run never steer the terminal nor start a line


def print_summary(out_dir: str | Path, stream=None) -> bool:
    """Print the summary of ``out_dir/verdict.json`` (to stdout by default); False when there is none."""
    path = Path(out_dir) / "verdict.json"
    try:
        v = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    print(summary(v, Path(out_dir).resolve()), file=stream or sys.stdout, flush=True)
    return True


def on_success(workflow, out_dir: str | Path) -> bool:
    """The Snakefile's ``onsuccess:`` handler: print the summary when the run built (or checked) the verdict,
    unless ``ckptaudit`` started the workflow and prints it itself."""
    import os

    from .job_errors import CLI_ENV

    if os.environ.get(CLI_ENV):
        return False
    rules = _rules(workflow)
    said = "report" in rules and print_summary(out_dir)
    if "drill" in rules:  # `snakemake drill`: the drill's own line after the audit's summary
        try:
            print(json.loads((Path(out_dir) / "drill" / "drill.json").read_text())["summary"], flush=True)
        except (OSError, ValueError, KeyError):
            pass
    return said


def run_exit_code(workflow, out_dir: str | Path) -> int:
    """The exit code a successful ``snakemake …`` run ends with: the one ``ckptaudit`` gives for the same work,
    so cron and CI see the same answer.  With the drill in the run (``snakemake drill``, ``drill_nightly``):
    ``drill.json``'s ``exit_code`` (0 passed, 1 a problem, 2 nothing restorable, 3 the drill failed; the drill
    job itself exits 0 once its outputs are written: rules/drill.smk); else with the report in it
    (``snakemake audit``): :func:`ckptaudit.verdict.exit_code` of ``verdict.json`` (0 resume from the newest, 1
    roll back, 2 retrain).  3 when that file cannot be read; 0 for other targets (the demo run, a single stage)
    and when ``ckptaudit`` started the workflow (it exits with the code itself)."""
    import os

    from .job_errors import CLI_ENV

    if os.environ.get(CLI_ENV):
        return 0
    rules = _rules(workflow)
    try:
        if "drill" in rules:
            return int(json.loads((Path(out_dir) / "drill" / "drill.json").read_text())["exit_code"])
        if "report" in rules:
            from ..verdict import exit_code

            return exit_code(json.loads((Path(out_dir) / "verdict.json").read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return 3
    return 0


def exit_as_ckptaudit(workflow, out_dir: str | Path) -> None:
    """The last step of the Snakefile's ``onsuccess:`` handler: end the process with :func:`run_exit_code` when
    it is not 0 (Snakemake's own ``main`` lets ``SystemExit`` through; its exit would be 0)."""
    code = run_exit_code(workflow, out_dir)
    if code:
        sys.stdout.flush()
        sys.exit(code)


def _rules(workflow) -> set:
    """Names of the rules in the run's DAG (``{"report"}`` under another Snakemake's internals: then the
    verdict is read whenever there is one)."""
    try:
        return {j.rule.name for j in workflow.dag.jobs}
    except AttributeError:
        return {"report"}
