"""An audit's result as Prometheus metrics, for node_exporter's textfile collector (``--metrics PATH``).

A nightly audit that silently stopped running, or a run whose newest good unit is days old, is noticed only
where operators already look.  The file is written by ``prometheus_client.write_to_textfile`` (a temp file
renamed over ``PATH``, so the collector never reads half a file); every series carries the label ``run`` (the
run folder, absolute).  Units: seconds and steps; timestamps are Unix seconds.

========================================================  ==============================================
``ckptaudit_audit_success``                               1 when the audit finished with a verdict, else 0
``ckptaudit_audit_exit_code``                             the ``ckptaudit audit`` exit code (0–3)
``ckptaudit_audit_duration_seconds``                      wall time of the audit
``ckptaudit_audit_last_success_timestamp_seconds``        end of the last audit that finished (kept from the
                                                          previous file when this one failed)
``ckptaudit_recommendation{recommendation}``              1 for the verdict's resume / warm-start / retrain
``ckptaudit_newest_step``                                 step of the newest unit (absent when unknown)
``ckptaudit_rollback_step``                               step of the rollback point (absent without one)
``ckptaudit_steps_at_risk``                               steps between the rollback point and the newest unit
``ckptaudit_units{usable_for}``                           units by what they are usable for
``ckptaudit_findings{layer,severity}``                    findings by layer and severity
``ckptaudit_newest_usable_unit_age_seconds``              seconds since the newest unit usable for resume
                                                          was written (its files' newest mtime)
``ckptaudit_drill_success``                               1 when the restore drill passed (exit 0), else 0
``ckptaudit_drill_exit_code``                             the ``ckptaudit drill`` exit code (0–3)
``ckptaudit_drill_duration_seconds``                      wall time of the drill (its children), after the audit
``ckptaudit_drill_last_success_timestamp_seconds``        end of the last drill that passed (kept from the
                                                          previous file otherwise)
``ckptaudit_drill_step``                                  step of the unit the drill restored
``ckptaudit_drill_checks{status}``                        the drill's checks by status (pass, warn, fail, skip)
========================================================  ==============================================

``ckptaudit drill --metrics PATH`` writes the audit's series and the drill's into one file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Dict, Optional

LAYERS = ("file", "structure", "state", "security")
SEVERITIES = ("error", "warning", "info")
USES = ("resume", "warm-start", "none")
RECOMMENDATIONS = ("resume", "warm-start", "retrain")


DRILL_STATUSES = ("pass", "warn", "fail", "skip")


def previous_success(path: str | os.PathLike, run: str,
                     name: str = "ckptaudit_audit_last_success_timestamp_seconds") -> Optional[float]:
    """The value of series ``name`` (a last-success timestamp) of ``run`` in an earlier metrics file, or None."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == name and s.labels.get("run") == run:
                    return float(s.value)
    except ValueError:
        return None
    return None


