"""Findings only the run as a whole shows: step counters going back, scheduler resets, units written out of order.

Each unit's own stages judge it alone; these compare units with each other, in step order, from the
state and structure tables, and :func:`ckptaudit.verdict.build` adds them to the units they name.
:func:`save_order` and :func:`save_key` put the verdict's units in save order.
A unit's missing scheduler or RNG state is judged here too, because only the run says whether it
ever had one (:func:`missing_components`).
"""

from __future__ import annotations

import bisect
import statistics
from typing import Dict, List, Optional

from . import findings as F
from . import producers


def unit_step(u: dict, state_row: Optional[dict]) -> Optional[int]:
    """A unit's step: its state row's, else the step its name gives."""
    if state_row and state_row.get("step") is not None:
        return int(state_row["step"])
    return u.get("step_from_name")


def _always_holds(u: dict, comp: str) -> str:
    """Evidence, from the unit's layout alone (contracts off too), that its producer writes ``comp`` in every
    unit: its folder holds the producer's own record of a complete save (the HF Trainer's
    ``trainer_state.json``); "" when there is none."""
    p = producers.for_layout(u.get("layout") or "")
    if p is None or not p.complete_marker or not any(comp in c.saves for c in p.contracts):
        return ""
    if not any(f.rsplit("/", 1)[-1] == p.complete_marker for f in u.get("files", [])):
        return ""
    return f"{p.name}'s checkpoint folder ({p.complete_marker}) always holds it"


def run_findings(units: List[dict], state_rows: Dict[str, dict], structure_rows: Dict[str, dict],
                 cfg: dict, scan_rows: Optional[Dict[str, dict]] = None) -> Dict[str, List[dict]]:
    """Findings that only the run as a whole shows: counters going back, gaps,
    norm jumps, the structure changing, components the run has and a unit lacks, a count of files the
    producer's resume needs that differs from the run's.
    Units are taken in save order (name step, then name)."""
    ordered = [u for u in units if u.get("step_from_name") is not None and not u.get("in_progress")]
    ratio = float((cfg.get("state") or {}).get("norm_jump_ratio", 10.0))
    out: Dict[str, List[dict]] = {}
    from .components import restore_rules

    for found in (missing_components(units, state_rows, scan_rows or {}), restore_rules.count_mismatches(units),
                  steps_going_back(ordered, state_rows),
                  written_out_of_order(ordered, state_rows), scheduler_resets(ordered, state_rows),
                  step_gaps(ordered), norm_jumps(ordered, state_rows, ratio),
                  structure_changes(ordered, structure_rows)):
        for unit, f in found:
            out.setdefault(unit, []).append(f.to_dict())
    return out


def steps_going_back(ordered: List[dict], state_rows: Dict[str, dict]) -> List[tuple]:
    """``step_not_increasing``: a unit whose recorded step is not above the highest step saved before it (every
    unit after a restart is flagged, not only the first)."""
    out = []
    prev = None
    for u in ordered:
        s = state_rows.get(u["unit"]) or {}
        if s.get("step") is None or s.get("has_weights") is None:
            continue
        if prev is not None and (s["step"] < prev[1] or (s["step"] == prev[1] and u["step_from_name"] != prev[2])):
            out.append((u["unit"], F.make("step_not_increasing", path=u["unit"], step=s["step"], previous=prev[1])))
        if prev is None or s["step"] > prev[1]:
            prev = (u["unit"], s["step"], u["step_from_name"])
    return out


def step_gaps(ordered: List[dict]) -> List[tuple]:
    """``step_gap``: saves further apart than 1.5 × the run's median save interval (three saves or more)."""
    steps = [u["step_from_name"] for u in ordered]
    if len(steps) < 3:
        return []
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    interval = statistics.median(gaps) if gaps else 0
    return [(u["unit"], F.make("step_gap", path=u["unit"], gap=b - a, previous=a, interval=int(interval)))
            for u, a, b in zip(ordered[1:], steps, steps[1:]) if interval and b - a > 1.5 * interval]


