"""Audits and reads beside a writer that publishes and prunes (the nightly drill's normal case).

Regression: with a writer publishing and pruning into the run, 29 of 29 audits exited 3 (files renamed or
deleted between inventory and scan raised FileNotFoundError).
"""

import subprocess
import sys
import textwrap
import time

import pytest

from ckptaudit import safe_load_checkpoint
from ckptaudit.safe_load import NoUsableCheckpointError
from ckptaudit.pipeline import audit_in_process

WRITER = textwrap.dedent("""
    import sys, time, torch
    from ckptaudit import publish
    run, first, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    m = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(m.parameters())
    for i in range(first, first + n):
        m(torch.randn(4, 64)).sum().backward()
        opt.step()
        publish.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": i * 10,
                      "rng": torch.get_rng_state()}, run, i * 10,
                     retention=publish.Retention(keep_last=4))
        time.sleep(1.0)  # a save a second: each unit lives about 4 s, twice an audit of this run
""")


@pytest.mark.slow
def test_audits_and_reads_beside_a_publishing_writer(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # a first unit, so that there is always something to read
    subprocess.run([sys.executable, "-c", WRITER, str(run), "1", "1"], check=True)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run), "2", "2000"])
    audits, reads, chosen = 0, 0, []
    try:
        deadline = time.monotonic() + 240
        while (audits < 10 or reads < 100) and time.monotonic() < deadline and writer.poll() is None:
            if audits < 10:
                v = audit_in_process(run, out_dir=tmp_path / f"audit{audits}")
                audits += 1
                assert v["recommendation"] in ("resume", "warm-start"), v["reasons"]
                rb = v["rollback"]["unit"]
                assert rb.startswith("ckpt_") and rb.endswith(".pt"), rb  # never a temp file
                chosen.append(rb)
            for _ in range(10):
                try:
                    ck = safe_load_checkpoint(run)
                except NoUsableCheckpointError:
                    continue
                reads += 1
                name = ck.unit
                assert name.startswith("ckpt_") and name.endswith(".pt"), name  # never a temp file
                assert ck.state["step"] == int(name[5:11]), (name, ck.state["step"])  # not torn
    finally:
        writer.kill()
        writer.wait()
    assert audits >= 10 and reads >= 100, (audits, reads)
