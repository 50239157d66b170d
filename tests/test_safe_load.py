"""safe_load_checkpoint falls back past damaged units and explains every skip."""

import logging
import os
import shutil

import pytest

from ckptaudit import safe_load_checkpoint
from ckptaudit.safe_load import NoUsableCheckpointError

from .conftest import CASES


def test_demo_run_falls_back_past_the_truncated_save(demo_run, caplog):
    with caplog.at_level(logging.WARNING, logger="ckptaudit"):
        ckpt = safe_load_checkpoint(demo_run.run_dir)
    assert ckpt.unit == "ckpt_000250.pt"
    assert ckpt.step == 250 == ckpt["iter_num"]
    assert sorted(ckpt.skipped) == ["ckpt_000300.pt"]
    assert ckpt.skipped["ckpt_000300.pt"].startswith("truncated_zip_no_central_directory: ")
    assert "skipping ckpt_000300.pt: truncated_zip_no_central_directory" in caplog.text
    assert set(ckpt.keys()) >= {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"}


def test_flipped_byte_is_skipped_when_newer_units_are_gone(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    for s in (200, 250, 300):
        (run / f"ckpt_{s:06d}.pt").unlink()
    ckpt = safe_load_checkpoint(run)
    assert ckpt.unit == "ckpt_000100.pt"
    assert ckpt.skipped["ckpt_000150.pt"].split(":")[0] in ("zip_crc_mismatch", "checksum_mismatch")


def test_every_unit_damaged_lists_each_reason(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(CASES / "empty_file" / "ckpt.pt", run / "ckpt_000100.pt")
    shutil.copy(CASES / "trunc_zip_at_50pct" / "ckpt.pt", run / "ckpt_000200.pt")
    shutil.copy(CASES / "security_malicious_reduce_zip" / "ckpt.pt", run / "ckpt_000300.pt")
    with pytest.raises(NoUsableCheckpointError) as ei:
        safe_load_checkpoint(run)
    e = ei.value
    assert list(e.reasons) == ["ckpt_000300.pt", "ckpt_000200.pt", "ckpt_000100.pt"]
    assert e.reasons["ckpt_000300.pt"].startswith("malicious_pickle_code_exec: ")
    assert e.reasons["ckpt_000200.pt"].startswith("truncated_zip_no_central_directory: ")
    assert e.reasons["ckpt_000100.pt"].startswith("empty_file: ")
    assert str(e).splitlines()[0] == f"{run}: no usable checkpoint (3 unit(s) checked)"


def test_missing_folder_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        safe_load_checkpoint(tmp_path / "nope")


def _hf_trainer_folder(d, step: int) -> None:
    """A Hugging Face Trainer ``checkpoint-N/`` folder as transformers writes it (file names
    from transformers' trainer.py: model.safetensors, optimizer.pt, scheduler.pt,
    rng_state.pth, trainer_state.json, training_args.bin)."""
    import json
    import sys
    import types

    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(step)
    w = torch.randn(4, 4, generator=g)
    save_file({"lin.weight": w}, str(d / "model.safetensors"))
    torch.save({"state": {0: {"step": torch.tensor(float(step)), "exp_avg": w * 0.1, "exp_avg_sq": w * w}},
                "param_groups": [{"lr": 1e-3, "params": [0]}]}, d / "optimizer.pt")
    torch.save({"last_epoch": step, "_step_count": step + 1}, d / "scheduler.pt")
    torch.save({"python": 1, "cpu": torch.get_rng_state()}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.5}))
    # training_args.bin pickles a whole TrainingArguments; a stand-in class of that name
    mod = types.ModuleType("transformers.training_args")

    class TrainingArguments:
        def __init__(self):
            self.output_dir, self.learning_rate = "out", 1e-3

    TrainingArguments.__module__, TrainingArguments.__qualname__ = "transformers.training_args", "TrainingArguments"
    mod.TrainingArguments = TrainingArguments
    pkg = types.ModuleType("transformers")
    pkg.training_args = mod
    saved = {k: sys.modules.get(k) for k in ("transformers", "transformers.training_args")}
    sys.modules.update({"transformers": pkg, "transformers.training_args": mod})
    try:
        torch.save(TrainingArguments(), d / "training_args.bin")
    finally:
        for k, v in saved.items():
            if v is None:
                del sys.modules[k]
            else:
                sys.modules[k] = v


def test_hf_trainer_folder_loads_as_a_dict_of_files_and_falls_back(tmp_path):
    import torch

    run = tmp_path / "run"
    _hf_trainer_folder(run / "checkpoint-100", 100)
    _hf_trainer_folder(run / "checkpoint-200", 200)
    opt = run / "checkpoint-200" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[: opt.stat().st_size // 2])  # the node died mid-save
    ckpt = safe_load_checkpoint(run)
    assert ckpt.unit == "checkpoint-100" and ckpt.step == 100 and ckpt.path == run / "checkpoint-100"
    assert sorted(ckpt.skipped) == ["checkpoint-200"]
    assert ckpt.skipped["checkpoint-200"].startswith("truncated_zip_no_central_directory: ")
    assert sorted(ckpt.keys()) == ["model.safetensors", "optimizer.pt", "rng_state.pth", "scheduler.pt",
                                   "trainer_state.json"]
    assert list(ckpt.not_loaded) == ["training_args.bin"]
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(100))
    assert torch.equal(ckpt["model.safetensors"]["lin.weight"], w)
    assert torch.equal(ckpt["optimizer.pt"]["state"][0]["exp_avg_sq"], w * w)
    assert ckpt["trainer_state.json"] == {"global_step": 100, "epoch": 0.5}
    assert ckpt["scheduler.pt"]["last_epoch"] == 100


def test_publish_folder_unit_loads_and_an_unsealed_one_is_in_progress(tmp_path):
    import torch

    from ckptaudit import publish as P

    run = tmp_path / "run"
    for step in (10, 20):
        with P.publish(run, step, folder=True) as pub:
            pub.save({"w": torch.full((3,), float(step))}, "model.pt")
            pub.save({"iter_num": step}, "meta/train_state.pt")
    (run / "checkpoint-20" / "COMPLETE").unlink()  # killed before the marker was written
    ckpt = safe_load_checkpoint(run)
    assert ckpt.unit == "checkpoint-10" and ckpt.step == 10
    assert ckpt.skipped["checkpoint-20"].startswith("in-progress save (manifest.json written but no COMPLETE")
    assert sorted(ckpt.keys()) == ["meta/train_state.pt", "model.pt"]
    assert torch.equal(ckpt["model.pt"]["w"], torch.full((3,), 10.0))


def test_hf_sharded_index_loads_as_one_state_dict():
    ckpt = safe_load_checkpoint(CASES / "ok_hf_sharded")
    assert ckpt.unit == "model.safetensors.index.json"
    import json

    wm = json.loads((CASES / "ok_hf_sharded" / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(ckpt.keys()) == sorted(wm)


@pytest.mark.parametrize("case,unit,step", [("ok_dcp", "step-6", 6), ("ok_deepspeed_layout", "global_step6", 6)])
def test_framework_layouts_are_checked_not_loaded(case, unit, step):
    with pytest.raises(NoUsableCheckpointError) as ei:
        safe_load_checkpoint(CASES / case)
    assert "load=False" in ei.value.reasons[unit]
    ckpt = safe_load_checkpoint(CASES / case, load=False)
    assert (ckpt.unit, ckpt.step, ckpt.state, ckpt.path) == (unit, step, None, CASES / case / unit)


def test_the_reader_loads_the_unit_it_returns_once(tmp_path, monkeypatch):
    """The reader's load test of a torch zip is its final load (ckptaudit/stages/load/reader.py): one ``torch.load`` of
    the returned file, in this process, and no forked load child; the object returned is that load's."""
    import torch

    from ckptaudit.stages.load import loadtest

    run = tmp_path / "run"
    run.mkdir()
    for step in (100, 200):
        torch.save({"model": {"w": torch.full((8,), float(step))}, "iter_num": step}, run / f"ckpt_{step:06d}.pt")
    calls = []
    real_load = torch.load

    def counting_load(f, *a, **k):  # the reader loads by /proc/self/fd/N, the verified file's open descriptor
        calls.append(os.path.basename(os.path.realpath(str(f))))
        return real_load(f, *a, **k)

    def no_child(*a, **k):
        raise AssertionError("a load child was forked for a file the reader loads itself")

    monkeypatch.setattr(torch, "load", counting_load)
    monkeypatch.setattr(loadtest, "load_in_child", no_child)
    ckpt = safe_load_checkpoint(run)
    assert ckpt.unit == "ckpt_000200.pt" and ckpt.step == 200
    assert calls == ["ckpt_000200.pt"]
    assert torch.equal(ckpt["model"]["w"], torch.full((8,), 200.0))


def test_a_map_location_other_than_cpu_keeps_the_forked_load_test(tmp_path, monkeypatch):
    """Loaded elsewhere than on the CPU (here ``map_location="meta"``), the object of the load test could not be
    returned: the file is load-tested in a child, as in the audit, then loaded for the caller."""
    import torch

    from ckptaudit.stages.load import loadtest

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.ones(4)}, "iter_num": 7}, run / "ckpt_000007.pt")
    forked = []
    real = loadtest.load_in_child

    def spy(path, *a, **k):
        forked.append(os.path.basename(path))
        return real(path, *a, **k)

    monkeypatch.setattr(loadtest, "load_in_child", spy)
    ckpt = safe_load_checkpoint(run, map_location="meta")
    assert forked == ["ckpt_000007.pt"] and ckpt["model"]["w"].device.type == "meta"