def norm_jumps(ordered: List[dict], state_rows: Dict[str, dict], ratio: float) -> List[tuple]:
    """``weight_norm_jump``: the weights' norm changing by ``ratio`` or more from the previous unit that has one."""
    out = []
    prev_norm = None
    for u in ordered:
        n = (state_rows.get(u["unit"]) or {}).get("weight_norm")
        if n and prev_norm and prev_norm[1] > 0:
            r = max(n / prev_norm[1], prev_norm[1] / n)
            if r >= ratio:
                out.append((u["unit"], F.make("weight_norm_jump", path=u["unit"], ratio=r, previous=prev_norm[0],
                                              examples=f"{prev_norm[1]:.4g} -> {n:.4g}")))
        if n:
            prev_norm = (u["unit"], n)
    return out


def structure_changes(ordered: List[dict], structure_rows: Dict[str, dict]) -> List[tuple]:
    """``model_changed_in_run``: a unit whose weights' structure hash differs from the previous unit's."""
    out = []
    prev_s = None
    for u in ordered:
        h = (structure_rows.get(u["unit"]) or {}).get("structure_hash")
        if h and prev_s and h != prev_s[1]:
            out.append((u["unit"], F.make("model_changed_in_run", path=u["unit"], previous=prev_s[0],
                                          examples=f"structure {prev_s[1]} -> {h}")))
        if h:
            prev_s = (u["unit"], h)
    return out


def written_out_of_order(ordered: List[dict], state_rows: Dict[str, dict], min_gap_s: float = 5.0) -> List[tuple]:
    """Units written after a unit of a higher step: a restart from an earlier point (or from
    scratch) that overwrote older names (``unit_written_after_newer``).

    Write times are the files' mtimes, so a copy of the run folder reorders them by
    milliseconds; only a unit written more than ``max(min_gap_s, half the median save
    interval)`` after a higher-step unit is reported.
    """
    pts = []
    for u in ordered:
        s = state_rows.get(u["unit"]) or {}
        step = s.get("step") if s.get("step") is not None else u.get("step_from_name")
        if step is not None and u.get("mtime_ns"):
            pts.append((u["unit"], int(step), u["mtime_ns"] / 1e9))
    if len(pts) < 2:
        return []
    by_step = sorted(pts, key=lambda x: x[1])
    gaps = [b[2] - a[2] for a, b in zip(by_step, by_step[1:]) if b[2] > a[2]]
    tol = max(min_gap_s, 0.5 * statistics.median(gaps)) if gaps else min_gap_s
    # the highest-step unit written more than tol before each unit: a prefix maximum over write times, so
    # 50,000 units cost a sort, not 50,000 scans of the run (ties: the first in save order, as max() gave)
    by_time = sorted(range(len(pts)), key=lambda i: pts[i][2])
    times = [pts[i][2] for i in by_time]
    best, prefix = None, []
    for i in by_time:
        if best is None or (pts[i][1], -i) > (pts[best][1], -best):
            best = i
        prefix.append(best)
    out = []
    for unit, step, t in pts:
        k = bisect.bisect_left(times, t - tol)
        while k > 0 and not t - times[k - 1] > tol:
            k -= 1
        while k < len(times) and t - times[k] > tol:
            k += 1
        if k and pts[prefix[k - 1]][1] > step:
            n, st, tt = pts[prefix[k - 1]]
            out.append((unit, F.make("unit_written_after_newer", path=unit, step=step, newer=n, newer_step=st,
                                     minutes=round((t - tt) / 60, 1))))
    return out


