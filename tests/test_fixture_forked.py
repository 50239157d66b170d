"""The framework fixtures' processes start from a fork server (tests/frameworks/_forked.py): each must end as the
fresh interpreter it replaces would (exit codes, a real SIGKILL, its environment and folder, its atexit handlers
and its own child processes), or a fixture's truth could differ from what a framework run from the shell does."""

from __future__ import annotations

import atexit
import json
import os
import signal
import time

import pytest

from tests.frameworks import _forked
from tests.frameworks import _util as U


# ---- functions the children run (imported there by module name)
def write_facts(out: str) -> None:
    import multiprocessing

    atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
    # a child of the child, as a framework's async writer starts one: ended with it, not left behind
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=time.sleep, args=(600,), daemon=True)
    p.start()
    with open(out, "w") as f:
        json.dump({"env": os.environ.get("FORKED_PROBE"), "cwd": os.getcwd(), "grandchild": p.pid,
                   "torch_imported": "torch" in __import__("sys").modules}, f)
    print("to stdout")


def fail() -> None:
    raise ValueError("this child fails")


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def exit_7() -> None:
    raise SystemExit(7)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_forked_child_runs_in_its_environment_and_ends_as_an_interpreter(tmp_path):
    out, log = tmp_path / "facts.json", tmp_path / "log"
    p = _forked.start(__name__, "write_facts", {"out": str(out)}, stdout=str(log), stderr=str(log),
                      env=dict(os.environ, FORKED_PROBE="yes"), cwd=str(tmp_path))
    assert p.wait(120) == 0, log.read_text()
    facts = json.loads(out.read_text())
    assert facts["env"] == "yes" and facts["cwd"] == str(tmp_path) and facts["torch_imported"] is True
    assert (tmp_path / "facts.json.atexit").read_text() == "ran"
    assert "to stdout" in log.read_text()
    deadline = time.monotonic() + 10
    while _alive(facts["grandchild"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(facts["grandchild"])


@pytest.mark.parametrize("fn, code, said", [("fail", 1, "ValueError: this child fails"), ("exit_7", 7, ""),
                                             ("kill_self", -signal.SIGKILL, "")])
def test_a_forked_child_exits_with_the_code_an_interpreter_gives(fn, code, said, tmp_path):
    log = tmp_path / "log"
    p = _forked.start(__name__, fn, {}, stdout=str(log), stderr=str(log))
    assert p.wait(120) == code
    assert said in log.read_text()


def test_run_child_checks_the_exit_and_returns_the_output(tmp_path):
    r = U.run_child(f"{__name__}:write_facts", {"out": str(tmp_path / "f.json")})
    assert r.returncode == 0 and "to stdout" in r.stdout
    assert U.run_child(f"{__name__}:kill_self", {}, expect_kill=True).returncode == -signal.SIGKILL
    with pytest.raises(RuntimeError, match="ValueError: this child fails"):
        U.run_child(f"{__name__}:fail", {})


# ---- the generator's child: a process it leaves behind neither hangs the generator nor outlives it
def _leave_a_process_behind(dest):
    import subprocess

    (dest / "run").mkdir()
    p = subprocess.Popen(["sleep", "600"])  # inherits the child's stdout and stderr, as a rank's spawned writer does
    return {"left_behind": p.pid}


FIXTURES = {"leaves_a_process": _leave_a_process_behind}


def test_a_process_the_fixture_child_leaves_behind_is_ended_and_does_not_hang_the_generator(tmp_path):
    """A Megatron rank SIGKILLed mid-save left a spawned writer that held the generator's output pipe open (the
    generation hung until it was killed by hand): the child runs in a session of its own with its output in
    files, and what of the session outlives it is killed."""
    from tests.frameworks import generate as G

    spec = G.Spec("leaves_a_process", __name__, (), None, "")
    t0 = time.monotonic()
    res = G.run_one(spec, tmp_path, timeout=120)
    assert res["status"] == "ok", res
    assert time.monotonic() - t0 < 60
    pid = json.loads((tmp_path / "leaves_a_process" / "truth.json").read_text())["left_behind"]
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)