def test_the_reader_scratch_is_on_a_tmpfs_unless_tmpdir_says(tmp_path, monkeypatch):
    """The search's scratch tables go to /dev/shm (a tmpfs: no journaling per small table) when ``TMPDIR`` is not
    set, to ``TMPDIR`` when it is, and are removed on return."""
    import tempfile

    import torch

    from ckptaudit import safe_load

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.ones(4)}, "iter_num": 7}, run / "ckpt_000007.pt")
    monkeypatch.delenv("TMPDIR", raising=False)
    shm = os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK)
    assert safe_load.scratch_root() == ("/dev/shm" if shm else None)

    made = []
    real = tempfile.TemporaryDirectory

    def spy(*a, **k):
        td = real(*a, **k)
        made.append(td.name)
        return td

    monkeypatch.setattr(tempfile, "TemporaryDirectory", spy)
    assert safe_load_checkpoint(run).step == 7
    if shm:
        assert os.path.dirname(made[-1]) == "/dev/shm"
    assert not os.path.exists(made[-1])

    mine = tmp_path / "tmpdir"
    mine.mkdir()
    monkeypatch.setenv("TMPDIR", str(mine))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    assert safe_load.scratch_root() is None
    assert safe_load_checkpoint(run).step == 7
    assert os.path.dirname(made[-1]) == str(mine) and not os.listdir(mine)
