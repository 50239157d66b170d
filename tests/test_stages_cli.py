"""``python -m ckptaudit.stages``: one sub-command per rule, each with its required arguments."""

import pytest

from ckptaudit.stages import cli as stages


@pytest.mark.parametrize("argv,missing", [
    (["hash", "--inventory", "inv.json", "--out", "h.parquet"], "--part"),
    (["scan", "--inventory", "inv.json", "--part", "p0000", "--out", "s.parquet"], "--config"),
    (["inventory", "--out", "i.parquet", "--out-json", "i.json", "--out-pointers", "p.parquet"], "--run-dir"),
])
def test_a_missing_argument_is_a_usage_error_naming_it(argv, missing, capsys):
    with pytest.raises(SystemExit) as e:
        stages.main(argv)
    assert e.value.code == 2
    assert f"the following arguments are required: {missing}" in capsys.readouterr().err


def test_every_rule_of_the_workflow_has_a_sub_command():
    import re
    from pathlib import Path

    rules = Path(__file__).resolve().parents[1] / "rules"
    used = {m for p in rules.glob("*.smk") for m in re.findall(r"-m ckptaudit\.stages (\w+)", p.read_text())}
    assert used == set(stages.STAGES) == set(stages._ARGS) | {"target", "report"}


@pytest.mark.parametrize("rule", ["target", "report"])
def test_target_and_report_parse_their_own_arguments(rule, capsys):
    """``python -m ckptaudit.stages report …`` hands its arguments to ckptaudit.stages.report, whose parser
    names the missing ones (and the target's its sub-commands)."""
    with pytest.raises(SystemExit) as e:
        stages.main([rule])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"python -m ckptaudit.stages {rule}" in err
    assert ("--inventory" if rule == "report" else "COMMAND") in err


def test_stage_jobs_allocate_arrow_memory_from_jemalloc():
    """pyarrow's default pool (mimalloc) kept ~100 MB more of what a stage freed at 100,000 tensors (issue 22):
    stage processes switch to jemalloc, which pyarrow's Linux wheels include."""
    import platform
    import subprocess
    import sys

    code = "from ckptaudit.stages.jobs.process import job_memory_pool; print(job_memory_pool())"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    if platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64"):
        assert got == "jemalloc"
    else:
        assert got  # the wheel's own default where it has no jemalloc


def test_stage_jobs_collect_garbage_less_often():
    """A stage job raises the collector's first threshold (its many short-lived rows are no cycles) and keeps the
    others; the hash stage's plan of a file in memory makes no class per file (a cycle that held its bytes)."""
    import gc
    import subprocess
    import sys

    from ckptaudit.onepass import plan

    code = ("import gc; from ckptaudit.stages.jobs.process import fewer_collections as f; d = gc.get_threshold(); "
            "f(); print(gc.get_threshold()[0], gc.get_threshold()[1:] == d[1:])")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert got == ["50000", "True"]
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.ones(3), "step": 7}, buf)
    assert plan.plan_file("m.pt", buf.getvalue()).crc_range is not None
    gc.collect()
    gc.disable()
    try:
        before = gc.collect()
        plan.plan_file("m.pt", buf.getvalue())
        assert gc.collect() == before == 0
    finally:
        gc.enable()


def test_a_forked_job_allocates_from_malloc_and_keeps_it():
    """A job forked by the stage job server: jemalloc's purging threads do not survive the fork (the report of
    10,000 units peaked 136 MiB higher), so the child takes the C library's malloc, and the stage's own
    ``job_memory_pool`` keeps the pool chosen before it."""
    import subprocess
    import sys

    code = ("from ckptaudit.stages.jobs.process import forked_job_memory_pool, job_memory_pool; "
            "print(forked_job_memory_pool(), job_memory_pool())")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert got == ["system", "system"]
