"""One line to resume safely (ckptaudit.integrations): a real framework run SIGKILLed mid-save, restarted with
the one line, resumes from the unit the audit names, at its step, and ends where an uninterrupted run ends.

The killed and the uninterrupted runs are the framework fixtures' (tests/frameworks, generated once per
pytest run into the fixture cache); each test copies the killed run and restarts it with the real framework.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptaudit.integrations import NoUsableCheckpointError, last_good_unit
from ckptaudit.pipeline import audit_in_process
from tests.frameworks import _util as U

from .test_frameworks import fixture_cache  # noqa: F401 - the session fixture that generates the runs

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


def _copy(fixture_cache, name: str, dest: Path) -> Path:  # noqa: F811
    run = dest / name
    shutil.copytree(fixture_cache / name / "run", run, symlinks=True)
    return run


@pytest.mark.slow
def test_hf_trainer_restarts_with_last_good_after_a_kill_mid_save(fixture_cache, tmp_path):  # noqa: F811
    from safetensors.torch import load_file

    from ckptaudit.integrations.hf import last_good

    killed = _copy(fixture_cache, "hf_trainer_kill_in_optimizer_save", tmp_path)  # SIGKILL in step 30's save
    assert audit_in_process(killed)["rollback"]["unit"] == "checkpoint-20"
    assert last_good(killed) == str(killed / "checkpoint-20")
    log = tmp_path / "resumed.json"
    U.run_child("tests.frameworks.fw_hf_trainer:train", {"run": str(killed), "resume_log": str(log)}, cwd=str(REPO))
    assert json.loads(log.read_text()) == {"from": str(killed / "checkpoint-20"), "global_step": 20}
    a = load_file(str(killed / "checkpoint-30" / "model.safetensors"))
    b = load_file(str(fixture_cache / "hf_trainer_clean" / "run" / "checkpoint-30" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-5, f"the resumed run's step-30 weights differ from an uninterrupted run's by {worst}"


@pytest.mark.slow
def test_accelerate_restarts_with_last_good_after_a_kill_mid_save(fixture_cache, tmp_path):  # noqa: F811
    from ckptaudit.integrations.accelerate import last_good
    from tests.frameworks.fw_accelerate import final_loss_of

    killed = _copy(fixture_cache, "accelerate_kill_in_save_state", tmp_path)  # SIGKILL in the 12th save_state
    want = killed / "checkpoints" / "checkpoint_10"
    assert audit_in_process(killed)["rollback"]["unit"] == "checkpoints/checkpoint_10"
    assert last_good(killed) == str(want)
    U.run_child("tests.frameworks.fw_accelerate:train", {"run": str(killed), "resume": True,
                                                          "loss_log": str(tmp_path / "resumed.json")}, cwd=str(REPO))
    r = json.loads((tmp_path / "resumed.json").read_text())
    assert (r["from"], r["started_step"], r["step"]) == (str(want), 55, 60)
    assert (killed / "checkpoints" / "checkpoint_11").is_dir()  # the damaged save is kept; the new one is 12
    resumed = final_loss_of(str(killed / "checkpoints" / "checkpoint_12" / "model.safetensors"))
    clean = final_loss_of(str(fixture_cache / "accelerate_clean" / "run" / "checkpoints" / "checkpoint_11" /
                              "model.safetensors"))
    # the restart reshuffles the rest of its epoch (a new permutation from the restored RNG): close, not equal
    assert abs(resumed - clean) <= 0.02 * clean, (resumed, clean)


@pytest.mark.slow
def test_lightning_resumes_with_last_good_where_ckpt_path_last_fails(fixture_cache, tmp_path):  # noqa: F811
    """Lightning's default ModelCheckpoint(save_last=True) with last.ckpt cut short: ckpt_path="last" fails,
    ckpt_path=lightning.last_good(dirpath) resumes from the newest periodic checkpoint at its step."""
    from tests.frameworks import fw_lightning as L

    name = "lightning_default_last_truncated"
    truth = json.loads((fixture_cache / name / "truth.json").read_text())
    assert truth["details"]["resume_ckpt_path_last"]["ok"] is False
    got = L._probe_last(tmp_path, fixture_cache / name / "run", "last_good_probe", last_good=True)
    want = truth["expect"]["rollback"]
    assert got["ok"] is True and got["ckpt_path"] == want and got["resumed_from"] == want, got
    assert got["started_step"] == L._step_of(want) and got["global_step"] == 40


@pytest.mark.slow
def test_dcp_restarts_with_last_good_when_the_newest_misses_a_rank_file(fixture_cache, tmp_path):  # noqa: F811
    """FSDP2 + DCP on 2 gloo ranks, the newest save missing rank 1's file: dcp.load of it fails (no fallback in
    DCP); the restart with checkpoint_id=dcp.last_good(run) loads step-20 and ends at step 30 with the loss an
    uninterrupted run had there."""
    from tests.frameworks import fw_fsdp_dcp as D

    run = _copy(fixture_cache, "fsdp2_dcp_missing_rank1_shard", tmp_path)
    log = tmp_path / "resumed.json"
    D._run(tmp_path / "restart", run=run, resume_log=str(log))
    r = json.loads(log.read_text())
    assert (r["from"], r["started_step"], r["step"]) == (str(run / "checkpoint" / "step-20"), 20, 30)
    clean = json.loads((fixture_cache / "fsdp2_dcp_clean" / "truth.json").read_text())["details"]["saves"]
    want = next(s["loss"] for s in clean if s["step"] == 30)
    assert abs(r["final_loss"] - want) <= 1e-6 * max(1.0, abs(want)), (r, want)


@pytest.mark.slow
def test_torchtitan_resumes_the_full_state_at_last_good_step(fixture_cache, tmp_path):  # noqa: F811
    """torchtitan 0.3.0 on 2 gloo ranks, the newest step-30 missing rank 1's file: CheckpointManager.load() takes
    step-30 and raises; --checkpoint.load_step torchtitan.last_good_step(folder) (20) restores the train state,
    the scheduler, the optimizer and the dataloader of step 20, as the truth's own probe did."""
    from ckptaudit.integrations.torchtitan import last_good_step, main
    from tests.frameworks import fw_torchtitan as T

    run = _copy(fixture_cache, "torchtitan_missing_rank_file", tmp_path)
    truth = json.loads((fixture_cache / "torchtitan_missing_rank_file" / "truth.json").read_text())
    assert truth["details"]["torchtitan_resume"]["probes"][0]["ok"] is False
    step = last_good_step(run / "checkpoint")
    assert step == 20 and main([str(run / "checkpoint")]) == 0
    out = tmp_path / "probe.json"
    T._launch("_probe", {"run": str(run), "steps": 40, "out": str(out), "load_step": step}, tmp_path / "logs")
    got = json.loads(out.read_text())
    saved = next(s for s in truth["details"]["saves"] if s["step"] == 20)
    assert got["ok"] and (got["train_state_step"], got["last_epoch"], got["optimizer_step"]) == (
        20, saved["last_epoch"], saved["optimizer_step"]), got
    assert last_good_step(tmp_path / "no-such-folder") is None and main([str(tmp_path / "no-such-folder")]) == 0