def write(path: str | os.PathLike, run: str, *, verdict: Optional[dict], exit_code: int, duration_s: float,
          finished_unix: Optional[float] = None, drill: Optional[dict] = None, audit_ran: bool = True) -> None:
    """Write the metrics of one audit of ``run`` (its folder) to ``path``; ``verdict`` None for an audit that
    failed (exit 3): then only the audit's own series, and the last success carried over.  ``drill``: a parsed
    ``drill.json`` (with its ``rows``) whose series are added; a drill that could not start (exit 3) passes
    ``{"exit_code": 3, "wall_seconds": 0.0}``.  ``audit_ran`` False (``ckptaudit drill`` stopped before its audit:
    hook not importable, bad config): no audit series but the last success carried over, so that neither the
    audit's failure alert fires for an audit that never ran nor its staleness alert loses its timestamp.
    ``path``'s folder is created when missing.  Raises ``OSError``."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    now = time.time() if finished_unix is None else finished_unix
    reg = CollectorRegistry()

    def gauge(name: str, doc: str, labels=()):
        return Gauge(name, doc, ["run", *labels], registry=reg)

    if audit_ran:
        ok = int(verdict is not None)
        gauge("ckptaudit_audit_success", "1 when the audit finished with a verdict").labels(run).set(ok)
        gauge("ckptaudit_audit_exit_code", "exit code of ckptaudit audit").labels(run).set(exit_code)
        gauge("ckptaudit_audit_duration_seconds", "wall time of the audit").labels(run).set(duration_s)
    last = now if verdict is not None and audit_ran else previous_success(path, run)
    if last is not None:
        gauge("ckptaudit_audit_last_success_timestamp_seconds", "end of the last audit that finished").labels(
            run).set(last)
    if verdict is not None and audit_ran:
        _verdict_series(gauge, run, verdict, now)
    if drill is not None:
        _drill_series(gauge, run, drill, now, path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)  # the first night's failure must reach the collector
    write_to_textfile(str(path), reg)


def _drill_series(gauge, run: str, d: dict, now: float, path) -> None:
    code = int(d.get("exit_code", 3))
    gauge("ckptaudit_drill_success", "1 when the restore drill passed").labels(run).set(int(code == 0))
    gauge("ckptaudit_drill_exit_code", "exit code of ckptaudit drill").labels(run).set(code)
    gauge("ckptaudit_drill_duration_seconds", "wall time of the drill").labels(run).set(float(d.get("wall_seconds")
                                                                                              or 0.0))
    name = "ckptaudit_drill_last_success_timestamp_seconds"
    last = now if code == 0 else previous_success(path, run, name)
    if last is not None:
        gauge(name, "end of the last drill that passed").labels(run).set(last)
    if d.get("step") is not None:
        gauge("ckptaudit_drill_step", "step of the unit the drill restored").labels(run).set(d["step"])
    checks = gauge("ckptaudit_drill_checks", "the drill's checks by status", ("status",))
    for st in DRILL_STATUSES:
        checks.labels(run, st).set(sum(r.get("status") == st for r in d.get("rows") or []))


def _verdict_series(gauge, run: str, v: dict, now: float) -> None:
    rec = gauge("ckptaudit_recommendation", "1 for the verdict's recommendation", ("recommendation",))
    for r in RECOMMENDATIONS:
        rec.labels(run, r).set(int(v.get("recommendation") == r))
    newest, rollback = v.get("newest") or {}, v.get("rollback") or {}
    if newest.get("step") is not None:
        gauge("ckptaudit_newest_step", "step of the newest unit").labels(run).set(newest["step"])
    if rollback.get("step") is not None:
        gauge("ckptaudit_rollback_step", "step of the rollback point").labels(run).set(rollback["step"])
    if v.get("steps_lost") is not None:
        gauge("ckptaudit_steps_at_risk", "steps between the rollback point and the newest unit").labels(run).set(
            v["steps_lost"])
    units = gauge("ckptaudit_units", "units by what they are usable for", ("usable_for",))
    by_use: Dict[str, int] = {u: 0 for u in USES}
    findings = gauge("ckptaudit_findings", "findings by layer and severity", ("layer", "severity"))
    by_kind: Dict[tuple, int] = {(la, s): 0 for la in LAYERS for s in SEVERITIES}
    newest_ok = None
    for u in v.get("units") or []:
        by_use[u["usable_for"]] = by_use.get(u["usable_for"], 0) + 1
        for f in u.get("findings") or []:
            key = (f.get("layer"), f.get("severity"))
            by_kind[key] = by_kind.get(key, 0) + 1
        if u["usable_for"] == "resume" and u.get("mtime_unix") is not None:
            newest_ok = max(newest_ok or 0.0, float(u["mtime_unix"]))
    for f in v.get("run_findings") or []:
        key = (f.get("layer"), f.get("severity"))
        by_kind[key] = by_kind.get(key, 0) + 1
    for use, n in by_use.items():
        units.labels(run, use).set(n)
    for (layer, sev), n in by_kind.items():
        findings.labels(run, str(layer), str(sev)).set(n)
    if newest_ok is not None:
        gauge("ckptaudit_newest_usable_unit_age_seconds",
              "seconds since the newest unit usable for resume was written").labels(run).set(max(0.0, now - newest_ok))
    from ..verification.budget import METRIC_HELP, metric_values  # when each unit's bytes were last verified

    for name, x in metric_values(v, now).items():
        gauge(name, METRIC_HELP[name]).labels(run).set(x)