def scheduler_resets(ordered: List[dict], state_rows: Dict[str, dict]) -> List[tuple]:
    """``step_counter_reset`` findings from the scheduler's counter read across the run.

    A scheduler's ``last_epoch`` counts its own ``step()`` calls, whose cadence
    (per optimizer step, per epoch, per accumulation cycle) is the run's
    choice, so it is never compared with the global step through an assumed
    ratio.  A reset is a break in the relation across units: ``last_epoch``
    going back while the step goes on, or one unit whose ratio
    ``last_epoch / step`` falls below half of what the other units agree on.
    The repair is printed only when the run shows a per-step cadence (ratio 1).
    """
    pts = []
    for u in ordered:
        s = state_rows.get(u["unit"]) or {}
        if s.get("step") is not None and s.get("scheduler_last_epoch") is not None and s["step"] > 0:
            pts.append((u["unit"], int(s["step"]), int(s["scheduler_last_epoch"])))
    out = []
    flagged = set()
    all_ratios = [le / st for _, st, le in pts if st]
    per_step = bool(all_ratios) and 0.9 < statistics.median(all_ratios) < 1.1
    for (ua, sa, la), (ub, sb, lb) in zip(pts, pts[1:]):
        if sb > sa and lb < la:
            flagged.add(ub)
            out.append((ub, _reset(ub, lb, f"it was {la} at {ua} (step {sa}) and went back while the step rose to {sb}",
                                   sb, per_step)))
    ratios = [(u, le / st, st, le) for u, st, le in pts if u not in flagged]
    if len(ratios) >= 3:
        srt = sorted(x[1] for x in ratios)  # each unit against the others: the sorted run less one copy of it
        n = len(srt)
        for u, r, st, le in ratios:
            j = bisect.bisect_left(srt, r)

            def other(k: int) -> float:
                return srt[k] if k < j else srt[k + 1]

            m = n - 1
            med = other(m // 2) if m % 2 else (other(m // 2 - 1) + other(m // 2)) / 2
            lo, hi = (srt[1] if j == 0 else srt[0]), (srt[-2] if j == n - 1 else srt[-1])
            if med > 0 and r < 0.5 * med and hi <= 1.25 * lo:
                out.append((u, _reset(u, le, f"the other units keep last_epoch/step near {med:.3g} and this one "
                                             f"has {r:.3g}", st, per_step)))
    return out


def _reset(unit: str, last_epoch: int, evidence: str, step: int, per_step: bool) -> "F.Finding":
    """The finding; ``per_step``: the run's scheduler steps once per optimizer step (median ratio near 1)."""
    repair = (f"ckpt['scheduler']['last_epoch'] = {step}; ckpt['scheduler']['_step_count'] = {step + 1}"
              if per_step and unit.endswith((".pt", ".pth", ".ckpt", ".tar")) else "")
    nxt = "" if repair else ("; this run's scheduler cadence is not one step per optimizer step, so set "
                             "last_epoch to what the schedule had reached at this point")
    from .components.findings import step_counter_reset

    return step_counter_reset(unit, field="scheduler.last_epoch", saved=last_epoch, evidence=evidence,
                              true_step=step, repair_code=repair, scheduler_text=nxt)


def save_order(u: dict) -> int:
    """A verdict unit's place in save order: the step in its name (``name_step``), else the step it records
    (``step``), else -1."""
    if u.get("name_step") is not None:
        return u["name_step"]
    return u["step"] if u["step"] is not None else -1


def save_key(u: dict) -> tuple:
    """The sort key of a verdict unit: :func:`save_order`; among units of the same step, one named with its step
    ranks above an unnamed copy (Lightning's ``last.ckpt``), so the rollback point is the named unit; then the
    unit's path."""
    return (save_order(u), u.get("name_step") is not None, u["unit"])


def name_counts_saves(units_out: List[dict]) -> bool:
    """True when the numbers in the units' names are save counters, not steps (learnt from the run).

    That is the case when every unit that has both a name number and a recorded
    step disagrees, and the recorded steps grow with the name numbers
    (accelerate's ``checkpoint_<save count>``).
    """
    both = sorted((u["name_step"], u["step"]) for u in units_out
                  if u.get("name_step") is not None and u.get("step") is not None)
    if len(both) < 2 or any(n == s for n, s in both):
        return False
    return all(b[1] > a[1] for a, b in zip(both, both[1:]))


def _run_needs(unit: str, s: Optional[dict], scan_row: dict):
    """The :class:`~ckptaudit.components.run_needs.RunNeeds` of ``unit``: from its state row's
    ``run_needs_json`` (the state stage's), else collected from its scan row."""
    from .components import of_scan_row
    from .components.run_needs import RunNeeds, judged

    got = RunNeeds.of_json((s or {}).get("run_needs_json"))
    if got is not None:
        return got
    c = of_scan_row(scan_row)[0]
    return RunNeeds.of(unit, c, judged(s, c))


def missing_components(units: List[dict], state_rows: Dict[str, dict],
                       scan_rows: Dict[str, dict]) -> List[tuple]:
    """``missing_scheduler_state`` / ``missing_rng_state`` for units that lack what the run had, and
    ``resume_starts_component_fresh`` where the producer's resume restores a component the unit holds only
    together with one it lacks (then that lack is told by this finding alone: the fast-forward repair of
    ``missing_scheduler_state`` cannot run inside the framework's resume).

    A component the run never had is not missing: a run without an LR scheduler (a constant LR, or
    one computed from the step as nanoGPT does) or that never saves RNG state gets no warning on
    every unit.  The evidence that the run had it, any of: other units of the run hold it; the
    producer always saves it (its contract, or by layout a Trainer folder without ``rng_state.pth``
    or ``scheduler.pt``); for the scheduler, the
    unit's own optimizer param groups carry ``initial_lr``, which a torch LR scheduler sets.  A
    producer that never saves a component is never judged on it.
    """
    comps = {}
    for u in units:
        if u.get("in_progress") or u["unit"] not in scan_rows:
            continue
        c = _run_needs(u["unit"], state_rows.get(u["unit"]), scan_rows[u["unit"]])
        if c.judged:
            comps[u["unit"]] = (u, c)
    have = {"scheduler": [n for n, (_, c) in comps.items() if c.scheduler],
            "rng": [n for n, (_, c) in comps.items() if c.rng]}
    out = []
    for name, (u, c) in comps.items():
        s = state_rows[name]
        broken = c.broken  # the producer's own resume rule speaks for the needs it names
        out.extend((name, f) for f, _ in broken)
        covered = {n for _, needs in broken for n in needs}
        for comp, lacks in (("scheduler", not c.scheduler), ("rng", not c.rng)):
            if not lacks or comp in c.never_saves or comp in covered:
                continue
            evidence = _component_evidence(comp, u, c, have[comp])
            if not evidence:
                continue
            if comp == "rng":
                out.append((name, F.make("missing_rng_state", path=name, evidence="; ".join(evidence))))
                continue
            step = s.get("step") if s.get("step") is not None else u.get("step_from_name")
            repair = _fast_forward(c, step, state_rows, have["scheduler"])
            out.append((name, F.make(
                "missing_scheduler_state", path=name, evidence="; ".join(evidence), step=step,
                repair_code=repair,
                repair_text=(": the repair steps your scheduler to the saved step and checks that it reaches the "
                             "saved learning rate" if repair else
                             "; the audit cannot tell which schedule it was or how often it stepped, so rebuild it "
                             "from the training code and set its position from the training log"))))
    return out


def _component_evidence(comp: str, u: dict, c, others: List[str]) -> List[str]:
    """Why the run had component ``comp`` ("scheduler" or "rng") that unit ``u`` lacks (``c``: its
    components; ``others``: the units that hold it), in plain words; empty when nothing shows it."""
    evidence = []
    if comp == "scheduler" and c.scheduled_by_torch:
        evidence.append("its optimizer's param groups carry initial_lr, which a torch LR scheduler sets")
    if comp in c.always_saves and c.producer:
        evidence.append(f"{c.producer} saves it in every checkpoint")
    elif (marker := _always_holds(u, comp)):
        evidence.append(marker)
    if others:
        shown = ", ".join(sorted(others)[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        evidence.append(f"{len(others)} other unit(s) of the run have it ({shown})")
    return evidence


def _fast_forward(c, step: Optional[int], state_rows: Dict[str, dict], with_scheduler: List[str]) -> str:
    """Code that moves the resume's rebuilt torch ``scheduler`` to the saved point and checks it, or "".

    Printed only when a torch LR scheduler drove the optimizer (``initial_lr``) and the unit records
    its step and learning rates.  The number of ``scheduler.step()`` calls is the step times the
    run's own cadence (``last_epoch / step`` of the units that kept their scheduler), one per step
    when the run shows none; the assertion compares the scheduler's learning rates with the saved
    ones, so a wrong cadence or schedule stops the resume instead of training on a wrong LR.
    """
    lrs = list(c.group_lrs)
    if not c.scheduled_by_torch or step is None or step <= 0 or not lrs:
        return ""
    ratios = [state_rows[n]["scheduler_last_epoch"] / state_rows[n]["step"] for n in with_scheduler
              if state_rows.get(n) and state_rows[n].get("scheduler_last_epoch") is not None
              and state_rows[n].get("step")]
    n = step
    if ratios and min(ratios) > 0 and max(ratios) <= 1.25 * min(ratios):
        n = int(round(step * statistics.median(ratios)))
    return (f"for _ in range({n}): scheduler.step()  # your LR scheduler, built as in training, "
            "before optimizer.load_state_dict\n"
            f"assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(scheduler.get_last_lr(), {lrs!r})), "
            "'the rebuilt schedule does not reach the saved learning rate: set its position by hand'")
