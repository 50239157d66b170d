"""Cluster execution: resource sizing (pure functions), the SLURM profile, and the audit
of a real demo run on a real single-node SLURM (Debian's slurm-wlm + munge).

The SLURM test starts the cluster itself (``ckptaudit.cluster.start_local_slurm``) when
``sinfo`` shows none and this is root with slurm-wlm installed; it is skipped only when
the SLURM binaries are absent (CI installs them: ``.ci/slurm-setup.sh``).
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ckptaudit import cluster
from ckptaudit.cluster import MIB, mem_mb_for, part_size, run_size, runtime_for

from .conftest import REPO

CLI = [sys.executable, "-m", "ckptaudit.cli"]
PROFILE = REPO / "config" / "profiles" / "slurm" / "config.yaml"
PART_STAGES = ("hash", "scan", "load", "configdiff", "structure", "state")


# ------------------------------------------------------------------------------------------
# Sizing
# ------------------------------------------------------------------------------------------


def test_mem_mb_only_load_grows_with_the_unit():
    assert [mem_mb_for(s, 10 << 30) for s in PART_STAGES] == [512, 512, 1024 + 2 * 10240, 512, 768, 768]
    assert mem_mb_for("load", 0) == 1024
    assert mem_mb_for("load", 100 * MIB) == 1224
    assert mem_mb_for("load", 100 * MIB + 1) == 1225  # rounded up, never down


def test_mem_mb_load_capped_by_the_load_tests_own_limit():
    """The load child cannot use more than load.memory_limit_mib, so asking more wastes the queue."""
    assert mem_mb_for("load", 100 << 30, load_limit_mib=8192) == 1024 + 8192
    assert mem_mb_for("load", 1 << 20, load_limit_mib=8192) == 1026
    assert mem_mb_for("hash", 100 << 30, load_limit_mib=64) == 512


def test_mem_mb_report_grows_with_units_and_retries_ask_for_more():
    assert mem_mb_for("report", n_units=2000) == 1024 + 500
    assert mem_mb_for("load", 100 * MIB, attempt=2) == 2 * 1224
    assert mem_mb_for("hash", attempt=3) == 3 * 512
    assert mem_mb_for("hash", attempt=0) == 512


def test_hash_threads_follow_the_parts_bytes_not_its_unit_count():
    """A part of big units asks for a core per unit it hashes at once; a part of many small units, whose hashing
    is Python under the GIL, asks for one (so other parts' jobs keep the other cores)."""
    from ckptaudit.cluster import hash_threads

    assert hash_threads(3 << 30, 3) == 3
    assert hash_threads(16 << 20, 64) == 1
    assert hash_threads(600 * MIB, 16) == 2
    assert hash_threads(0, 0) == 1


def test_runtime_minutes_from_bytes_units_and_attempt():
    assert runtime_for("hash", 0, 1) == 1 + 1  # 1 s per unit, doubled, rounded up to a minute
    # 6000 MiB at 100 MiB/s = 60 s, + 32 units x 1 s = 92 s, doubled = 184 s -> 4 min, + 1 base
    assert runtime_for("hash", 6000 * MIB, 32) == 5
    # load: 60 s + 32 x 5 s = 220 s, doubled 440 s, + one hung unit's 120 s timeout = 560 s -> 10 min
    assert runtime_for("load", 6000 * MIB, 32, load_timeout_s=120) == 11
    assert runtime_for("structure", 10 << 30, 32) == 1 + 2  # metadata only: bytes do not count
    assert runtime_for("structure", 10 << 30, 32, attempt=3) == 3 * 3
    assert runtime_for("inventory", 0, 0) == 10
    assert runtime_for("report", 0, 2000) == 5 + 7


def test_unknown_stage_is_refused():
    with pytest.raises(ValueError, match=r"unknown stage 'drill': expected one of \['configdiff', "):
        mem_mb_for("drill", 0)
    with pytest.raises(ValueError, match="unknown stage 'hashes'"):
        runtime_for("hashes", 0)


def test_part_and_run_size_from_the_inventory():
    inv = {"parts": {"p0000": ["a.pt", "b.pt"], "p0001": ["c"]},
           "units": [{"unit": "a.pt", "size_bytes": 10}, {"unit": "b.pt", "size_bytes": 30},
                     {"unit": "c", "size_bytes": 5}]}
    assert part_size(inv, "p0000") == (40, 30, 2)
    assert part_size(inv, "p0001") == (5, 5, 1)
    assert part_size(inv, "p9999") == (0, 0, 0)
    assert run_size(inv) == (45, 30, 3)
    assert cluster.part_sizes(inv) == {"p0000": (40, 30, 2), "p0001": (5, 5, 1)}


def test_slurm_conf_has_what_a_rootless_container_needs():
    text = cluster.slurm_conf_text("vm", "NodeName=vm CPUs=2 RealMemory=2000", Path("/s"))
    for line in ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
                 "AccountingStorageType=accounting_storage/none", "SelectType=select/cons_tres", "MinJobAge=600",
                 "NodeName=vm CPUs=2 RealMemory=2000 NodeAddr=127.0.0.1 State=UNKNOWN",
                 "PartitionName=local Nodes=vm Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"):
        assert line in text.splitlines(), line
    assert text.startswith(cluster.MARKER)


