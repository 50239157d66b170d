"""State layer read as a run, on runs really trained by the demo trainer (real AdamW)."""

import math

import pytest
import torch

from ckptaudit import verdict
from ckptaudit.demo import ckpt_name, train
from ckptaudit.pipeline import audit_in_process


def kinds(v, unit):
    return {f["kind"] for u in v["units"] if u["unit"] == unit for f in u["findings"]}


def use(v, unit):
    return next(u["usable_for"] for u in v["units"] if u["unit"] == unit)


def test_restart_that_resets_the_step(tmp_path):
    """A job restarted from weights only: counters start again at 0 while names go on."""
    train(tmp_path, max_steps=150, save_every=50)
    train(tmp_path, max_steps=100, save_every=50, start_from=tmp_path / ckpt_name(150), restore="weights",
          filename=lambda s: ckpt_name(150 + s))
    v = audit_in_process(tmp_path)
    for u in ("ckpt_000200.pt", "ckpt_000250.pt"):
        assert {"step_counter_reset", "step_not_increasing"} <= kinds(v, u), kinds(v, u)
        assert use(v, u) == "warm-start"
    for u in ("ckpt_000050.pt", "ckpt_000100.pt", "ckpt_000150.pt"):
        assert use(v, u) == "resume"
    assert v["recommendation"] == "resume"
    assert v["rollback"] == {"unit": "ckpt_000150.pt", "step": 150}
    reset = next(f for u in v["units"] if u["unit"] == "ckpt_000200.pt" for f in u["findings"]
                 if f["kind"] == "step_counter_reset")
    assert reset["repair"].startswith("ckpt['iter_num'] = ")


def test_nan_divergence_names_the_first_poisoned_unit(tmp_path):
    def poison(step, model, optimizer):
        if step == 120:
            with torch.no_grad():
                next(model.parameters()).view(-1)[0] = math.nan

    train(tmp_path, max_steps=200, save_every=50, on_step=poison)
    v = audit_in_process(tmp_path)
    assert [use(v, ckpt_name(s)) for s in (50, 100, 150, 200)] == ["resume", "resume", "none", "none"]
    assert "nan_in_weights" in kinds(v, "ckpt_000150.pt") and "nan_in_weights" in kinds(v, "ckpt_000200.pt")
    assert v["rollback"] == {"unit": "ckpt_000100.pt", "step": 100}
    assert v["steps_lost"] == 100
    assert ("The first checkpoint with non-finite weights is ckpt_000150.pt (step 150); every later one "
            "inherits the divergence.") in v["reasons"]


def test_newest_unit_without_optimizer_is_a_warm_start_alternative(tmp_path):
    def drop(step, ckpt):
        if step == 200:
            del ckpt["optimizer"]
        return ckpt

    train(tmp_path, max_steps=200, save_every=50, mutate=drop)
    v = audit_in_process(tmp_path)
    assert "missing_optimizer_state" in kinds(v, "ckpt_000200.pt")
    assert v["recommendation"] == "resume"
    assert v["rollback"] == {"unit": "ckpt_000150.pt", "step": 150}
    assert v["alternatives"] == [{"unit": "ckpt_000200.pt", "step": 200, "usable_for": "warm-start",
                                  "steps_lost": 0}]
    assert verdict.exit_code(v) == 1


def test_weights_only_run_recommends_warm_start(tmp_path):
    train(tmp_path, max_steps=100, save_every=50, mutate=lambda step, ckpt: ckpt["model"])
    v = audit_in_process(tmp_path)
    assert v["recommendation"] == "warm-start"
    assert v["rollback"] == {"unit": "ckpt_000100.pt", "step": 100}
    assert kinds(v, "ckpt_000100.pt") >= {"weights_only_checkpoint"}


def test_all_damaged_run_is_retrain_exit_2(tmp_path):
    train(tmp_path, max_steps=100, save_every=50)
    for s in (50, 100):
        p = tmp_path / ckpt_name(s)
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 3])
    v = audit_in_process(tmp_path)
    assert v["recommendation"] == "retrain" and v["rollback"] is None
    assert verdict.exit_code(v) == 2


def test_large_param_groups_are_counted(tmp_path):
    """Regression: a group of more than 64 parameter ids was pruned away and gave a false mismatch."""
    from ckptaudit.demo import DEFAULT_MODEL_ARGS

    train(tmp_path, max_steps=4, save_every=4, model_args=dict(DEFAULT_MODEL_ARGS, n_layer=12, n_embd=16, n_head=4))
    v = audit_in_process(tmp_path)
    assert v["units"][0]["usable_for"] == "resume", [f["kind"] for f in v["units"][0]["findings"]]
