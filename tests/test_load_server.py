"""The audit's load server (ckptaudit/stages/load/server.py): one ``import torch`` per audit, the same rows as a load
job that imports torch itself, and nothing left behind by a killed audit."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ckptaudit import discovery as inventory
from ckptaudit.stages.load import server as load_server, loadtest
from ckptaudit.stages.scan import scan_units

from .conftest import CASES, REPO

LOCAL_CASES = REPO / "tests" / "cases"

#: Columns that differ between two loads of the same file (timings, the child's peak RSS).
_VARYING = ("load_seconds", "peak_rss_bytes")


def _served_rows(run_dir, server=None):
    """(load rows of ``run_dir`` through the loader of ``server``, files that server loaded for them)."""
    units, _, _ = inventory.discover(run_dir)
    ud = [u.to_dict() for u in units]
    scans, _, _ = scan_units(run_dir, ud, {})
    ld = load_server.loader(server)
    rows = loadtest.load_units(run_dir, ud, {s["unit"]: s for s in scans}, {}, ld)
    return [{k: v for k, v in r.to_record().items() if k not in _VARYING} for r in rows], ld.files_served


def _rows(run_dir, server=None):
    return _served_rows(run_dir, server)[0]


@pytest.fixture
def server(tmp_path):
    work = tmp_path / "work"
    pid = load_server.start(work, tmp_path / "server.log")
    assert pid
    yield load_server.info_path(work), pid
    load_server.stop(work)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is not alive
        return f.read().split(") ", 1)[1][0] != "Z"


@pytest.mark.parametrize("case", ["ok_full_torch", "ok_fw_lightning", "trunc_zip_at_50pct"])
def test_rows_from_the_server_equal_a_load_here(server, case):
    """Real framework files (Lightning's, whose AttributeDict is allowed by name), a truncated zip: the rows
    are the same whoever loads, and the server did load them."""
    info, _ = server
    base = LOCAL_CASES if (LOCAL_CASES / case).is_dir() else CASES
    here = _rows(base / case)
    rows, served = _served_rows(base / case, info)
    assert rows == here
    loaded = sum(r["status"] != "skipped" and not r["loaded_as"] for r in here)  # a file shown equal: not loaded
    assert served == loaded
    if case == "trunc_zip_at_50pct":
        assert loaded == 0  # the scan already knows the bytes are damaged: nothing to load
    else:
        assert loaded >= 1 and all(r["status"] == "ok" for r in here if r["status"] != "skipped")


def test_a_stale_record_loads_here_with_the_same_rows(tmp_path):
    """A SIGKILLed audit's ``load_server.json`` names a socket no one listens on: the job loads itself."""
    stale = tmp_path / "load_server.json"
    stale.write_text(json.dumps({"socket": str(tmp_path / "gone"), "pid": 0, "folder": str(tmp_path / "x")}))
    rows, served = _served_rows(CASES / "ok_full_torch", stale)
    assert rows == _rows(CASES / "ok_full_torch") and served == 0


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    """The audit's process is SIGKILLed (OOM killer, a cancelled cron job): its server notices within a
    second or two and exits, removing its socket folder."""
    work = tmp_path / "work"
    code = ("import sys, time; from ckptaudit.stages.load import server as load_server; "
            f"print(load_server.start({str(work)!r}), flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    folder = json.loads((work / "load_server.json").read_text())["folder"]
    assert _alive(pid) and os.path.isdir(folder)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 60  # the server's torch import is not interrupted; then it checks every second
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(pid)
    assert not os.path.exists(folder)


def test_stop_ends_the_server_and_forgets_it(tmp_path):
    work = tmp_path / "work"
    pid = load_server.start(work)
    folder = json.loads(load_server.info_path(work).read_text())["folder"]
    load_server.stop(work)
    assert not _alive(pid)
    assert not load_server.info_path(work).exists() and not os.path.exists(folder)
    load_server.stop(work)  # a second stop (onerror after onsuccess's): nothing to do


def test_started_here_is_a_live_server_this_process_started(tmp_path):
    """`ckptaudit audit` starts the server before it imports Snakemake (issue 45) and the Snakefile's onstart keeps
    it: it must not keep a server that has died (its loads would all fall back to importing torch in the jobs),
    nor one that another process's record names."""
    work = tmp_path / "work"
    assert load_server.started_here(work) is False
    pid = load_server.start(work)
    assert pid and load_server.started_here(work) is True
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        if not load_server.started_here(work):
            break
        time.sleep(0.05)
    assert load_server.started_here(work) is False
    load_server.stop(work)
    assert load_server.started_here(work) is False
    other = tmp_path / "other"  # a record this process did not write
    other.mkdir()
    load_server.info_path(other).write_text(json.dumps({"socket": "/nonexistent", "pid": os.getpid(), "folder": ""}))
    assert load_server.started_here(other) is False


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_connect(server):
    """The socket's folder is the server's own (0700): another user's process cannot ask it to load."""
    info, _ = server
    sock_path = json.loads(info.read_text())["socket"]
    code = ("import os, socket, sys; os.setgid(65534); os.setuid(65534); s = socket.socket(socket.AF_UNIX); "
            f"\ntry:\n s.connect({sock_path!r})\nexcept PermissionError:\n sys.exit(7)\nsys.exit(0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 7


def test_two_load_jobs_at_once_are_served_side_by_side(server):
    """Two parts' load jobs ask at the same time (2 cores, 2 jobs): each is served on its own thread, each gets its
    own rows and its own count of the bytes its loads read."""
    import threading

    info, _ = server
    cases = [LOCAL_CASES / "ok_fw_lightning", CASES / "ok_full_torch"]
    here = {c: _rows(c) for c in cases}
    got, errors = {}, []

    def job(c):
        try:
            before = loadtest.child_bytes_read()
            rows, served = _served_rows(c, info)
            got[c] = (rows, loadtest.child_bytes_read() - before, served)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=job, args=(c,)) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert {c: rows for c, (rows, _, _) in got.items()} == here
    assert all(n > 0 for _, n, _ in got.values())  # each load read its file's zip directory and pickle
    assert {c: served for c, (_, _, served) in got.items()} == {
        c: sum(r["status"] != "skipped" and not r["loaded_as"] for r in here[c]) for c in cases}


def test_a_record_left_by_another_audit_is_removed_never_signalled(tmp_path):
    """An output folder reused after a killed audit holds its ``load_server.json``: ``stop`` removes it but
    signals no pid and deletes no folder it names (the pid may be anyone's by now, the folder anything)."""
    keep = tmp_path / "not_ours"
    keep.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        work = tmp_path / "work"
        work.mkdir()
        load_server.info_path(work).write_text(json.dumps({"socket": "x", "pid": sleeper.pid, "folder": str(keep)}))
        load_server.stop(work)
        assert not load_server.info_path(work).exists()
        assert sleeper.poll() is None and keep.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_done_ends_the_server_once_the_loads_are_served(server):
    """The load_server_done rule's request: the server answers, exits and removes its socket folder; a job
    after it (or a second ``done``) finds no server and loads in its own process, with the same rows."""
    info, pid = server
    assert _rows(CASES / "ok_full_torch", info)
    folder = json.loads(info.read_text())["folder"]
    assert load_server.done(info) is True
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid) and not os.path.exists(folder)
    assert load_server.done(info) is False
    assert _rows(CASES / "ok_full_torch", info) == _rows(CASES / "ok_full_torch")
    # the rule's command: no server is no error
    r = subprocess.run([sys.executable, "-m", "ckptaudit.stages.load.server", "done", str(info)], capture_output=True)
    assert (r.returncode, r.stderr) == (0, b"")
