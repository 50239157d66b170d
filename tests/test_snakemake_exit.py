"""``snakemake … drill`` and ``snakemake … audit`` exit with the codes ``ckptaudit drill`` and ``ckptaudit audit``
give (the Snakefile's onsuccess/onerror handlers: :func:`ckptaudit.outputs.summary.exit_as_ckptaudit`,
:func:`ckptaudit.outputs.job_errors.exit_as_ckptaudit`).

Regression (issue 43): ``snakemake … drill`` exited 0 on "DRILL FAILED" (hook not importable), and ``snakemake …
audit`` exited 0 when a roll back was needed: cron and CI went green.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
import torch

from ckptaudit.outputs import job_errors, summary

from .conftest import REPO


def _workflow(*rules):
    jobs = [types.SimpleNamespace(rule=types.SimpleNamespace(name=r)) for r in rules]
    return types.SimpleNamespace(dag=types.SimpleNamespace(jobs=jobs))


VERDICT_ROLLBACK = {"recommendation": "resume", "rollback": {"unit": "a.pt", "step": 5},
                    "newest": {"unit": "b.pt", "step": 10}, "resume_entries": []}


def test_the_run_exits_with_the_drills_code_else_the_verdicts(tmp_path, monkeypatch):
    monkeypatch.delenv(job_errors.CLI_ENV, raising=False)
    (tmp_path / "drill").mkdir()
    assert summary.run_exit_code(_workflow("report", "drill"), tmp_path) == 3  # no drill.json: the drill failed
    (tmp_path / "verdict.json").write_text(json.dumps(VERDICT_ROLLBACK))
    assert summary.run_exit_code(_workflow("inventory", "report", "audit"), tmp_path) == 1  # roll back
    for code in (0, 1, 2, 3):
        (tmp_path / "drill" / "drill.json").write_text(json.dumps({"exit_code": code}))
        assert summary.run_exit_code(_workflow("report", "drill", "drill_dated", "drill_nightly"), tmp_path) == code
    assert summary.run_exit_code(_workflow("demo_run"), tmp_path) == 0  # another target: Snakemake's own 0
    with pytest.raises(SystemExit) as ei:
        summary.exit_as_ckptaudit(_workflow("report", "drill"), tmp_path)
    assert ei.value.code == 3
    with pytest.raises(SystemExit) as ei:
        job_errors.exit_as_ckptaudit()  # a job failed: "the audit itself failed", as ckptaudit says it
    assert ei.value.code == 3
    monkeypatch.setenv(job_errors.CLI_ENV, "1")  # ckptaudit runs the workflow and exits with the code itself
    assert summary.run_exit_code(_workflow("report", "drill"), tmp_path) == 0
    summary.exit_as_ckptaudit(_workflow("report", "drill"), tmp_path)
    job_errors.exit_as_ckptaudit()


def test_snakemake_drill_with_an_unimportable_hook_exits_3(tmp_path):
    """The user's command as written, on a run the audit passes: the drill job writes its outputs, and the
    workflow ends with the drill's exit 3 (DRILL FAILED), not 0."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.zeros(2)}, "optimizer": {"state": {}, "param_groups": []}, "iter_num": 10},
               run / "ckpt_000010.pt")
    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
                        "drill", "--cores", "2", "--config", f"run_dir={run}",
                        "drill={'hook': 'mylab_no_such_pkg.train:restore_hook', 'devices': ['cpu']}"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 3, p.stdout[-3000:] + p.stderr[-3000:]
    lines = (p.stdout + p.stderr).splitlines()
    assert any(ln.startswith("ckptaudit drill: DRILL FAILED ckpt_000010.pt (step 10): child_process@cpu: the "
                             "restore hook could not be used: drill.hook 'mylab_no_such_pkg.train:restore_hook': "
                             "ModuleNotFoundError") for ln in lines), p.stdout[-3000:] + p.stderr[-3000:]
