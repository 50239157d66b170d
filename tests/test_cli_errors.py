"""Acceptance (issue 16): every ``ckptaudit`` command, given each kind of bad argument, exits 3 (the command
itself failed; 2 would read "retrain") with a one-screen message (at most 15 lines, no traceback).

Kinds: a missing required argument or option, a path that does not exist, a file where a folder is due, an
empty folder, a folder of non-checkpoint files, an unknown config key, a config value of the wrong type, and
a bad option value.  Most are refused before any audit work; the empty and non-checkpoint folders go through
the workflow's inventory job, whose own error line the command prints.  The same errors through Snakemake
are checked at the end.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

CKPTAUDIT = str(Path(sys.executable).parent / "ckptaudit")


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    t = tmp_path_factory.mktemp("cli_errors")
    (t / "run").mkdir()  # refused before the audit looks inside
    (t / "empty").mkdir()
    (t / "junk").mkdir()
    (t / "junk" / "train.log").write_text("step 1 loss 3.2\n")
    (t / "junk" / "config.json").write_text("{}\n")
    (t / "a_file").write_text("not a folder\n")
    (t / "key.yaml").write_text("laod:\n  enabled: false\n")
    (t / "type.yaml").write_text("load:\n  timeout_seconds: abc\n")
    return t


# (command and arguments, with {t} the scratch folder; text the message must hold)
CASES = [
    # ckptaudit audit
    ("audit", "Missing argument 'RUN_DIR'"),
    ("audit {t}/run", "Missing option '--out'"),
    ("audit {t}/missing --out {t}/o", "{t}/missing: does not exist"),
    ("audit {t}/a_file --out {t}/o", "{t}/a_file: is a file, not a folder"),
    ("audit {t}/run --out {t}/a_file", "--out {t}/a_file: is a file"),
    ("audit {t}/empty --out {t}/o_empty", "{t}/empty: the folder is empty"),
    ("audit {t}/junk --out {t}/o_junk", "no checkpoint found; ignored 2 files that are not checkpoints: "
                                        "config.json, train.log"),
    ("audit {t}/run --out {t}/o --config {t}/key.yaml", "laod: unknown key (did you mean 'load'?); allowed at the "
                                                        "top level: run_dir"),
    ("audit {t}/run --out {t}/o --config {t}/type.yaml", "load.timeout_seconds: 'abc' is not of type 'number'"),
    ("audit {t}/run --out {t}/o --config {t}/missing.yaml", "--config {t}/missing.yaml: cannot open"),
    # a dotted key (Snakemake's parser refuses it with a traceback): one line with the form that works
    ("audit {t}/run --out {t}/o --config load.timeout_seconds=300",
     "--config load.timeout_seconds=300: ckptaudit audit's --config takes a YAML/JSON file; write "
     "`load: {{timeout_seconds: 300}}` in it (with snakemake: --config 'load={{timeout_seconds: 300}}')"),
    ("audit {t}/run --out {t}/o -- --config run_name=x load.timeout_seconds=300",
     "--config load.timeout_seconds=300: Snakemake takes no dots in a config key; "
     "write --config 'load={{timeout_seconds: 300}}'"),
    ("audit {t}/run --out {t}/o --cores 0", "Invalid value for '--cores': 0 is not in the range x>=1"),
    ("audit {t}/run --out {t}/o --cores many", "'many' is not a valid integer"),
    ("audit {t}/run --out {t}/o --bogus", "No such option '--bogus'"),
    ("audit {t}/run --out {t}/o --profile no_such_profile", "--profile no_such_profile: no such profile"),
    # ckptaudit drill
    ("drill", "Missing argument 'RUN_DIR'"),
    ("drill {t}/run", "Missing option '--out'"),
    ("drill {t}/missing --out {t}/o", "{t}/missing: does not exist"),
    ("drill {t}/a_file --out {t}/o", "{t}/a_file: is a file, not a folder"),
    ("drill {t}/run --out {t}/a_file", "--out {t}/a_file: is a file"),
    ("drill {t}/junk --out {t}/o_drill_junk", "no checkpoint found; ignored 2 files"),
    ("drill {t}/run --out {t}/o --config {t}/key.yaml", "laod: unknown key"),
    ("drill {t}/run --out {t}/o --config {t}/type.yaml", "load.timeout_seconds: 'abc' is not of type 'number'"),
    ("drill {t}/run --out {t}/o --config drill.timeout_seconds=60",
     "write `drill: {{timeout_seconds: 60}}` in it (with snakemake: --config 'drill={{timeout_seconds: 60}}')"),
    ("drill {t}/run --out {t}/o --device tpu", "--device 'tpu': expected cpu, cuda or cuda:N"),
    ("drill {t}/run --out {t}/o --cores 0", "Invalid value for '--cores'"),
    # ckptaudit demo
    ("demo", "Missing argument 'OUT_DIR'"),
    ("demo {t}/a_file", "'{t}/a_file' is a file"),
    ("demo {t}/o_demo --max-steps lots", "'lots' is not a valid integer"),
    ("demo {t}/o_demo --bogus", "No such option '--bogus'"),
    # ckptaudit findings
    ("findings --bogus", "No such option '--bogus'"),
    ("findings extra", "Got unexpected extra argument (extra)"),
    # ckptaudit seal
    ("seal", "Missing argument 'RUN_DIR'"),
    ("seal {t}/missing", "{t}/missing: does not exist"),
    ("seal {t}/a_file", "'{t}/a_file' is a file"),
    ("seal {t}/empty", "{t}/empty: the folder is empty"),
    ("seal {t}/junk --dry-run", "no checkpoint found; ignored 2 files"),
    ("seal {t}/run --chunk-mib 0", "Invalid value for '--chunk-mib'"),
    # ckptaudit prune
    ("prune", "Missing argument 'RUN_DIR'"),
    ("prune {t}/missing --keep-last 1", "{t}/missing: does not exist"),
    ("prune {t}/a_file --keep-last 1", "'{t}/a_file' is a file"),
    ("prune {t}/empty --keep-last 1 --dry-run", "{t}/empty: the folder is empty"),
    ("prune {t}/run --keep-last 0", "Invalid value for '--keep-last'"),
    ("prune {t}/run --keep-last 1 --mode best", "'best' is not one of 'min', 'max'"),
    # the group itself
    ("no-such-command", "No such command 'no-such-command'"),
    ("--bogus", "No such option '--bogus'"),
]


def _one_screen(p: subprocess.CompletedProcess) -> str:
    out = (p.stdout + p.stderr).strip()
    assert "Traceback" not in out, out
    assert 1 <= len(out.splitlines()) <= 15, out
    return out


@pytest.mark.parametrize("args,needle", CASES, ids=[c[0].replace("{t}/", "") for c in CASES])
def test_bad_argument_exits_3_with_a_one_screen_message(where, args, needle):
    argv = args.format(t=where).split()
    p = subprocess.run([CKPTAUDIT, *argv], capture_output=True, text=True, timeout=600, cwd=where)
    out = _one_screen(p)
    assert p.returncode == 3, out
    assert needle.format(t=where) in out, out


def test_audit_help_lists_the_exit_codes():
    p = subprocess.run([CKPTAUDIT, "audit", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0
    for line in ("0  the newest unit is usable for resume",
                 "1  roll back needed and possible (resume or warm-start from another unit)",
                 "2  nothing usable: retrain",
                 "3  the audit itself failed (bad arguments or config, missing, empty or"):
        assert line in p.stdout, p.stdout


def _snakemake(where, *args):
    return subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d",
                           str(where / "sm"), *args], capture_output=True, text=True, timeout=600)


def test_snakemake_on_an_empty_folder_fails_with_the_inventory_jobs_own_line(where):
    p = _snakemake(where, "audit", "--cores", "2", "--config", f"run_dir={where}/empty", f"out_dir={where}/sm_o")
    assert p.returncode != 0
    lines = (p.stdout + p.stderr).splitlines()
    i = lines.index("ckptaudit: the audit failed:")
    assert lines[i + 1] == (f"  inventory: {where}/empty: the folder is empty: no checkpoint in it; is this the "
                            f"run's checkpoint folder? (log: {where}/sm_o/logs/inventory/inventory.log)")


@pytest.fixture(scope="module")
def missing_run_dry_run(where):
    """``snakemake -n audit`` of a run folder that does not exist: one launch, judged by the two tests below."""
    return _snakemake(where, "-n", "audit", "--cores", "1", "--config", f"run_dir={where}/missing")


def test_snakemake_missing_run_folder_and_config_typo_stop_in_a_few_lines(where, missing_run_dry_run):
    p = missing_run_dry_run
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert len(out.strip().splitlines()) <= 15, out
    assert f"{where}/missing: does not exist" in out
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--configfile", str(where / "key.yaml"))
    out = p.stdout + p.stderr
    assert p.returncode != 0 and len(out.strip().splitlines()) <= 15, out
    assert "laod: unknown key (did you mean 'load'?)" in out
    assert "properties:" not in out  # not the schema dump


def test_snakemake_usage_errors_exit_3_and_say_what_lands_in_the_run(where, missing_run_dry_run):
    """Config and path errors at parse time exit 3 (as ckptaudit audit does), never 1 ("roll back"); the
    out-inside-run line names what Snakemake would write there (.snakemake/ stays in its working directory)."""
    p = missing_run_dry_run
    assert p.returncode == 3, p.stdout + p.stderr
    assert f"ckptaudit: error: {where}/missing: does not exist" in p.stderr
    run = where / "run_in"
    run.mkdir(exist_ok=True)
    (run / "ckpt.pt").write_bytes(b"x")
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--config", f"run_dir={run}", f"out_dir={run}/o")
    assert p.returncode == 3, p.stdout + p.stderr
    assert ("the audit would write its tables, logs and report into what it audits; choose an output folder "
            "outside the run") in p.stderr
    assert not (run / "o").exists()


def test_snakemake_takes_a_nested_key_in_the_form_the_errors_show(where):
    """``--config 'load={timeout_seconds: 300}'`` is how Snakemake sets a nested key; its parser reads the mapping
    with YAML's BaseLoader, so the value arrives as the string '300', which the schema refused ("'300' is not of
    type 'number'"): rules/common.smk now reads it as the number the schema wants.  A dotted key never reaches
    the workflow: Snakemake's own parser refuses it before the Snakefile is read (no hook of ours runs), so its
    message is Snakemake's; the form that works is the one ``ckptaudit audit`` prints and the README shows."""
    run = where / "nested_run"
    run.mkdir(exist_ok=True)
    (run / "ckpt.pt").write_bytes(b"x")
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--config", f"run_dir={run}", f"out_dir={where}/nested_o",
                   "load={timeout_seconds: 300}")
    assert p.returncode == 0, p.stdout + p.stderr
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--config", f"run_dir={run}", f"out_dir={where}/nested_o",
                   "load={timeout_seconds: abc}")
    assert p.returncode == 3 and "load.timeout_seconds: 'abc' is not of type 'number'" in p.stderr, p.stderr
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--config", f"run_dir={run}", "load.timeout_seconds=300")
    assert p.returncode != 0 and "Config entry must start with a valid identifier" in p.stdout + p.stderr
    readme = (REPO / "README.md").read_text()
    assert "--config 'load={timeout_seconds: 300}'" in readme


