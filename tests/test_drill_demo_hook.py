"""The default (demo) restore hook on a user's run is a configuration error (exit 3, "set drill.hook"), not a
drill finding (exit 1)."""

from __future__ import annotations

import json

import pytest
import torch

from ckptaudit import drill as dr
from ckptaudit.demo.hook import NotADemoCheckpoint, restore_hook


def _user_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.zeros(2)}, "optimizer": {"state": {}, "param_groups": []},
                "model_args": {"n_layer": 2}, "config": {}, "iter_num": 10}, run / "ckpt_000010.pt")
    return run


def test_demo_hook_says_the_unit_is_not_a_demo_checkpoint(tmp_path):
    run = _user_run(tmp_path)
    with pytest.raises(NotADemoCheckpoint, match=r"model_args lacks \['bias', 'block_size', 'dropout', 'n_embd', "
                                                 r"'n_head', 'vocab_size'\]$") as ei:
        restore_hook(str(run / "ckpt_000010.pt"), "cpu")
    assert isinstance(ei.value, KeyError) and ei.value.hook_mismatch
    torch.save({"state_dict": {}}, run / "other.pt")
    with pytest.raises(NotADemoCheckpoint, match=r"cannot resume without \['config', 'model', 'model_args', "
                                                 r"'optimizer'\]"):
        restore_hook(str(run / "other.pt"), "cpu")


def test_drill_with_the_demo_hook_on_a_user_run_exits_3_and_names_drill_hook(tmp_path):
    run = _user_run(tmp_path)
    v = {"run_dir": str(run), "recommendation": "resume", "rollback": {"unit": "ckpt_000010.pt", "step": 10},
         "units": [{"unit": "ckpt_000010.pt", "step": 10, "usable_for": "resume", "findings": []}]}
    rows, code = dr.run_drill(run, tmp_path / "out", {"drill": {"devices": ["cpu"]}}, verdict=v)
    assert code == dr.EXIT_FAILED == 3
    r = next(r for r in rows if r["check"] == "child_process")
    assert r["status"] == "fail"
    assert r["message"].startswith("the restore hook could not be used: set drill.hook to your job's restore "
                                   "function (\"package.module:function\", see docs/drill.md): "
                                   "'ckptaudit.demo:restore_hook' cannot restore ckpt_000010.pt: ")
    assert r["message"].endswith("model_args lacks ['bias', 'block_size', 'dropout', 'n_embd', 'n_head', "
                                 "'vocab_size']")
    doc = (tmp_path / "out" / "drill.json").read_text()
    assert "set drill.hook" in json.loads(doc)["summary"]  # the one line cron mail shows
    assert not any(r["check"] == "restore_hook" for r in rows)  # not reported as the unit failing to restore


def test_demo_hook_calls_a_folder_or_a_non_torch_file_not_a_demo_checkpoint(tmp_path):
    """A Trainer checkpoint-N/ folder (the user's HF run) or a safetensors/JSON file is another trainer's unit."""
    folder = tmp_path / "checkpoint-20"
    folder.mkdir()
    (folder / "trainer_state.json").write_text("{}")
    with pytest.raises(NotADemoCheckpoint, match=r"checkpoint-20: a folder, not the single torch.save file"):
        restore_hook(str(folder), "cpu")
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(NotADemoCheckpoint, match=r"model.safetensors: not a torch.save file \(starts with "
                                                 r"b'\\x08\\x00\\x00\\x00'\)"):
        restore_hook(str(tmp_path / "model.safetensors"), "cpu")


def _drill_cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "ckptaudit.cli", "drill", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_drill_cli_refuses_an_unimportable_hook_and_a_missing_unit_before_the_audit(tmp_path):
    run = _user_run(tmp_path)
    cfg = tmp_path / "drill.yaml"
    cfg.write_text('drill:\n  hook: "mylab_no_such_pkg.train:restore_hook"\n')
    p = _drill_cli(run, "--out", tmp_path / "o1", "--config", cfg)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.strip() == (
        "ckptaudit drill: error: drill.hook 'mylab_no_such_pkg.train:restore_hook' cannot be imported: "
        "ModuleNotFoundError: No module named 'mylab_no_such_pkg' (set drill.hook to your job's restore function, "
        "\"package.module:function\", see docs/drill.md)")
    p = _drill_cli(run, "--out", tmp_path / "o2", "--unit", "ckpt_000099.pt")
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stderr.strip() == (f"ckptaudit drill: error: --unit ckpt_000099.pt: no such file or folder in {run} "
                                "(give the unit's path relative to RUN_DIR, e.g. checkpoint-20)")
    assert not (tmp_path / "o1" / "verdict.json").exists() and not (tmp_path / "o2" / "verdict.json").exists()
