"""``ckptaudit drill --metrics`` of a drill that cannot start (exit 3) still writes the drill's series.

Regression (issue 43): a hook that could not be imported, or a bad config, ended the drill with exit 3 and a
metrics file without any drill series, so ``ckptaudit_drill_last_success_timestamp_seconds`` disappeared and the
documented ``RestoreDrillNotPassing`` alert (``time() - …_timestamp_seconds > 26 * 3600``) never fired while the
hook stayed broken; the file said instead that the audit had failed, though the audit never ran.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from ckptaudit.outputs import metrics

T_PREV = 1_700_000_000.0  # when the last drill passed (and the last audit finished), in the previous file


def _series(path) -> dict:
    return {(s.name, s.labels.get("status")): s.value for f in text_string_to_metric_families(path.read_text())
            for s in f.samples}


@pytest.mark.parametrize("config", ['drill:\n  hook: "mylab_no_such_pkg.train:restore_hook"\n',  # not importable
                                    "drill:\n  stepz: 5\n"],  # a bad config
                         ids=["hook-not-importable", "bad-config"])
def test_a_drill_that_cannot_start_writes_its_series_and_keeps_the_last_success(tmp_path, config):
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.zeros(2)}, "step": 10}, run / "ckpt_000010.pt")
    prom = tmp_path / "textfile" / "drill.prom"
    metrics.write(prom, str(run.resolve()), verdict={"recommendation": "resume", "units": []}, exit_code=0,
                  duration_s=1.0, finished_unix=T_PREV, drill={"exit_code": 0, "wall_seconds": 2.0, "step": 10,
                                                               "rows": [{"status": "pass"}]})
    assert _series(prom)[("ckptaudit_drill_last_success_timestamp_seconds", None)] == T_PREV
    cfg = tmp_path / "drill.yaml"
    cfg.write_text(config)
    p = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "drill", str(run), "--out", str(tmp_path / "out"),
                        "--config", str(cfg), "--metrics", str(prom)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    assert not (tmp_path / "out" / "verdict.json").exists()  # stopped before the audit
    val = _series(prom)
    assert val[("ckptaudit_drill_success", None)] == 0
    assert val[("ckptaudit_drill_exit_code", None)] == 3
    assert val[("ckptaudit_drill_last_success_timestamp_seconds", None)] == T_PREV  # RestoreDrillNotPassing fires
    assert val[("ckptaudit_drill_checks", "fail")] == 0 and ("ckptaudit_drill_step", None) not in val
    # the audit never ran: no audit failure is claimed, and its last success is kept for its staleness alert
    assert ("ckptaudit_audit_success", None) not in val and ("ckptaudit_audit_exit_code", None) not in val
    assert val[("ckptaudit_audit_last_success_timestamp_seconds", None)] == T_PREV
    assert {s.labels["run"] for f in text_string_to_metric_families(prom.read_text()) for s in f.samples} == {
        str(run.resolve())}


def test_the_first_failed_drill_has_no_last_success_to_keep(tmp_path):
    prom = tmp_path / "new" / "drill.prom"
    metrics.write(prom, "/r", verdict=None, exit_code=3, duration_s=0.5, drill={"exit_code": 3, "wall_seconds": 0.0},
                  audit_ran=False)
    val = _series(prom)
    assert val[("ckptaudit_drill_success", None)] == 0 and val[("ckptaudit_drill_exit_code", None)] == 3
    assert ("ckptaudit_drill_last_success_timestamp_seconds", None) not in val
    assert not any(name.startswith("ckptaudit_audit_") for name, _ in val)
