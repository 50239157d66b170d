"""publish cleans up after itself: the temp files of saves killed mid-way do not pile up, and the audit
puts the leftovers of dead writers on one line of its summary."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from ckptaudit import publish as P
from ckptaudit._io import TMP_PREFIX
from ckptaudit.pipeline import audit_in_process
from ckptaudit.outputs.summary import summary


def _state(step: int) -> dict:
    torch.manual_seed(step)
    m = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 256)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "optimizer": opt.state_dict(), "iter_num": step}


def _killed_save(run: Path, step: int) -> None:
    """A forked child runs the documented loop's save and is SIGKILLed halfway through its bytes.  The state is
    built before the fork (torch's OpenMP pool is not usable in a forked child)."""
    state = _state(step)
    pid = os.fork()
    if pid == 0:  # child
        try:
            from ckptaudit.publish import writer

            real = writer.HashingWriter.write

            def write(self, b):
                if self.written > 100_000:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(self, b)

            writer.HashingWriter.write = write
            P.save(state, run, step, retention=P.Retention(keep_last=3))
        finally:
            os._exit(3)  # never reached: the kill comes first
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _leftovers(run: Path) -> list:
    return sorted(n for n in os.listdir(run) if n.startswith(TMP_PREFIX))


def test_twenty_kills_leave_at_most_one_temp_and_one_summary_line(tmp_path):
    run = tmp_path / "run"
    P.save(_state(10), run, 10, retention=P.Retention(keep_last=3))
    for i in range(20):
        _killed_save(run, 20 + i)
        left = _leftovers(run)
        assert len(left) == 1 and left[0].endswith(f"ckpt_{20 + i:06d}.pt"), (i, left)
    v = audit_in_process(run, out_dir=tmp_path / "audit")
    assert v["rollback"]["unit"] == "ckpt_000010.pt"
    lines = summary(v, tmp_path / "audit").splitlines()
    about = [line for line in lines if "leftover" in line]
    assert len(about) == 1 and about[0].strip().startswith("1 leftover(s) of ckptaudit.publish saves"), lines
    assert about[0].endswith(f"Repair (run anywhere): ckptaudit prune {run} --sweep-stale")
    [f] = v["run_findings"]  # one finding for the run, no unit of its own
    assert (f["kind"], f["severity"], f["detail"]["count"]) == ("dead_writer_leftovers", "warning", 1)
    assert f["detail"]["units"] == _leftovers(run) and f["detail"]["size_bytes"] == (run / _leftovers(run)[0]).stat(
        ).st_size > 0
    assert [u["unit"] for u in v["units"]] == ["ckpt_000010.pt"] and v["recommendation"] == "resume"
    import subprocess
    import sys

    shown = _leftovers(run)
    done = subprocess.run(f["repair"], shell=True, cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr  # the repair runs as printed, from anywhere: only the temp goes
    assert f"deleted {shown[0]}" in done.stdout and _leftovers(run) == [] and (run / "ckpt_000010.pt").exists()
    (run / shown[0]).write_bytes(b"PK\x03\x04 partial")  # put it back for the checks below
    html = (tmp_path / "audit" / "report.html").read_text()  # the report says it once, with the repair
    assert html.count("dead_writer_leftovers") == 1 and f"ckptaudit prune {run} --sweep-stale" in html
    assert f"<b>Repair</b> (run in {run}):" in html  # a repair's folder is said in the report too
    assert _leftovers(run)[0] not in html.split('id="findings"')[0]  # not in the timeline nor the units table
    P.save(_state(50), run, 50, retention=P.Retention(keep_last=3))
    assert _leftovers(run) == []  # the next save removed the dead writer's temp


def test_many_old_leftovers_are_one_line_and_another_hosts_temp_is_kept(tmp_path):
    """Leftovers written before publish swept them (or by sweep_stale=False): one summary line for all of
    them; a temp name of another host is never removed (its writer may be alive there)."""
    run = tmp_path / "run"
    P.save(_state(10), run, 10)
    dead = [f"{TMP_PREFIX}{P.names.host_tag()}-{999_000 + i}-0000000{i}-ckpt_0000{20 + i}.pt" for i in range(5)]
    for n in dead:
        (run / n).write_bytes(b"PK\x03\x04 partial")
    other = f"{TMP_PREFIX}00000000-1-00000000-ckpt_000099.pt"
    (run / other).write_bytes(b"PK\x03\x04 partial")
    v = audit_in_process(run, out_dir=tmp_path / "audit")
    lines = summary(v, tmp_path / "audit").splitlines()
    assert [line for line in lines if "leftover(s) of ckptaudit.publish saves" in line][0].strip().startswith("5 ")
    [f] = v["run_findings"]
    assert f["detail"]["units"] == dead and f["detail"]["size_bytes"] == 5 * len(b"PK\x03\x04 partial")
    assert f"{dead[0]}, {dead[1]}, {dead[2]} and 2 more" in f["message"]
    assert any(other in line for line in lines)  # another host's temp stays a unit line of its own
    P.save(_state(30), run, 30)
    assert _leftovers(run) == [other]
