"""Components are recognised by their shape (recognise.py, components.py), optimizers by their param_groups
(optimizers.py), producers by contract (producers/), file damage weighed by role (roles.py)."""

import torch

from ckptaudit import components as C
from ckptaudit.components import optimizers
from ckptaudit import producers, roles
from ckptaudit import recognise as R


def T(dtype="float32", shape=(4, 4), value=None):
    d = {"__tensor__": dtype, "shape": list(shape)}
    if value is not None:
        d["value"] = value
    return d


def adam_sd(n=2, step=30.0):
    return {"state": {str(i): {"step": T(shape=(), value=step), "exp_avg": T(), "exp_avg_sq": T()} for i in range(n)},
            "param_groups": [{"params": list(range(n)), "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                              "weight_decay": 0.01, "amsgrad": False}]}


def test_optimizer_under_any_key_is_found_by_shape():
    """Regression: an optimizer stored as 'optimizer_state' (resemblyzer on PyPI) was 'no optimizer state'."""
    tree = {"root": {"model_state": {"w": T(), "b": T(shape=(4,))}, "optimizer_state": adam_sd(), "step": 30}}
    c = C.collect("torch-zip", tree, {})
    assert c.optimizer_source == "root:optimizer_state"
    assert c.weights_source == "root:model_state" and sorted(c.weights) == ["b", "w"]
    assert c.step == 30 and c.step_source == "root:step"
    assert c.optimizer_needs.name == "AdamW" and c.optimizer_needs.needs_state is True


def test_nested_components_and_lists():
    tree = {"root": {"state_dict": {"layer.weight": T()}, "optimizer_states": [adam_sd(1)],
                     "lr_schedulers": [{"last_epoch": 3, "base_lrs": [0.1], "_step_count": 4}],
                     "callbacks": {"ModelCheckpoint{}": {"kth_value": T(shape=(), value="inf"), "monitor": "loss"}},
                     "global_step": 30, "epoch": 2}}
    f = R.find(tree)
    assert [(n.kind, n.path) for n in f.nodes] == [
        ("weights", "state_dict"), ("optimizer", "optimizer_states.0"), ("scheduler", "lr_schedulers.0")]
    c = C.collect("lightning", tree, {})
    assert (c.step, c.epoch, c.scheduler_last_epoch) == (30, 2.0, 3)
    # the callback's inf sentinel is neither weights nor optimizer
    row = {"file": "last.ckpt", "name": "callbacks.ModelCheckpoint{}.kth_value"}
    from ckptaudit.stages.state import tensor_role

    assert tensor_role(row, c) == "other"
    assert tensor_role({"file": "last.ckpt", "name": "state_dict.layer.weight"}, c) == "weights"
    assert tensor_role({"file": "last.ckpt", "name": "optimizer_states.0.state.0.exp_avg"}, c) == "optimizer"


def test_rng_states_by_shape():
    assert R.is_rng(T("uint8", (5056,)))
    assert R.is_rng([3, {"__list__": 625}, None])
    assert R.is_rng(["MT19937", {"__call__": "numpy"}, 624, 0, 0.0])
    assert not R.is_rng(T("uint8", (100,)))


def accelerate_random_states(step=0):
    """random_states_0.pkl of accelerate 1.15 save_accelerator_state, as the scan prunes it."""
    return {"numpy_random_seed": ["MT19937", {"__call__": "numpy._core.multiarray._reconstruct"}, 623, 0, 0.0],
            "random_state": [3, {"__list__": 625}, None], "step": step, "torch_manual_seed": T("uint8", (5056,))}


def test_accelerate_rng_step_is_not_the_training_step(monkeypatch):
    """Regression: random_states_0.pkl's 'step' (Accelerator.step, the gradient-accumulation counter, 0 without
    accumulate()) was read as the global step, so a clean run had step 0 in every unit and a step_counter_reset.
    The RNG bundle is one component; the step comes from the optimizer (contracts on and off)."""
    assert R.is_rng_bundle(accelerate_random_states())
    assert not R.is_rng_bundle({"step": 3, "torch_manual_seed": T("uint8", (5056,)), "w": T()})
    tree = {"model.safetensors": {"__safetensors__": {"0.weight": T()}, "__metadata__": {"format": "pt"}},
            "optimizer.bin": adam_sd(step=24.0),
            "random_states_0.pkl": accelerate_random_states(0),
            "scheduler.bin": {"last_epoch": 24, "base_lrs": [1e-3], "_step_count": 25, "lr_lambdas": [None]}}
    for on in ("1", "0"):
        monkeypatch.setenv("CKPTAUDIT_PRODUCER_CONTRACTS", on)
        c = C.collect("accelerate", tree, {})
        assert c.rng and (c.step, c.step_source) == (24, "optimizer.bin:(root).state.*.step"), on
    # a registered custom object's step is still the step
    tree["custom_checkpoint_0.pkl"] = {"step": 24, "epoch": 2, "best_loss": 0.5}
    assert C.collect("accelerate", tree, {}).step_source == "custom_checkpoint_0.pkl:step"


def test_real_torch_state_dicts_match_the_recognisers():
    """The shapes come from torch itself: build real objects and prune them as the scan would."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, 3)).sum().backward()
    opt.step()
    sch = torch.optim.lr_scheduler.StepLR(opt, 1)
    scaler_keys = set(torch.amp.GradScaler("cpu").state_dict()) or {"scale", "growth_factor", "backoff_factor",
                                                                     "growth_interval", "_growth_tracker"}
    assert set(opt.state_dict()) == {"state", "param_groups"}
    assert "last_epoch" in sch.state_dict() and R.SCHEDULER_FIELDS & set(sch.state_dict())
    assert len(R.SCALER_FIELDS & scaler_keys) >= 3
    assert torch.get_rng_state().numel() == R.TORCH_CPU_RNG_BYTES


def test_dcp_flat_optimizer_in_both_forms():
    by_index = {"state.w.exp_avg": T(), "param_groups.0.lr": 0.1, "param_groups.0.params": ["w", "b"]}
    by_fqn = {"state.w.exp_avg": T(), "param_groups.w.lr": 0.1, "param_groups.b.lr": 0.1}
    assert R.unflatten_optimizer(by_index)["param_groups"] == [{"lr": 0.1, "params": ["w", "b"]}]
    assert R.unflatten_optimizer(by_fqn)["param_groups"] == [{"lr": 0.1, "params": ["w", "b"]}]


def test_optimizer_needs_from_param_groups():
    sgd0 = [{"params": [0], "lr": 0.1, "momentum": 0, "dampening": 0, "nesterov": False, "weight_decay": 0}]
    sgd9 = [dict(sgd0[0], momentum=0.9)]
    assert optimizers.recognise(sgd0).needs_state is False
    assert optimizers.recognise(sgd9).needs_state is True
    for opt in (torch.optim.SGD([torch.zeros(1)], lr=0.1), torch.optim.Adam([torch.zeros(1)]),
                torch.optim.Adagrad([torch.zeros(1)]), torch.optim.RMSprop([torch.zeros(1)])):
        got = optimizers.recognise(opt.state_dict()["param_groups"])
        assert got.name in ({"SGD": ("SGD",), "Adam": ("Adam", "AdamW"), "Adagrad": ("Adagrad",),
                             "RMSprop": ("RMSprop",)}[type(opt).__name__]), (type(opt).__name__, got)
    assert optimizers.recognise([]).needs_state is None


def test_empty_state_of_plain_sgd_is_no_finding(tmp_path):
    """Regression: SGD with momentum 0 keeps no per-parameter state; it was 'saved from a fresh optimizer'."""
    from ckptaudit.pipeline import audit_in_process

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0)
    sch = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    for step in (10, 20):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        sch.step()  # once per "epoch": last_epoch is far below the step by design
        torch.save({"step": step, "model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(),
                    "scheduler_state_dict": sch.state_dict(), "rng": torch.get_rng_state()},
                   tmp_path / f"checkpoint_{step}.pt")
    v = audit_in_process(tmp_path)
    kinds = {f["kind"] for u in v["units"] for f in u["findings"]}
    assert not kinds & {"empty_optimizer_state", "step_counter_reset", "optimizer_state_incomplete"}, kinds
    assert v["recommendation"] == "resume" and v["rollback"]["unit"] == "checkpoint_20.pt"


def test_contracts_identify_and_switch_off(monkeypatch):
    c = producers.identify("hf-trainer", ["checkpoint-10/trainer_state.json", "checkpoint-10/optimizer.pt"])
    assert c.producer == "hf-trainer"
    assert producers.role_of(c, "checkpoint-10/training_args.bin").loaded_by == "never"
    assert producers.metadata_files(c, ["a/training_args.bin", "a/optimizer.pt", "a/config.json"]) == [
        "a/training_args.bin", "a/config.json"]
    tree = {"root": {"model": {}, "optimizer": {}, "model_args": {}, "iter_num": 5, "config": {}}}
    assert producers.identify("torch-zip", ["ckpt.pt"], tree).producer == "nanogpt"
    monkeypatch.setenv("CKPTAUDIT_PRODUCER_CONTRACTS", "0")
    assert producers.identify("hf-trainer", ["checkpoint-10/trainer_state.json"]) is None


def test_file_roles_weigh_damage():
    r = roles.roles_for("hf-trainer", ["c/model.safetensors", "c/optimizer.pt", "c/rng_state.pth",
                                        "c/training_args.bin"])
    assert r == {"c/model.safetensors": "weights", "c/optimizer.pt": "optimizer", "c/rng_state.pth": "rng",
                 "c/training_args.bin": "metadata"}
    f = {"layer": "file", "caps": "none", "severity": "error", "path": "c/optimizer.pt"}
    assert roles.capped(f, r, intact=True) == "warm-start"
    assert roles.capped({**f, "path": "c/model.safetensors"}, r, intact=True) == "none"
    assert roles.capped(f, r, intact=False) == "none"
    assert roles.roles_for("deepspeed", ["g/zero_pp_rank_0_mp_rank_00_optim_states.pt"],
                           {"zero_stage": 3}) == {"g/zero_pp_rank_0_mp_rank_00_optim_states.pt": "weights"}


def test_trainer_loss_at_the_save_step_comes_from_log_history():
    """transformers' trainer_state.json logs the loss every logging_steps: the unit's loss is the last logged at
    or before its global_step (the HF run of the user: loss at steps 5, 10, 15, 20)."""
    hist = [{"loss": 3.89, "step": 5}, {"loss": 3.91, "step": 10}, {"eval_loss": 3.5, "step": 10},
            {"loss": 3.8975, "step": 15}, {"loss": 3.8995, "step": 20}]
    tree = {"checkpoint-15/trainer_state.json": {"global_step": 15, "log_history": hist}}
    c = C.collect("hf-trainer", tree, {})
    assert (c.step, c.loss) == (15, 3.8975)
    tree = {"checkpoint-12/trainer_state.json": {"global_step": 12, "log_history": hist[:3]}}
    assert C.collect("hf-trainer", tree, {}).loss == 3.91
    assert C.collect("hf-trainer", {"t/trainer_state.json": {"global_step": 3, "log_history": hist}}, {}).loss is None
