"""Tests for ckptaudit.demo: a real tiny training run with a real crash.

The module-scoped default demo (600 steps, saves every 100) takes ~5 s; everything else
uses runs of a few dozen steps.
"""

from __future__ import annotations

import hashlib
import math
import re
import zipfile
from pathlib import Path

import pytest
import torch

from ckptaudit import demo

STEPS = [100, 200, 300, 400, 500, 600]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> demo.DemoRun:
    return demo.make_demo_run(tmp_path_factory.mktemp("demo") / "run")


def test_files_present(run):
    d = run.run_dir
    assert run.steps == STEPS
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [f"ckpt_{s:06d}.pt" for s in STEPS] + [f"ckpt_{s:06d}.pt.sha256" for s in STEPS[:-1]]
    )
    assert run.truncated == "ckpt_000600.pt"
    assert run.flipped == "ckpt_000300.pt"
    assert run.intact == ["ckpt_000100.pt", "ckpt_000200.pt", "ckpt_000400.pt", "ckpt_000500.pt"]
    assert sorted(run.losses) == STEPS


def test_intact_sidecars_match(run):
    for name in run.intact:
        side = (run.run_dir / (name + ".sha256")).read_text()
        assert re.fullmatch(r"[0-9a-f]{64}  " + re.escape(name) + r"\n", side), side
        assert side.split()[0] == sha256(run.run_dir / name)
        with zipfile.ZipFile(run.run_dir / name) as zf:
            assert zf.testzip() is None


def test_truncated_newest_has_no_central_directory(run):
    path = run.run_dir / run.truncated
    with pytest.raises(zipfile.BadZipFile, match="^File is not a zip file$"):
        zipfile.ZipFile(path)
    with pytest.raises(RuntimeError, match="failed finding central directory"):
        torch.load(path, weights_only=True)
    size = path.stat().st_size
    full = (run.run_dir / run.intact[-1]).stat().st_size
    assert size == run.truncated_bytes
    assert size == int(0.55 * full)  # every save of this run serializes to the same size
    assert not (run.run_dir / (run.truncated + ".sha256")).exists()


def test_flipped_loads_but_fails_checksum_and_crc(run):
    path = run.run_dir / run.flipped
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["iter_num"] == 300
    with zipfile.ZipFile(path) as zf:
        assert zf.testzip() == run.flipped_member
    assert re.fullmatch(r"archive/data/\d+", run.flipped_member)
    recorded = (run.run_dir / (run.flipped + ".sha256")).read_text().split()[0]
    assert sha256(path) != recorded
    # Exactly one byte differs, at the recorded offset: flipping it back restores the hash.
    data = bytearray(path.read_bytes())
    data[run.flipped_offset] ^= 0xFF
    assert hashlib.sha256(bytes(data)).hexdigest() == recorded
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())


def test_checkpoint_schema(run):
    for name in run.intact + [run.flipped]:
        step = int(name[5:11])
        ckpt = torch.load(run.run_dir / name, weights_only=True)
        assert set(ckpt) == set(demo.UPSTREAM_KEYS) | {"scheduler", "rng", "loss"}
        assert ckpt["iter_num"] == step
        assert ckpt["scheduler"]["last_epoch"] == step
        assert ckpt["optimizer"]["state"][0]["step"].item() == step
        assert ckpt["model_args"] == demo.DEFAULT_MODEL_ARGS
        assert ckpt["config"]["max_iters"] == 600 and ckpt["config"]["seed"] == 1337
        assert isinstance(ckpt["best_val_loss"], float) and math.isfinite(ckpt["best_val_loss"])
        assert ckpt["loss"] == pytest.approx(run.losses[step], abs=0)
        assert set(ckpt["rng"]) == {"torch", "numpy", "python"}
        model = ckpt["model"]
        assert not [k for k in model if k.startswith("_orig_mod.")]
        assert model["lm_head.weight"].data_ptr() == model["transformer.wte.weight"].data_ptr()  # tied
        m = demo.build_model(ckpt["model_args"])
        m.load_state_dict(model)  # strict: raw keys, nothing missing or unexpected
        assert sum(p.numel() for p in m.parameters()) == 105408


def test_loss_decreases(run):
    first, last = (torch.load(run.run_dir / n, weights_only=True)["loss"] for n in (run.intact[0], run.intact[-1]))
    assert last < first - 0.3, (first, last)
    assert run.losses[600] < run.losses[100]


