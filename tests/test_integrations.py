"""One line to resume safely (ckptaudit.integrations): a real framework run SIGKILLed mid-save, restarted with
the one line, resumes from the unit the audit names, at its step, and ends where an uninterrupted run ends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptaudit.integrations import NoUsableCheckpointError, last_good_unit
from ckptaudit.pipeline import audit_in_process
from tests.frameworks import _util as U

REPO = Path(__file__).resolve().parent.parent


def test_last_good_is_none_for_a_first_start_and_raises_when_nothing_resumes(tmp_path):
    import torch

    assert last_good_unit(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert last_good_unit(tmp_path / "empty") is None
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.ones(4, 4)}}, run / "ckpt_000010.pt")  # weights only: a warm start at most
    with pytest.raises(NoUsableCheckpointError) as ei:
        last_good_unit(run)
    assert "warm start" in str(ei.value)


@pytest.mark.slow
def test_hf_trainer_restarts_with_last_good_after_a_kill_mid_save(tmp_path):
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from ckptaudit.integrations.hf import last_good

    killed, clean = tmp_path / "killed", tmp_path / "clean"
    U.run_child("tests.frameworks.fw_hf_trainer:train", {"run": str(killed), "kill_file": "optimizer.pt",
                                                          "kill_log": str(tmp_path / "kill.json")},
                expect_kill=True, cwd=str(REPO))
    v = audit_in_process(killed)
    assert v["rollback"]["unit"] == "checkpoint-20" and last_good(killed) == str(killed / "checkpoint-20")
    log = tmp_path / "resumed.json"
    U.run_child("tests.frameworks.fw_hf_trainer:train", {"run": str(killed), "resume_log": str(log)}, cwd=str(REPO))
    assert json.loads(log.read_text()) == {"from": str(killed / "checkpoint-20"), "global_step": 20}
    U.run_child("tests.frameworks.fw_hf_trainer:train", {"run": str(clean)}, cwd=str(REPO))
    a, b = load_file(str(killed / "checkpoint-30" / "model.safetensors")), load_file(str(clean / "checkpoint-30" /
                                                                                          "model.safetensors"))
    assert sorted(a) == sorted(b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, f"the resumed run's step-30 weights differ from an uninterrupted run's by {worst}"


@pytest.mark.slow
def test_accelerate_restarts_with_last_good_after_a_kill_mid_save(tmp_path):
    pytest.importorskip("accelerate")
    from ckptaudit.integrations.accelerate import last_good

    killed, clean = tmp_path / "killed", tmp_path / "clean"
    U.run_child("tests.frameworks.fw_accelerate:train", {"run": str(killed), "kill_file": "optimizer.bin",
                                                          "kill_log": str(tmp_path / "kill.json")},
                expect_kill=True, cwd=str(REPO))
    want = killed / "checkpoints" / "checkpoint_10"
    assert audit_in_process(killed)["rollback"]["unit"] == "checkpoints/checkpoint_10"
    assert last_good(killed) == str(want)
    U.run_child("tests.frameworks.fw_accelerate:train", {"run": str(killed), "resume": True,
                                                          "loss_log": str(tmp_path / "resumed.json")}, cwd=str(REPO))
    U.run_child("tests.frameworks.fw_accelerate:train", {"run": str(clean), "loss_log": str(tmp_path / "clean.json")},
                cwd=str(REPO))
    r, c = (json.loads((tmp_path / n).read_text()) for n in ("resumed.json", "clean.json"))
    assert (r["from"], r["started_step"], r["step"]) == (str(want), 55, 60)
    # the restart reshuffles the rest of its epoch (a new permutation from the restored RNG): close, not equal
    assert abs(r["final_loss"] - c["final_loss"]) <= 0.02 * c["final_loss"], (r, c)


@pytest.mark.slow
def test_lightning_resumes_with_last_good_where_ckpt_path_last_fails(tmp_path):
    """Lightning's default ModelCheckpoint(save_last=True) with last.ckpt cut short: ckpt_path="last" fails,
    ckpt_path=lightning.last_good(dirpath) resumes from the newest periodic checkpoint at its step."""
    pytest.importorskip("lightning")
    from tests.frameworks import fw_lightning as L

    truth = L.make_default_last_truncated(tmp_path)
    assert truth["details"]["resume_ckpt_path_last"]["ok"] is False
    got = L._probe_last(tmp_path, tmp_path / "run", "last_good_probe", last_good=True)
    want = truth["expect"]["rollback"]
    assert got["ok"] is True and got["ckpt_path"] == want and got["resumed_from"] == want, got
    assert got["started_step"] == L._step_of(want) and got["global_step"] == 40