@pytest.mark.slow
def test_deepspeed_loads_last_good_tag_where_latest_fails(fixture_cache, tmp_path):  # noqa: F811
    """ZeRO-2 on 2 gloo ranks, rank 1's optimizer partition of the newest tag deleted: load_checkpoint(run)
    (the tag `latest` names) raises; tag=deepspeed.last_good_tag(run) resumes global_step20 in full."""
    from tests.frameworks import fw_deepspeed as D

    run = _copy(fixture_cache, "deepspeed_zero2_missing_optim_partition", tmp_path)
    assert (run / "latest").read_text().strip() == "global_step30"
    (tmp_path / "by_latest").mkdir()
    by_latest, _ = D._probe(tmp_path / "by_latest", run, 2, 2)
    assert by_latest["mode"] == "resume" and by_latest["ok"] is False and by_latest["errors"], by_latest
    full, _ = D._probe(tmp_path, run, 2, 2, last_good=True)
    assert full["mode"] == "resume" and full["ok"] is True and full["errors"] == {}, full
    assert "/global_step20/" in full["loaded"] and full["global_steps"] == 20, full


def _flip_tensor_byte(path: Path) -> None:
    """Flip one byte in the middle of a safetensors file's data (past its JSON header): no checksum of the
    format's own sees it."""
    import struct

    raw = bytearray(path.read_bytes())
    header = 8 + struct.unpack("<Q", raw[:8])[0]
    raw[header + (len(raw) - header) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


@pytest.mark.slow
def test_hf_seal_callback_seals_every_save_and_a_flipped_bit_is_then_found(tmp_path):
    """HF Trainer with callbacks=[SealCallback()] and save_total_limit=2: both kept checkpoint folders hold a
    sidecar per file, COMPLETE and manifest.json, and `latest` names the newest.  A bit flipped inside
    checkpoint-30's weights is then an error and the rollback point moves to checkpoint-20; without the seal
    the same flip passes every check (safetensors has no checksum)."""
    from ckptaudit.integrations.hf import last_good

    run = tmp_path / "run"
    U.run_child("tests.frameworks.fw_hf_trainer:train", {"run": str(run), "seal": True, "save_total_limit": 2},
                cwd=str(REPO))
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["checkpoint-20", "checkpoint-30"]
    assert (run / "latest").read_text() == "checkpoint-30"
    for unit in ("checkpoint-20", "checkpoint-30"):
        folder = run / unit
        doc = json.loads((folder / "manifest.json").read_text())
        assert doc["schema"] == "ckptaudit.manifest/2" and doc["step"] == int(unit.split("-")[1])
        assert doc["sealed_by"] == "ckptaudit.integrations.hf.SealCallback"
        data = sorted(p.name for p in folder.iterdir() if p.name not in ("manifest.json", "COMPLETE")
                      and not p.name.endswith(".sha256"))
        assert sorted(f["path"] for f in doc["files"]) == data and "optimizer.pt" in data
        assert all((folder / (n + ".sha256")).is_file() for n in data) and (folder / "COMPLETE").is_file()
    v = audit_in_process(run, out_dir=tmp_path / "a0")
    assert v["rollback"]["unit"] == "checkpoint-30"
    assert not [f for u in v["units"] for f in u["findings"] if f["severity"] == "error"]

    unsealed = tmp_path / "unsealed"
    shutil.copytree(run, unsealed)
    for p in (unsealed / "checkpoint-30").iterdir():
        if p.name in ("manifest.json", "COMPLETE") or p.name.endswith(".sha256"):
            p.unlink()
    for r in (run, unsealed):
        _flip_tensor_byte(r / "checkpoint-30" / "model.safetensors")
    v = audit_in_process(run, out_dir=tmp_path / "a1")
    newest = next(u for u in v["units"] if u["unit"] == "checkpoint-30")
    errs = {f["kind"] for f in newest["findings"] if f["severity"] == "error"}
    assert errs and v["rollback"]["unit"] == "checkpoint-20", (errs, v["rollback"])
    assert last_good(run) == str(run / "checkpoint-20")
    assert audit_in_process(unsealed, out_dir=tmp_path / "a2")["rollback"]["unit"] == "checkpoint-30"


@pytest.mark.slow
def test_lightning_publish_plugin_killed_mid_save_restarts_with_last_good(tmp_path):
    """Lightning with plugins=[PublishCheckpointIO()] (every 10 steps, last.ckpt and a top-1, 30 steps): each
    save gets a sidecar and a manifest, last.ckpt is replaced with its own.  SIGKILLed halfway through the
    publish of epoch=2-step=30.ckpt, the run holds only the writer's temp file of it; the audit rolls back to
    step 20, ckpt_path=lightning.last_good(dirpath) resumes there, and the whole-dataset loss of its step-30
    weights is an uninterrupted run's within 10 % (the restart reshuffles its epoch: the DataLoader's own
    generator is not in Lightning's checkpoint)."""
    from tests.frameworks import _dist
    from tests.frameworks import fw_lightning as L

    clean_run, clean = L._run(tmp_path / "clean", plugin=True)
    ckpts = clean_run / L.CKPT
    names = sorted(p.name for p in ckpts.iterdir())
    assert "epoch=2-step=30.ckpt.sha256" in names and "last.ckpt.manifest.json" in names, names
    assert json.loads((ckpts / "last.ckpt.manifest.json").read_text())["step"] == 30
    v = audit_in_process(clean_run, out_dir=tmp_path / "a0")
    assert not [f for u in v["units"] for f in u["findings"] if f["severity"] == "error"]
    assert _step(v["rollback"]["unit"]) == 30, v["rollback"]

    note = tmp_path / "kill.json"
    run, _ = L._run(tmp_path / "killed", plugin=True,
                    kill={"where": "publish", "file": "epoch=2-step=30.ckpt", "note": str(note)})
    assert json.loads(note.read_text())["how"] == "HashingWriter.write"
    left = [p.name for p in (run / L.CKPT).iterdir() if p.name.startswith(".ckptaudit-tmp-")]
    assert len(left) == 1 and left[0].endswith("epoch=2-step=30.ckpt"), left
    assert not (run / L.CKPT / "epoch=2-step=30.ckpt").exists()
    v = audit_in_process(run, out_dir=tmp_path / "a1")
    assert _step(v["rollback"]["unit"]) == 20 and v["recommendation"] == "resume", (v["rollback"], v["recommendation"])

    out = tmp_path / "resumed.json"
    codes = _dist.launch("tests.frameworks.fw_lightning", "_resume_last", 1,
                         {"run": str(run), "out": str(out), "last_good": True, "plugin": True}, tmp_path / "logs")
    _dist.check_codes(codes, tmp_path / "logs")
    r = json.loads(out.read_text())
    assert r["ok"] is True and r["started_step"] == 20 and r["global_step"] == 40, r
    assert _step(Path(r["ckpt_path"]).name) == 20
    got = L.full_loss(run / L.CKPT / "epoch=2-step=30.ckpt")
    want = L.full_loss(ckpts / "epoch=2-step=30.ckpt")
    assert abs(got - want) <= 0.10 * abs(want), (got, want)
    assert (run / L.CKPT / "epoch=2-step=30.ckpt.manifest.json").is_file()


def _step(name: str) -> int:
    from ckptaudit.units import step_from_name

    return step_from_name(Path(name).name if "/" in name else name)


@pytest.mark.slow
def test_deepspeed_restarts_with_last_good_tag_after_a_kill_mid_save(tmp_path):
    """ZeRO-2 on 2 gloo ranks, rank 1 SIGKILLed halfway through its optimizer partition of global_step30 after
    rank 0 moved `latest` to it (both runs made here, ~10 s).  The audit rolls back to global_step20; the
    restart with engine.load_checkpoint(run, tag=deepspeed.last_good_tag(run)) on each rank loads it at
    global_steps 20, trains steps 21..30 on the same per-step batches and saves global_step30 again, which
    now audits clean.  Its loss at step 30 and its step-30 weights are an uninterrupted run's: measured
    difference 0.0 (bit-identical: fp32, one thread per rank, no dropout, _batch(rank, step) fixed per step,
    a 2-rank gloo all-reduce in a fixed order, and torch.save/load round-trip the fp32 state exactly).
    The bound, 1e-6 relative on the loss and 1e-6 absolute on the weights, is headroom for a BLAS change
    only; a warm start from the same global_step20 (module weights only: fresh Adam moments, the WarmupLR
    ramp restarted) ends at loss 0.3033 against 0.2475, 22 % off."""
    import torch

    from ckptaudit.integrations.deepspeed import last_good_tag
    from tests.frameworks import fw_deepspeed as D

    clean_run, clean, _ = D._run(tmp_path / "clean", 2)
    want = next(s for s in clean if s["global_steps"] == 30)
    note = tmp_path / "kill.json"
    run, _, codes = D._run(tmp_path / "killed", 2, kill={
        "rank": 1, "tag": "global_step30", "file": "zero_pp_rank_1_mp_rank_00_optim_states.pt", "note": str(note)})
    killed = json.loads(note.read_text())
    assert codes[1] == -9 and 0 < killed["bytes_written"] < killed["size"], (codes, killed)
    assert (run / "latest").read_text().strip() == "global_step30"

    v = audit_in_process(run, out_dir=tmp_path / "a0")
    assert v["rollback"]["unit"] == "global_step20" and v["recommendation"] == "resume", (v["rollback"],
                                                                                           v["recommendation"])
    assert last_good_tag(run) == "global_step20"

    r = D._restart(tmp_path / "restart", run, 2, until=30)
    assert r["tags"] == ["global_step20", "global_step20"], r
    assert Path(r["loaded"]).parent == run / "global_step20", r
    assert (r["started_step"], r["global_steps"], sorted(r["losses"])) == (20, 30, list(range(21, 31))), r
    assert r["lr"] == want["lr"], (r["lr"], want)
    got = r["losses"][30]
    assert abs(got - want["loss"]) <= 1e-6 * abs(want["loss"]), (got, want["loss"])

    def module(p: Path) -> dict:
        return torch.load(p / "global_step30" / "mp_rank_00_model_states.pt", map_location="cpu",
                          weights_only=False)["module"]

    a, b = module(run), module(clean_run)
    assert sorted(a) == sorted(b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= 1e-6, f"the resumed run's step-30 weights differ from an uninterrupted run's by {worst}"
    v = audit_in_process(run, out_dir=tmp_path / "a1")
    assert v["rollback"]["unit"] == "global_step30" and v["recommendation"] == "resume", v["rollback"]
