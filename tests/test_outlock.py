"""ckptaudit.workflow.outlock: one audit per output folder, dropped by the kernel when its holder ends."""

import subprocess
import sys

import pytest

from ckptaudit.workflow import outlock

HOLD = ("import sys, time; from ckptaudit.workflow import outlock; outlock.hold(sys.argv[1]); print('held', flush=True); "
        "time.sleep(60)")


def test_second_process_is_refused_with_the_holder_then_gets_it_once_the_holder_dies(tmp_path):
    """A lock that outlived its holder (Snakemake's lock files after a SIGKILL) blocked every later audit."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(outlock.OutputBusy) as e:
            outlock.hold(tmp_path)
        assert str(e.value).startswith(f"another audit is writing to {tmp_path} (pid {holder.pid} on ")
        assert not outlock.held(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert outlock.hold(tmp_path) == str(tmp_path.resolve() / ".ckptaudit.lock")  # SIGKILL dropped it
    outlock.release(tmp_path)
    assert not outlock.held(tmp_path)


def test_hold_is_reentrant_and_counts(tmp_path):
    outlock.hold(tmp_path)
    outlock.hold(tmp_path)  # the CLI, then the Snakefile's onstart in the same process
    outlock.release(tmp_path)
    assert outlock.held(tmp_path)
    outlock.release(tmp_path)
    assert not outlock.held(tmp_path)
    outlock.release(tmp_path)  # no-op
