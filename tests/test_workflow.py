"""The real Snakemake workflow, end to end, on a real demo run with a real crash."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, tree_digest

CLI = [sys.executable, "-m", "ckptaudit.cli"]


def run_cli(*args, cwd=None):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def audited(demo_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    before = tree_digest(demo_run.run_dir)
    p = run_cli("audit", str(demo_run.run_dir), "--out", str(out), "--cores", "2")
    return demo_run, out, p, before


def test_demo_audit_verdict(audited):
    run, out, p, before = audited
    assert p.returncode == 1, p.stdout + p.stderr  # roll back needed and possible
    v = json.loads((out / "verdict.json").read_text())
    assert v["schema"] == "ckptaudit.verdict/1"
    units = {u["unit"]: u for u in v["units"]}
    assert sorted(units) == [f"ckpt_{s:06d}.pt" for s in (50, 100, 150, 200, 250, 300)]
    trunc = units[run.truncated]
    assert trunc["usable_for"] == "none"
    assert [(f["layer"], f["kind"]) for f in trunc["findings"] if f["severity"] == "error"] == [
        ("file", "truncated_zip_no_central_directory")]
    flipped = units[run.flipped]
    assert flipped["usable_for"] == "none"
    assert {f["kind"] for f in flipped["findings"] if f["severity"] == "error"} == {"checksum_mismatch",
                                                                                  "zip_crc_mismatch"}
    assert v["recommendation"] == "resume"
    assert v["rollback"] == {"unit": "ckpt_000250.pt", "step": 250}
    assert v["steps_lost"] == 50
    for name in ("ckpt_000050.pt", "ckpt_000100.pt", "ckpt_000200.pt", "ckpt_000250.pt"):
        assert units[name]["usable_for"] == "resume"
        assert [f for f in units[name]["findings"] if f["severity"] != "info"] == []
    assert v["reasons"][0] == "Resume from ckpt_000250.pt (step 250), losing 50 steps."
    assert "RESUME from ckpt_000250.pt (step 250), 50 steps lost" in p.stdout


def test_demo_audit_outputs(audited):
    run, out, p, before = audited
    html = (out / "report.html").read_text()
    assert "<script" not in html and "http://" not in html.replace("https://pytorch.org", "")
    assert "Recommendation: RESUME" in html and "ckpt_000250.pt" in html
    import pyarrow.parquet as pq

    for t in ("inventory", "hash", "scan", "tensors", "imports", "load", "structure", "configdiff", "state",
              "units", "pointers"):
        assert (out / "tables" / f"{t}.parquet").exists(), t
    hashes = pq.read_table(out / "tables" / "hash.parquet").to_pylist()
    by_file = {h["file"]: h for h in hashes}
    assert by_file[run.flipped]["verified"] is False
    assert by_file["ckpt_000250.pt"]["verified"] is True
    load = {r["unit"]: r for r in pq.read_table(out / "tables" / "load.parquet").to_pylist()}
    assert load["ckpt_000250.pt"]["status"] == "ok"
    assert load[run.truncated]["status"] == "skipped"
    # every load went to the audit's one load server (ckptaudit/stages/load/server.py), which is gone afterwards
    served = sum(json.loads(p.read_text())["served_files"] for p in (out / "work" / "bytes" / "load").glob("*.json"))
    tested = [r for r in load.values() if r["status"] != "skipped"]
    assert len(tested) == 4 and all(r["status"] == "ok" for r in tested)
    # a file equal to a loaded one where torch's load does not look names it, and is not loaded again
    assert served == sum(not r["loaded_as"] for r in tested) >= 1
    assert {r["loaded_as"] for r in tested if r["loaded_as"]} <= {r["file"] for r in tested if not r["loaded_as"]}
    assert not (out / "work" / "load_server.json").exists()
    # it exited when the last load job had run (rule load_server_done), not at the end of the audit
    assert (out / "work" / "load_server.done").exists()
    assert "every load job has run; exiting" in (out / "logs" / "load_server.log").read_text()


def test_audit_changes_nothing(audited):
    run, out, p, before = audited
    assert tree_digest(run.run_dir) == before


def part_mtimes(out: Path):
    return {str(p.relative_to(out / "tables" / "parts")): p.stat().st_mtime_ns for p in (out / "tables" / "parts").rglob("*.parquet")}


def test_rerun_with_reuse_does_nothing_then_picks_up_new_unit(demo_run, tmp_path):
    """With ``--reuse``, re-auditing an unchanged run must not re-hash anything; a new checkpoint
    re-runs only inventory, its own part and the report.  One unit per part
    (``units_per_job: 1``): "auto" packs the small demo units into one part.  (Without ``--reuse`` every
    part is redone: tests/test_rerun.py.)"""
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    out = tmp_path / "audit"
    cfg = tmp_path / "one-per-part.yaml"
    cfg.write_text("units_per_job: 1\n")
    audit = ("audit", str(run), "--out", str(out), "--cores", "2", "--config", str(cfg), "--reuse")
    assert run_cli(*audit).returncode == 1
    first = part_mtimes(out)
    assert len([k for k in first if k.startswith("hash/")]) == 6
    assert run_cli(*audit).returncode == 1
    assert part_mtimes(out) == first, "an unchanged run was audited again"
    shutil.copy(run / "ckpt_000250.pt", run / "ckpt_000350.pt")
    p = run_cli(*audit)
    assert p.returncode == 1, p.stdout + p.stderr
    after = part_mtimes(out)
    assert {k: after[k] for k in first} == first, "old parts were recomputed"
    tables = {k.split("/")[0] for k in first}  # every per-part table (hash, scan, tensors, … and any added later)
    assert tables >= {"configdiff", "hash", "imports", "load", "scan", "state", "structure", "tensors"}
    assert sorted(set(after) - set(first)) == sorted(f"{s}/p0006.parquet" for s in tables)
    v = json.loads((out / "verdict.json").read_text())
    u = next(u for u in v["units"] if u["unit"] == "ckpt_000350.pt")
    assert {f["kind"] for f in u["findings"]} >= {"step_name_disagrees"}


def test_unit_beyond_path_max_is_a_finding_and_the_good_unit_the_rollback_point(demo_run, tmp_path):
    """A unit 200 folders deep (its path over PATH_MAX, 4096 bytes) ended the whole audit with exit 3
    (``OSError: File name too long``); it must get a path_too_long finding, and the good unit be the
    rollback point."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(demo_run.run_dir / "ckpt_000050.pt", run / "ckpt_000050.pt")
    data = (demo_run.run_dir / "ckpt_000100.pt").read_bytes()
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(200):  # made through descriptors: the path is too long to name
        os.mkdir(f"nested_folder_number_{i:03d}", dir_fd=fd)
        sub = os.open(f"nested_folder_number_{i:03d}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    w = os.open("ckpt_000100.pt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(w, data)
    os.close(w)
    os.close(fd)
    out = tmp_path / "audit"
    p = run_cli("audit", str(run), "--out", str(out), "--cores", "2")
    assert p.returncode == 1, p.stdout + p.stderr  # roll back needed and possible
    v = json.loads((out / "verdict.json").read_text())
    assert (v["recommendation"], v["rollback"]) == ("resume", {"unit": "ckpt_000050.pt", "step": 50})
    deep = "/".join(f"nested_folder_number_{i:03d}" for i in range(200)) + "/ckpt_000100.pt"
    units = {u["unit"]: u for u in v["units"]}
    assert sorted(units) == ["ckpt_000050.pt", deep]
    assert (units[deep]["step"], units[deep]["usable_for"]) == (100, "none")
    (f,) = units[deep]["findings"]
    assert (f["layer"], f["kind"], f["severity"], f["path"]) == ("file", "path_too_long", "error", deep)
    n = len(os.fsencode(str(run))) + 1 + len(deep)
    assert f["message"] == (f"{deep[:60]}…({len(deep) - 120:,} characters)…{deep[-60:]} is not read: its path is "
                            f"{n:,} bytes, over this system's limit (PATH_MAX: a path of 4,096 bytes or more cannot "
                            "be opened by name); a training job cannot open it by this path either.")
    assert f["next_step"].startswith("Move or rename it to a shorter path")
    assert units["ckpt_000050.pt"]["usable_for"] == "resume"


def test_paths_with_spaces_and_quotes(demo_run, tmp_path):
    """A run folder and an output folder whose names hold spaces and a quote: every rule's shell command quotes
    the paths it is given (a new user's ``--out "/tmp/sp audit"`` failed in stage_config with an empty log)."""
    run = tmp_path / "my run's ckpts"
    run.mkdir()
    shutil.copy(demo_run.run_dir / "ckpt_000050.pt", run / "ckpt_000050.pt")
    out = tmp_path / "audit out" / "it's here"
    p = run_cli("audit", str(run), "--out", str(out), "--cores", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    v = json.loads((out / "verdict.json").read_text())
    assert v["rollback"] == {"unit": "ckpt_000050.pt", "step": 50} and (out / "report.html").is_file()


def test_bad_arguments_exit_3(tmp_path):
    p = run_cli("audit", str(tmp_path / "missing"), "--out", str(tmp_path / "o"))
    assert p.returncode == 3
    assert "not a folder" in p.stderr


def test_snakemake_lint_is_clean():
    p = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Congratulations" in p.stdout + p.stderr