def _thirty_units(run: Path) -> Path:
    """A run of 30 small torch.save units: an audit of it is mid-way (its hash jobs running) for seconds."""
    import torch

    run.mkdir()
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters())
    for s in range(1, 31):
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 10 * s},
                   run / f"ckpt_{10 * s:06d}.pt")
    return run


def _ctrl_c_mid_way(argv, out: Path) -> subprocess.CompletedProcess:
    """Run ``argv`` in its own process group (as a terminal runs a command), send the group SIGINT once the
    audit's hash jobs have started (Ctrl-C), and return how it ended."""
    import os
    import signal
    import time

    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started = time.monotonic()
    while not (out / "logs" / "hash").exists() and p.poll() is None and time.monotonic() - started < 300:
        time.sleep(0.1)
    assert p.poll() is None, "the audit ended before it could be interrupted"
    os.killpg(p.pid, signal.SIGINT)
    stdout, stderr = p.communicate(timeout=300)
    return subprocess.CompletedProcess(argv, p.returncode, stdout, stderr)


def test_ctrl_c_during_an_audit_says_interrupted_exits_130_and_leaves_no_lock(tmp_path):
    """Ctrl-C during ``ckptaudit audit`` was reported as "the workflow failed: a job failed; see the logs" (exit 3):
    the SIGINT that reaches the whole process group kills the stage jobs, and the CLI read that as failed jobs.
    Now it says "interrupted" and exits 130 (128 + SIGINT, as a shell reports it); the lock on --out is released,
    so the next audit into the same folder runs to its verdict."""
    import json

    run = _thirty_units(tmp_path / "run")
    out = tmp_path / "out"
    p = _ctrl_c_mid_way([CKPTAUDIT, "audit", str(run), "--out", str(out)], out)
    assert p.returncode == 130, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.strip().splitlines() == [
        f"ckptaudit: interrupted (Ctrl-C): the workflow was stopped and wrote no verdict; run the same command "
        f"again (the lock on {out} is released; unfinished jobs are redone)"], p.stderr
    assert not (out / "verdict.json").exists()

    again = subprocess.run([CKPTAUDIT, "audit", str(run), "--out", str(out)], capture_output=True, text=True,
                           timeout=600)
    assert again.returncode in (0, 1), again.stderr
    v = json.loads((out / "verdict.json").read_text())
    assert len(v["units"]) == 30 and v["rollback"]["unit"] == "ckpt_000300.pt"


def test_ctrl_c_during_snakemake_audit_says_interrupted_and_exits_130(tmp_path):
    """The same through ``snakemake … audit``: its ``onerror`` said "the audit failed: a job failed; see the
    logs" and Snakemake exited 1, which cron reads as "roll back needed"."""
    run = _thirty_units(tmp_path / "run")
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path / "sm"), "--cores",
            "2", "audit", "--config", f"run_dir={run}", f"out_dir={out}"]
    p = _ctrl_c_mid_way(argv, out)
    assert p.returncode == 130, (p.returncode, p.stderr[-3000:])
    assert p.stderr.strip().splitlines()[-1] == (
        "ckptaudit: interrupted (Ctrl-C): the workflow was stopped and wrote no verdict; run the same command "
        "again (unfinished jobs are redone)")
    assert "a job failed" not in p.stderr and not (out / "verdict.json").exists()
    again = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    # 1 once snakemake exits with the verdict's code (this run's newest unit is a warm start)
    assert again.returncode in (0, 1) and (out / "verdict.json").exists(), again.stderr[-3000:]
