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


def test_snakemake_missing_run_folder_and_config_typo_stop_in_a_few_lines(where):
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--config", f"run_dir={where}/missing")
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert len(out.strip().splitlines()) <= 15, out
    assert f"{where}/missing: does not exist" in out
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--configfile", str(where / "key.yaml"))
    out = p.stdout + p.stderr
    assert p.returncode != 0 and len(out.strip().splitlines()) <= 15, out
    assert "laod: unknown key (did you mean 'load'?)" in out
    assert "properties:" not in out  # not the schema dump


def test_snakemake_usage_errors_exit_3_and_say_what_lands_in_the_run(where):
    """Config and path errors at parse time exit 3 (as ckptaudit audit does), never 1 ("roll back"); the
    out-inside-run line names what Snakemake would write there (.snakemake/ stays in its working directory)."""
    p = _snakemake(where, "-n", "audit", "--cores", "1", "--config", f"run_dir={where}/missing")
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