# ------------------------------------------------------------------------------------------
# Profile and command line (no cluster needed)
# ------------------------------------------------------------------------------------------


def test_profile_settings():
    prof = yaml.safe_load(PROFILE.read_text())
    assert prof["executor"] == "slurm"
    assert prof["keep-going"] is True
    assert prof["retries"] == 2 and prof["slurm-requeue"] is True
    assert prof["group-components"] == {"unit": 1}
    assert prof["cores"] == 1
    assert "slurm-no-account" not in prof and "slurm-status-command" not in prof  # site settings, not ours


def test_per_part_rules_share_group_unit_and_size_their_resources():
    for stage in PART_STAGES:
        text = (REPO / "rules" / f"{stage}.smk").read_text()
        assert "group:\n        PART_GROUP" in text, stage
        assert f'mem_mb=get_part_mem_mb("{stage}")' in text and f'runtime=get_part_runtime("{stage}")' in text
        assert "inventory_done=get_inventory_done" in text, stage


def test_resolve_profile_bundled_path_and_unknown():
    import click

    from ckptaudit.cli import resolve_profile

    assert resolve_profile("slurm") == str(REPO / "config" / "profiles" / "slurm")
    assert resolve_profile(str(PROFILE.parent)) == str(PROFILE.parent)
    with pytest.raises(click.ClickException, match="--profile no-such-profile: no such profile"):
        resolve_profile("no-such-profile")