def test_two_runs_are_byte_identical(tmp_path):
    a = demo.make_demo_run(tmp_path / "a", max_steps=60, save_every=10)
    b = demo.make_demo_run(tmp_path / "b", max_steps=60, save_every=10)
    names = sorted(p.name for p in a.run_dir.iterdir())
    assert names == sorted(p.name for p in b.run_dir.iterdir())
    assert len(names) == 11
    assert {n: sha256(a.run_dir / n) for n in names} == {n: sha256(b.run_dir / n) for n in names}
    assert (a.flipped, a.flipped_offset, a.truncated_bytes) == (b.flipped, b.flipped_offset, b.truncated_bytes)


def test_full_resume_continues_byte_identically(tmp_path):
    demo.train(tmp_path / "a", max_steps=40, save_every=10)
    res = demo.train(tmp_path / "b", max_steps=40, save_every=10, start_from=tmp_path / "a" / "ckpt_000020.pt")
    assert [p.name for p in res.saved] == ["ckpt_000030.pt", "ckpt_000040.pt"]
    for p in res.saved:
        assert sha256(p) == sha256(tmp_path / "a" / p.name)


def test_hooks_build_broken_runs(tmp_path):
    def mutate(step, ckpt):
        if step == 10:
            return None  # skipped save
        if step == 20:
            del ckpt["optimizer"]
        if step == 30:
            return ckpt["model"]  # weights only
        return ckpt

    def on_step(step, model, optimizer):
        if step == 35:
            with torch.no_grad():
                model.lm_head.weight[0, 0] = float("nan")

    res = demo.train(tmp_path / "r", max_steps=40, save_every=10, mutate=mutate, on_step=on_step)
    assert [p.name for p in res.saved] == ["ckpt_000020.pt", "ckpt_000030.pt", "ckpt_000040.pt"]
    c20, c30, c40 = (torch.load(p, weights_only=True) for p in res.saved)
    assert "optimizer" not in c20 and c20["iter_num"] == 20
    assert "lm_head.weight" in c30 and "iter_num" not in c30
    assert math.isnan(c40["loss"]) and torch.isnan(c40["model"]["lm_head.weight"]).all()

    # A restart from weights only resets the step: iter_num and the schedule start again.
    again = demo.train(tmp_path / "r2", max_steps=10, save_every=10, start_from=res.saved[1], restore="weights")
    c = torch.load(again.saved[0], weights_only=True)
    assert (c["iter_num"], c["scheduler"]["last_epoch"]) == (10, 10)
    assert c["loss"] < res.losses[10]  # it kept the trained weights


def test_main_prints_what_was_staged(tmp_path, capsys):
    assert demo.main([str(tmp_path / "m"), "--max-steps", "30", "--save-every", "10"]) == 0
    out = capsys.readouterr().out
    assert "truncated: ckpt_000030.pt" in out and "flipped:   ckpt_000010.pt" in out


def test_refuses_a_folder_with_checkpoints(tmp_path):
    (tmp_path / "ckpt_000100.pt").write_bytes(b"")
    with pytest.raises(FileExistsError) as e:
        demo.make_demo_run(tmp_path, max_steps=30, save_every=10)
    assert str(e.value) == f"{tmp_path}: expected no ckpt_* files, found ['ckpt_000100.pt']"


def test_incident_needs_three_saves(tmp_path):
    with pytest.raises(ValueError) as e:
        demo.make_demo_run(tmp_path, max_steps=20, save_every=10)
    assert str(e.value) == "incident needs >= 3 saves, got 2 (max_steps=20, save_every=10)"


def test_without_incident_every_save_is_intact(tmp_path):
    r = demo.make_demo_run(tmp_path / "ok", max_steps=30, save_every=10, incident=False)
    assert (r.truncated, r.flipped) == ("", "")
    for name in r.intact:
        assert (r.run_dir / (name + ".sha256")).read_text().split()[0] == sha256(r.run_dir / name)


def test_full_restore_needs_the_training_state(tmp_path):
    res = demo.train(tmp_path / "r", max_steps=10, save_every=10, mutate=lambda step, c: c["model"])
    with pytest.raises(KeyError) as e:
        demo.train(tmp_path / "r2", max_steps=20, save_every=10, start_from=res.saved[0])
    missing = ["best_val_loss", "config", "iter_num", "loss", "model_args", "optimizer", "rng", "scheduler"]
    assert e.value.args[0] == f"{res.saved[0]}: a full restore needs {missing!r}, which the checkpoint lacks"
