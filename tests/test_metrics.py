"""``ckptaudit audit --metrics PATH``: the demo's verdict as Prometheus metrics that prometheus_client's own
parser reads, and a failed audit's file that keeps the last success."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from prometheus_client.parser import text_string_to_metric_families

CLI = [sys.executable, "-m", "ckptaudit.cli"]


def _samples(path) -> dict:
    out = {}
    for fam in text_string_to_metric_families(path.read_text()):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "run"))
            out[(s.name, labels)] = (s.value, s.labels["run"])
    return out


def test_metrics_of_the_demo_audit_and_of_a_failed_one(demo_run, tmp_path):
    prom = tmp_path / "textfile" / "ckptaudit.prom"
    prom.parent.mkdir()
    t0 = time.time()
    p = subprocess.run(CLI + ["audit", str(demo_run.run_dir), "--out", str(tmp_path / "out"), "--metrics", str(prom)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr  # the demo's newest unit is damaged: roll back
    v = json.loads((tmp_path / "out" / "verdict.json").read_text())
    m = _samples(prom)
    run = str(demo_run.run_dir.resolve())
    assert {r for _, r in m.values()} == {run}
    val = {k: x for k, (x, _) in m.items()}
    assert val[("ckptaudit_audit_success", ())] == 1 and val[("ckptaudit_audit_exit_code", ())] == 1
    assert val[("ckptaudit_rollback_step", ())] == v["rollback"]["step"] is not None
    assert val[("ckptaudit_newest_step", ())] == v["newest"]["step"]
    assert val[("ckptaudit_steps_at_risk", ())] == v["steps_lost"] > 0
    assert val[("ckptaudit_recommendation", (("recommendation", "resume"),))] == 1
    for use in ("resume", "warm-start", "none"):
        assert val[("ckptaudit_units", (("usable_for", use),))] == sum(u["usable_for"] == use for u in v["units"])
    errors = sum(f["severity"] == "error" and f["layer"] == "file" for u in v["units"] for f in u["findings"])
    assert val[("ckptaudit_findings", (("layer", "file"), ("severity", "error")))] == errors > 0
    last = val[("ckptaudit_audit_last_success_timestamp_seconds", ())]
    assert t0 <= last <= time.time()
    newest_ok = max(u["mtime_unix"] for u in v["units"] if u["usable_for"] == "resume")
    assert abs(val[("ckptaudit_newest_usable_unit_age_seconds", ())] - (last - newest_ok)) < 1.0

    bad = tmp_path / "bad.yaml"
    bad.write_text("laod: {enabled: false}\n")  # a config error: the same run's audit fails (exit 3)
    p = subprocess.run(CLI + ["audit", str(demo_run.run_dir), "--out", str(tmp_path / "o2"), "--config", str(bad),
                              "--metrics", str(prom)], capture_output=True, text=True, timeout=600)
    assert not (tmp_path / "o3").exists()
    first = tmp_path / "o3" / "textfile" / "ckptaudit.prom"  # the first night fails: its folder is made too
    q = subprocess.run(CLI + ["audit", str(tmp_path / "no-such-run"), "--out", str(tmp_path / "o3"), "--metrics",
                              str(first)], capture_output=True, text=True, timeout=600)
    assert q.returncode == 3 and "ckptaudit_audit_success" in first.read_text(), q.stderr
    assert p.returncode == 3, p.stderr
    m = _samples(prom)
    val = {k: x for k, (x, _) in m.items()}
    assert val[("ckptaudit_audit_success", ())] == 0 and val[("ckptaudit_audit_exit_code", ())] == 3
    assert val[("ckptaudit_audit_last_success_timestamp_seconds", ())] == last  # kept from the earlier file
    assert ("ckptaudit_rollback_step", ()) not in val
    assert [p.name for p in prom.parent.iterdir()] == ["ckptaudit.prom"]  # written atomically, no temp left
