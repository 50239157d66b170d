"""Layouts without a handed case: HF Trainer folders, Lightning files, leftovers and pointers."""

import json
import os
import shutil

import pytest

import torch
from safetensors.torch import save_file

from ckptaudit.pipeline import audit_in_process

from .conftest import CASES


def _ok():
    return torch.load(CASES / "ok_full_torch" / "ckpt.pt", weights_only=True)


def kinds(v, unit):
    return {f["kind"] for u in v["units"] if u["unit"] == unit for f in u["findings"]}


def hf_trainer_folder(d, step, optimizer=True):
    """The files transformers' Trainer._save_checkpoint writes."""
    ck = _ok()
    d.mkdir(parents=True)
    save_file({k: v.contiguous().clone() for k, v in ck["model"].items() if k != "lm_head.weight"},
              d / "model.safetensors")
    if optimizer:
        torch.save(ck["optimizer"], d / "optimizer.pt")
    torch.save(ck["scheduler"], d / "scheduler.pt")
    torch.save({"python": ck["rng"]["python"], "cpu": ck["rng"]["torch"]}, d / "rng_state.pth")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.5, "best_metric": None}))


def test_hf_trainer_folders(tmp_path):
    hf_trainer_folder(tmp_path / "checkpoint-500", 500)
    hf_trainer_folder(tmp_path / "checkpoint-1000", 1000, optimizer=False)
    v = audit_in_process(tmp_path)
    by = {u["unit"]: u for u in v["units"]}
    assert by["checkpoint-500"]["layout"] == "hf-trainer" and by["checkpoint-500"]["step"] == 500
    assert by["checkpoint-500"]["usable_for"] == "resume"
    assert "missing_optimizer_state" in kinds(v, "checkpoint-1000")
    assert v["rollback"] == {"unit": "checkpoint-500", "step": 500}
    assert v["alternatives"] == [{"unit": "checkpoint-1000", "step": 1000, "usable_for": "warm-start",
                                  "steps_lost": 0}]


def test_in_progress_trainer_folder_is_never_a_rollback_point(tmp_path):
    hf_trainer_folder(tmp_path / "checkpoint-500", 500)
    hf_trainer_folder(tmp_path / "tmp-checkpoint-1000", 1000)
    v = audit_in_process(tmp_path)
    assert "unit_in_progress" in kinds(v, "tmp-checkpoint-1000")
    assert v["rollback"]["unit"] == "checkpoint-500"


def test_lightning_checkpoint_and_dangling_last(tmp_path):
    ck = _ok()
    lightning = {"epoch": 3, "global_step": 1200, "pytorch-lightning_version": "2.4.0",
                 "state_dict": {f"model.{k}": v for k, v in ck["model"].items()},
                 "optimizer_states": [ck["optimizer"]], "lr_schedulers": [ck["scheduler"]],
                 "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 3}}}},
                 "hyper_parameters": {"lr": 3e-3}}
    torch.save(lightning, tmp_path / "epoch=3-step=1200.ckpt")
    os.symlink("epoch=4-step=1600.ckpt", tmp_path / "last.ckpt")
    v = audit_in_process(tmp_path)
    u = v["units"][0]
    assert (u["unit"], u["layout"], u["step"], u["usable_for"]) == ("epoch=3-step=1200.ckpt", "lightning", 1200,
                                                                     "resume")
    assert [(p["path"], p["ok"], p["kind"]) for p in v["pointers"]] == [("last.ckpt", False, "dangling_symlink")]


def test_dcp_metadata_tmp_leftover(tmp_path):
    shutil.copytree(CASES / "dcp_missing_metadata" / "step-6", tmp_path / "step-6")
    (tmp_path / "step-6" / ".metadata.tmp").write_bytes(b"\x80\x04partial")
    v = audit_in_process(tmp_path)
    f = next(f for f in v["units"][0]["findings"] if f["kind"] == "dcp_metadata_missing")
    assert "a .metadata.tmp is left over" in f["message"]
    assert v["recommendation"] == "retrain"


def test_megatron_rank_missing(tmp_path):
    shutil.copytree(CASES / "megatron_mixed_step_shards" / "iter_0000006", tmp_path / "iter_0000006")
    shutil.rmtree(tmp_path / "iter_0000006" / "mp_rank_01")
    (tmp_path / "iter_0000006" / "mp_rank_02").mkdir()
    shutil.copy(CASES / "megatron_mixed_step_shards" / "iter_0000006" / "mp_rank_00" / "model_optim_rng.pt",
                tmp_path / "iter_0000006" / "mp_rank_02" / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("6")
    v = audit_in_process(tmp_path)
    assert "megatron_rank_missing" in kinds(v, "iter_0000006")
    assert v["pointers"][0]["kind"] == "latest_pointer_incomplete"


@pytest.mark.parametrize("keep,missing", [
    (["mp_rank_00_000", "mp_rank_00_001"], None),
    (["mp_rank_00_000"], "mp_rank_00_001"),  # a pipeline stage's save never landed
])
def test_megatron_pipeline_ranks(tmp_path, keep, missing):
    """Megatron names rank folders mp_rank_TT_PPP when pipeline_model_parallel_size > 1
    (megatron/training/checkpointing.py get_checkpoint_name): each declared pipeline rank must be there."""
    import argparse

    import torch

    for rank in keep:
        d = tmp_path / "iter_0000006" / rank
        d.mkdir(parents=True)
        torch.save({"iteration": 6, "checkpoint_version": 3.0,
                    "args": argparse.Namespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=2),
                    "model": {"language_model": {"w": torch.ones(2)}}}, d / "model_optim_rng.pt")
    v = audit_in_process(tmp_path)
    u = next(u for u in v["units"] if u["unit"] == "iter_0000006")
    got = [f for f in u["findings"] if f["kind"] == "megatron_rank_missing"]
    if missing is None:
        assert got == []
    else:
        assert [f["detail"]["missing"] for f in got] == [missing] and u["usable_for"] == "none"


def test_pickle_disguised_as_safetensors(tmp_path):
    shutil.copy(CASES / "ok_full_torch" / "ckpt.pt", tmp_path / "model.safetensors")
    v = audit_in_process(tmp_path)
    f = next(f for f in v["units"][0]["findings"] if f["kind"] == "pickle_obfuscation")
    assert f["layer"] == "security" and f["severity"] == "error"
    assert "named like a pickle-free format but its bytes are a torch zip" in f["message"]
    assert v["units"][0]["usable_for"] == "none"


def test_every_registered_adapter_satisfies_its_protocol():
    from ckptaudit import layouts
    from ckptaudit.layouts import single
    from ckptaudit.layouts.adapter import IndexAdapter, LayoutAdapter

    every = layouts.DIR_ADAPTERS + [single.ADAPTER, single.IN_PROGRESS, single.IRREGULAR]
    assert [a.name for a in every if not isinstance(a, LayoutAdapter)] == []
    assert [a.name for a in layouts.INDEX_ADAPTERS if not isinstance(a, IndexAdapter)] == []
    assert sorted(layouts.BY_NAME) == ["accelerate", "ckptaudit-publish", "dcp", "deepspeed", "hf-sharded",
                                   "hf-trainer", "megatron", "megatron-dist"]
