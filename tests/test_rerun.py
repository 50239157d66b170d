"""Audits into an output folder that an earlier audit used: re-verified bytes, reuse, SIGKILL, two at once."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from html import unescape
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "ckptaudit.cli"]


def run_cli(*args):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=600)


def outcome(out: Path) -> dict:
    """What a verdict decides, without its times: recommendation, rollback point, each unit's use and errors."""
    v = json.loads((out / "verdict.json").read_text())
    return {"recommendation": v["recommendation"], "rollback": v["rollback"], "steps_lost": v["steps_lost"],
            "units": {u["unit"]: (u["usable_for"], sorted(f["kind"] for f in u["findings"]
                                                          if f["severity"] == "error")) for u in v["units"]}}


def flip_keeping_times(path: Path) -> None:
    """Silent corruption as a disk or a bad copy leaves it: one byte in the middle inverted, size and mtime
    (and atime) put back with os.utime."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def one_per_part(tmp_path: Path) -> Path:
    """A config with one unit per part, so a new unit is a new part ("auto" packs the demo's units in one)."""
    cfg = tmp_path / "one-per-part.yaml"
    cfg.write_text("units_per_job: 1\n")
    return cfg


def hash_part_mtimes(out: Path) -> dict:
    return {p.name: p.stat().st_mtime_ns for p in (out / "tables" / "parts" / "hash").glob("*.parquet")}


@pytest.fixture
def run_copy(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    return run


def test_bit_rot_with_size_and_mtime_kept_is_caught_by_the_next_audit(run_copy, tmp_path):
    """A nightly audit into the same --out reused the old parts (keyed by names, sizes and mtimes) and said
    RESUME from a checkpoint whose bytes had changed: re-runs now hash every byte again, and --reuse keys
    on ctime and inode as well, which os.utime cannot put back."""
    out = tmp_path / "audit"
    audit = ("audit", str(run_copy), "--out", str(out), "--cores", "2")
    p = run_cli(*audit)
    assert p.returncode == 1, p.stdout + p.stderr
    assert outcome(out)["rollback"] == {"unit": "ckpt_000250.pt", "step": 250}
    first = json.loads((out / "verdict.json").read_text())
    assert first["bytes_verified"]["units_reverified"] == 6 and first["bytes_verified"]["units_reused"] == 0

    flip_keeping_times(run_copy / "ckpt_000250.pt")  # the rollback point rots
    p = run_cli(*audit)
    assert p.returncode == 1, p.stdout + p.stderr
    o = outcome(out)
    assert o["units"]["ckpt_000250.pt"][0] == "none"
    assert "checksum_mismatch" in o["units"]["ckpt_000250.pt"][1]
    assert o["rollback"] == {"unit": "ckpt_000200.pt", "step": 200}
    assert "RESUME from ckpt_000200.pt (step 200)" in p.stdout
    v = json.loads((out / "verdict.json").read_text())
    assert v["bytes_verified"]["reuse"] is False and v["bytes_verified"]["units_reverified"] == 6
    assert all(u["reverified"] for u in v["units"])

    # --reuse: an unchanged run is not audited again (no job) ...
    reuse = (*audit, "--config", str(one_per_part(tmp_path)), "--reuse")
    assert run_cli(*reuse).returncode == 1  # the first --reuse audit: the parts' key and grouping change, all redone
    before = hash_part_mtimes(out)
    written = (out / "verdict.json").stat().st_mtime_ns
    p = run_cli(*reuse)
    assert p.returncode == 1, p.stdout + p.stderr
    assert hash_part_mtimes(out) == before and (out / "verdict.json").stat().st_mtime_ns == written
    # ... a new unit is the only one hashed, and the report says the others were reused
    shutil.copy(run_copy / "ckpt_000200.pt", run_copy / "ckpt_000350.pt")
    p = run_cli(*reuse)
    assert p.returncode == 1, p.stdout + p.stderr
    after = hash_part_mtimes(out)
    assert {k: after[k] for k in before} == before and len(after) == len(before) + 1
    v = json.loads((out / "verdict.json").read_text())
    assert v["bytes_verified"]["reuse"] is True
    assert (v["bytes_verified"]["units_reverified"], v["bytes_verified"]["units_reused"]) == (1, 6)
    units = {u["unit"]: u for u in v["units"]}
    assert units["ckpt_000350.pt"]["reverified"] is True
    assert not any(units[u]["reverified"] for u in units if u != "ckpt_000350.pt")
    assert all(units[u]["last_hashed_utc"] < v["bytes_verified"]["audit_started_utc"] for u in units
               if u != "ckpt_000350.pt")
    html = unescape((out / "report.html").read_text())
    assert "hashed the bytes of 1 unit again and <strong>reused 6 units' earlier results</strong>" in html
    assert "(reused)" in html
    (run_copy / "ckpt_000350.pt").unlink()

    # ... but a byte flipped with size and mtime put back changes the ctime: the part is hashed again
    flip_keeping_times(run_copy / "ckpt_000200.pt")
    p = run_cli(*reuse)
    assert p.returncode == 1, p.stdout + p.stderr
    o = outcome(out)
    assert "checksum_mismatch" in o["units"]["ckpt_000200.pt"][1]
    assert o["rollback"] == {"unit": "ckpt_000100.pt", "step": 100}


def test_bit_rot_with_size_and_mtime_kept_is_caught_without_sidecars(run_copy, tmp_path):
    """Without sidecars no recorded SHA-256 can see a flipped byte: the default re-run compares the BLAKE3 the
    previous audit into the same --out recorded (issue 45), even where no zip record's CRC-32 covers the byte."""
    for side in [*run_copy.glob("*.sha256"), *run_copy.glob("*.sha256sum"), *run_copy.glob("*.manifest.json")]:
        side.unlink()
    out = tmp_path / "audit"
    audit = ("audit", str(run_copy), "--out", str(out), "--cores", "2")
    p = run_cli(*audit)
    assert p.returncode == 1, p.stdout + p.stderr
    first = json.loads((out / "verdict.json").read_text())
    assert first["bytes_verified"]["digest_algorithms"] == {"blake3": 6}
    assert outcome(out)["rollback"] == {"unit": "ckpt_000250.pt", "step": 250}

    rot = run_copy / "ckpt_000250.pt"
    data = rot.read_bytes()
    flip_keeping_times(rot)
    p = run_cli(*audit)
    assert p.returncode == 1, p.stdout + p.stderr
    o = outcome(out)
    assert o["units"]["ckpt_000250.pt"][0] == "none"
    assert "digest_changed_since_last_audit" in o["units"]["ckpt_000250.pt"][1]
    assert o["rollback"] == {"unit": "ckpt_000200.pt", "step": 200}
    v = json.loads((out / "verdict.json").read_text())
    (f,) = [f for u in v["units"] if u["unit"] == "ckpt_000250.pt" for f in u["findings"]
            if f["kind"] == "digest_changed_since_last_audit"]
    import blake3

    assert f["detail"]["expected"] == blake3.blake3(data).hexdigest() != f["detail"]["actual"]


@pytest.fixture(scope="module")
def fresh(demo_run, tmp_path_factory):
    """The verdict of one uninterrupted audit of the demo run."""
    out = tmp_path_factory.mktemp("fresh")
    p = run_cli("audit", str(demo_run.run_dir), "--out", str(out), "--cores", "2")
    assert p.returncode == 1, p.stdout + p.stderr
    return outcome(out)


def start_audit(run: Path, out: Path) -> subprocess.Popen:
    """An audit in its own process group, as cron or a shell job control starts one."""
    return subprocess.Popen(CLI + ["audit", str(run), "--out", str(out), "--cores", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(path: Path, proc: subprocess.Popen, seconds: float = 300) -> None:
    end = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"the audit ended (exit {proc.returncode}) before {path} appeared"
        assert time.monotonic() < end, f"{path} did not appear in {seconds} s"
        time.sleep(0.05)


@pytest.mark.parametrize("stage, sig, group", [("inventory", signal.SIGKILL, True), ("hash", signal.SIGKILL, True),
                                               ("report", signal.SIGKILL, True), ("hash", signal.SIGTERM, False)])
def test_audit_killed_mid_stage_then_rerun_into_same_out(demo_run, fresh, tmp_path, stage, sig, group):
    """After a SIGKILL (OOM killer, a cancelled cron job, a preempted node) every later audit into the same
    --out stopped with Snakemake's IncompleteFilesException or its stale lock: the re-run now redoes what was
    cut short and gives the uninterrupted audit's verdict.  SIGKILL goes to the whole process group (the
    audit and every job it started); SIGTERM to the audit's process only, as `kill PID` sends it."""
    out = tmp_path / "audit"
    proc = start_audit(demo_run.run_dir, out)
    wait_for(out / "logs" / stage, proc)  # the stage's first job has started
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    proc.wait(timeout=120)
    assert proc.returncode != 0
    p = run_cli("audit", str(demo_run.run_dir), "--out", str(out), "--cores", "2")
    assert p.returncode == 1, p.stdout + p.stderr
    assert outcome(out) == fresh


def test_two_audits_into_one_out_at_once(demo_run, fresh, tmp_path):
    """Two audits started at once into one --out wrote the same files: the second now stops at once with one
    line naming the first, exit 3, and the first ends as if alone."""
    out = tmp_path / "audit"
    first = start_audit(demo_run.run_dir, out)
    wait_for(out / "logs" / "inventory", first)  # the first holds the folder's lock before its first job
    # paused while the second starts: a demo audit can end before a second CLI has imported its way to the lock
    os.killpg(first.pid, signal.SIGSTOP)
    try:
        second = run_cli("audit", str(demo_run.run_dir), "--out", str(out), "--cores", "2")
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert second.returncode == 3
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert lines[0].startswith(f"ckptaudit: error: another audit is writing to {out} (pid {first.pid} on ")
    assert lines[0].endswith("wait for it to end, or give this audit another output folder")
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 1, stdout + stderr
    assert outcome(out) == fresh