def test_audit_with_unknown_profile_exits_3(demo_run, tmp_path):
    p = subprocess.run(CLI + ["audit", str(demo_run.run_dir), "--out", str(tmp_path / "o"), "--profile", "nope"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stdout + p.stderr
    assert "--profile nope: no such profile" in p.stderr


def test_snakemake_dry_run_with_the_profile(demo_run, tmp_path):
    """`snakemake --profile config/profiles/slurm audit` parses the profile (plugin settings
    included) and sizes the inventory job; resources that read the inventory fall back to
    their baselines while it has not run (Snakemake would otherwise fail on them)."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    p = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path),
         "--profile", str(PROFILE.parent), "--dry-run", "audit",
         "--config", f"run_dir={demo_run.run_dir}", f"out_dir={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert re.search(r"^checkpoint inventory:\n(?:    .*\n)*?    resources: .*mem_mb=512, .*runtime=10$", out, re.M), out
    assert re.search(r"^rule report:\n(?:    .*\n)*?    resources: .*mem_mb=1024, .*runtime=5$", out, re.M), out


# ------------------------------------------------------------------------------------------
# A real SLURM
# ------------------------------------------------------------------------------------------


def ensure_slurm():
    """A usable single-node SLURM, started here when needed; skip only without slurm-wlm."""
    if not cluster.slurm_installed():
        pytest.skip("SLURM is not installed (apt-get install slurm-wlm munge; .ci/slurm-setup.sh does it)")
    if not cluster.cluster_ready():
        cluster.start_local_slurm()  # raises SlurmSetupError with the daemons' logs


def without_paths(doc, *paths):
    """The verdict without its output folder's paths and without when its audit ran and hashed each unit
    (``bytes_verified``, ``last_hashed_utc``: per audit, never equal across two)."""
    text = json.dumps(doc, sort_keys=True)
    for p in paths:
        text = text.replace(str(p), "<OUT>")
    out = json.loads(text)
    out.pop("bytes_verified", None)
    for u in out.get("units", []):
        u.pop("last_hashed_utc", None)
        u.pop("last_verified_utc", None)  # the same time, as verify_budget.annotate names it
    return out


def scontrol_job(job_id: int) -> dict:
    p = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, f"scontrol show job {job_id}: {p.stdout}{p.stderr}"
    return dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_audit_equals_local(demo_run, tmp_path):
    """The same demo run audited locally and through SLURM gives the same verdict, and the
    SLURM jobs really ran under SLURM with the sized resources."""
    pytest.importorskip("snakemake_executor_plugin_slurm")  # the dev extra installs it
    ensure_slurm()
    run = str(demo_run.run_dir)
    local_out, slurm_out = tmp_path / "local", tmp_path / "slurm"
    one_per_part = tmp_path / "one-per-part.yaml"  # 6 parts ("auto" packs the small demo units into one)
    one_per_part.write_text("units_per_job: 1\n")
    # SLURM through `ckptaudit audit --profile slurm --executor slurm`, with the settings a
    # cluster without accounting database needs, and 3 parts per group job (group-components
    # at work; 2 jobs fill a 2-CPU node); the local audit runs meanwhile (SLURM mostly waits).
    slurm = subprocess.Popen(
        CLI + ["audit", run, "--out", str(slurm_out), "--config", str(one_per_part), "--profile", "slurm",
               "--executor", "slurm", "--",
               *cluster.LOCAL_EXECUTOR_ARGS, "--group-components", "unit=3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    local = subprocess.run(CLI + ["audit", run, "--out", str(local_out), "--config", str(one_per_part), "--cores", "2"],
                           capture_output=True,
                           text=True, timeout=600)
    try:
        s_out, s_err = slurm.communicate(timeout=900)
    except subprocess.TimeoutExpired:  # e.g. the controller was restarted and forgot the jobs
        slurm.kill()
        s_out, s_err = slurm.communicate()
        queue = subprocess.run(["squeue", "-t", "all"], capture_output=True, text=True).stdout
        pytest.fail(f"the SLURM audit did not finish in 900 s; squeue -t all:\n{queue}\n{s_out[-3000:]}{s_err[-3000:]}")
    assert local.returncode == 1, local.stdout + local.stderr
    assert slurm.returncode == 1, s_out + s_err  # 1: roll back needed and possible, as locally
    v_local = json.loads((local_out / "verdict.json").read_text())
    v_slurm = json.loads((slurm_out / "verdict.json").read_text())
    assert without_paths(v_slurm, slurm_out) == without_paths(v_local, local_out)
    # the cluster jobs got the audit's id (from the environment sbatch passes on): every unit hashed by this audit
    assert v_slurm["bytes_verified"]["units_reverified"] == 6 and all(u["reverified"] for u in v_slurm["units"])
    assert v_slurm["rollback"] == {"unit": "ckpt_000250.pt", "step": 250}

    logs = slurm_out / ".snakemake" / "slurm_logs"
    by_kind = {}
    for f in sorted(logs.rglob("*.log")):
        assert f.stem.isdigit(), f"{f}: a SLURM log is named after its job id"
        by_kind.setdefault(f.parent.name.split("_")[0] + "_" + f.parent.name.split("_")[1], []).append(int(f.stem))
    assert sorted(by_kind) == ["group_unit", "rule_inventory", "rule_report"], by_kind
    assert len(by_kind["group_unit"]) == 2  # 6 parts, 3 per group job
    inv = json.loads((slurm_out / "work" / "inventory.json").read_text())
    load_mem = {mem_mb_for("load", part_size(inv, p)[1], load_limit_mib=8192) for p in inv["parts"]}
    for kind, ids in by_kind.items():
        for job_id in ids:
            job = scontrol_job(job_id)
            assert job["JobState"] == "COMPLETED", (kind, job_id, job)
            assert job["NumCPUs"] == "1", (kind, job)
            mem = int(job["MinMemoryNode"].rstrip("M"))
            if kind == "rule_inventory":
                assert (mem, job["TimeLimit"]) == (512, "00:10:00")
            elif kind == "rule_report":
                assert mem == mem_mb_for("report", n_units=6)
            else:
                assert mem in load_mem, (mem, load_mem)  # a group asks for its largest member
            text = (logs.glob(f"*/{job_id}.log").__next__()).read_text()
            assert "Finished jobid" in text or "steps (100%) done" in text, text[-2000:]
