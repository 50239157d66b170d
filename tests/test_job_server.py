"""The stage job server (ckptaudit/stages/jobs/server.py): a stage job forked from it gives the same outputs, log and
exit status as the job in its own process; a killed job leaves nothing running; a job's death by a signal is its
process's; no server, or another interpreter's, and the job runs on its own."""

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from ckptaudit.stages.jobs import server as job_server
from ckptaudit.stages.jobs.costs import JOBS_NAME, job_costs

from .conftest import CASES


@pytest.fixture
def server(tmp_path):
    work = tmp_path / "work"
    old = os.environ.get(job_server.ENV)
    pid = job_server.start(work, tmp_path / "server.log")
    assert pid and os.environ[job_server.ENV]
    yield work, pid
    job_server.stop(work)
    assert job_server.ENV not in os.environ or os.environ[job_server.ENV] == old
    if old is not None:
        os.environ[job_server.ENV] = old


def _job(args, env_server: bool, cwd, **kw):
    env = dict(os.environ)
    if not env_server:
        env.pop(job_server.ENV, None)
    return subprocess.Popen([sys.executable, "-m", "ckptaudit.stages", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _inventory_args(run, out):
    return ["inventory", "--run-dir", str(run), "--out", str(out / "inv.parquet"), "--out-json",
            str(out / "inv.json"), "--out-pointers", str(out / "pointers.parquet")]


def _children(pid: int) -> list:
    """Processes whose parent is ``pid`` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(") ", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(d))
    return out


def _wait_for(pred, seconds=20.0):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if (got := pred()):
            return got
        time.sleep(0.05)
    return pred()


def test_a_job_in_the_server_writes_what_it_writes_alone(server, tmp_path):
    """The inventory of a real case, once through the server and once in its own process: the same tables, the
    same (empty) output, exit 0; the server recorded the forked child's cost."""
    work, _pid = server
    run = CASES / "ok_full_torch"
    got = {}
    for how in (True, False):
        out = tmp_path / f"out-{how}"
        out.mkdir()
        p = _job(_inventory_args(run, out), how, tmp_path)
        o, e = p.communicate(timeout=120)
        assert p.returncode == 0, e
        got[how] = (o, json.loads((out / "inv.json").read_text()), pq.read_table(out / "inv.parquet").to_pylist())
    inv_server, inv_alone = got[True][1], got[False][1]
    assert inv_server["units"] == inv_alone["units"] and inv_server["parts"] == inv_alone["parts"]
    assert got[True][2] == got[False][2] and got[True][0] == got[False][0]
    costs = job_costs(work)
    assert set(costs) == {("inventory", "inventory")}, costs
    assert costs[("inventory", "inventory")]["status"] == 0 and costs[("inventory", "inventory")]["max_rss_mib"] > 20


def test_a_usage_error_gives_the_same_status_and_message(server, tmp_path):
    """argparse's exit 2 and its message, in the job's own stderr, from the server as alone."""
    got = []
    for how in (True, False):
        p = _job(["hash", "--no-such-flag"], how, tmp_path)
        o, e = p.communicate(timeout=120)
        got.append((p.returncode, e.splitlines()[-1]))
    assert got[0] == got[1] and got[0][0] == 2 and "arguments are required: --inventory" in got[0][1], got


def test_an_uncaught_error_prints_its_traceback_and_exits_1(server, tmp_path):
    """A job whose inventory file is missing: exit 1 with Python's traceback (FileNotFoundError) in its stderr,
    as in its own process."""
    args = ["hash", "--inventory", str(tmp_path / "missing.json"), "--part", "p0000", "--out",
            str(tmp_path / "h.parquet"), "--out-facts", str(tmp_path / "f.parquet")]
    got = []
    for how in (True, False):
        p = _job(args, how, tmp_path)
        _o, e = p.communicate(timeout=120)
        got.append((p.returncode, e.strip().splitlines()[-1].split(":")[0]))
    assert got[0] == got[1] == (1, "FileNotFoundError"), got


def _blocked_hash_job(tmp_path):
    """A hash job that blocks: the run's checkpoint, once inventoried, is replaced by a FIFO that nothing writes
    (the pass's open waits)."""
    import shutil

    from ckptaudit.stages import cli

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(CASES / "ok_full_torch" / "ckpt.pt", run / "ckpt.pt")
    inv = tmp_path / "inventory.json"
    doc = cli.stage_inventory(str(run), "auto", str(tmp_path / "inv.parquet"), str(inv), str(tmp_path / "p.parquet"))
    assert list(doc["parts"]) == ["p0000"]
    (run / "ckpt.pt").unlink()
    os.mkfifo(run / "ckpt.pt")
    return ["hash", "--inventory", str(inv), "--part", "p0000", "--out", str(tmp_path / "h.parquet"),
            "--out-facts", str(tmp_path / "f.parquet")]


def test_a_killed_job_leaves_nothing_running(server, tmp_path):
    """Snakemake kills a job's process (Ctrl-C, a timeout): the server kills the forked child's process group."""
    _work, pid = server
    p = _job(_blocked_hash_job(tmp_path), True, tmp_path)
    child = _wait_for(lambda: _children(pid))
    assert child, "the job did not reach the server"
    time.sleep(0.3)
    with open(f"/proc/{child[0]}/comm") as f:  # ps and top name the stage a forked job runs
        assert f.read().strip() == "ckpt-hash"
    assert p.poll() is None, p.communicate()
    p.kill()
    p.wait(timeout=10)
    assert _wait_for(lambda: not _children(pid)), "the killed job's child still runs"


def test_a_child_killed_by_a_signal_kills_its_job_alike(server, tmp_path):
    """The forked child dies of SIGKILL (the OOM killer): the job's process dies of SIGKILL too."""
    _work, pid = server
    p = _job(_blocked_hash_job(tmp_path), True, tmp_path)
    child = _wait_for(lambda: _children(pid))
    assert child
    os.kill(child[0], signal.SIGKILL)
    _o, e = p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL, e


def test_stop_kills_running_jobs_and_forgets_the_server(server, tmp_path):
    work, pid = server
    p = _job(_blocked_hash_job(tmp_path), True, tmp_path)
    child = _wait_for(lambda: _children(pid))
    assert child
    folder = json.loads(job_server.info_path(work).read_text())["folder"]
    job_server.stop(work)
    _o, e = p.communicate(timeout=30)
    assert p.returncode == 1 and "the stage job server ended before this job did" in e
    assert not os.path.exists(f"/proc/{child[0]}") or open(f"/proc/{child[0]}/stat").read().rsplit(") ", 1)[1][0] == "Z"
    assert not job_server.info_path(work).exists() and not os.path.exists(folder)
    assert job_server.ENV not in os.environ
    job_server.stop(work)  # a second stop: nothing to do


def test_without_a_server_or_with_another_interpreters_the_job_runs_alone(server, tmp_path):
    """No server named (a cluster job, by hand), a stale socket, or a job run with another PYTHONPATH: the job
    runs in its own process (the server records no job) with the same result."""
    work, _pid = server
    run = CASES / "ok_full_torch"
    for i, env in enumerate(({job_server.ENV: str(tmp_path / "no-such-socket")},
                             {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])})):
        out = tmp_path / f"out{i}"
        out.mkdir()
        p = subprocess.run([sys.executable, "-m", "ckptaudit.stages", *_inventory_args(run, out)],
                           env={**os.environ, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads((out / "inv.json").read_text())["units"]
    assert job_costs(work) == {} and (work / JOBS_NAME).exists()


def test_a_killed_audit_leaves_no_server(tmp_path):
    """The process that started the server is SIGKILLed (a killed audit): the server notices within a few
    seconds and exits, its socket folder removed."""
    work = tmp_path / "work"
    p = subprocess.Popen([sys.executable, "-c", "import sys, time; from ckptaudit.stages.jobs import server; "
                          f"print(server.start({str(work)!r}), flush=True); time.sleep(600)"],
                         stdout=subprocess.PIPE, text=True)
    pid = int(p.stdout.readline())
    folder = json.loads(job_server.info_path(work).read_text())["folder"]
    p.kill()
    p.wait()
    assert _wait_for(lambda: not _alive(pid), 10.0), "the server outlived the audit that started it"
    assert _wait_for(lambda: not os.path.exists(folder), 5.0)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is not alive
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False
