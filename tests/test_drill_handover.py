"""ckptaudit.drill.handover: the hook's optimizer and scheduler as handed over, against the unit's.

Regression (issue 43): the optimizer check called ``load_state_dict(saved)`` on the hook's own optimizer, which
put the unit's groups back into it, so the continuation trained with the saved LR instead of the job's.
"""

from __future__ import annotations

import torch

from ckptaudit.drill import handover


def _opt(lr=0.1):
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW([{"params": [m.weight]}, {"params": [m.bias], "weight_decay": 0.0}], lr=lr)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    return m, opt


def test_the_load_is_tried_on_a_copy_and_the_hooks_optimizer_keeps_its_groups():
    _, saved_opt = _opt(lr=0.1)
    saved = saved_opt.state_dict()
    _, opt = _opt(lr=0.05)  # the job's optimizer: another LR than the unit saved
    moments = opt.state[opt.param_groups[0]["params"][0]]["exp_avg"].clone()
    assert handover.load_on_copy(opt, saved) == ("accepted", "")
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.05]  # not the unit's 0.1
    assert torch.equal(opt.state[opt.param_groups[0]["params"][0]]["exp_avg"], moments)
    assert handover.group_differences(handover.take(opt, None).groups, saved["param_groups"]) == [
        "group 0 'lr': 0.05 (the hook's) vs 0.1 (the unit's)", "group 1 'lr': 0.05 (the hook's) vs 0.1 (the unit's)"]
    one_group = {**saved, "param_groups": saved["param_groups"][:1]}
    status, why = handover.load_on_copy(opt, one_group)
    assert status == "refused" and why == ("optimizer.load_state_dict raised: loaded state dict has a different "
                                           "number of parameter groups"), why


def test_an_optimizer_that_cannot_be_copied_is_untried_not_refused():
    class Uncopyable(torch.optim.SGD):
        def __deepcopy__(self, memo):
            raise TypeError("cannot pickle 'ProcessGroup' object")

    m = torch.nn.Linear(2, 1)
    opt = Uncopyable(m.parameters(), lr=0.1)
    assert handover.load_on_copy(opt, opt.state_dict()) == (
        "untried", "the optimizer could not be copied to try load_state_dict (TypeError: cannot pickle "
                   "'ProcessGroup' object)")


def test_implementation_flags_are_not_hyperparameters():
    _, a = _opt()
    saved = a.state_dict()["param_groups"]
    handed = [dict({k: v for k, v in g.items() if k != "params"}, foreach=True, fused=None) for g in saved]
    assert handover.group_differences(handed, saved) == []
    handed[1]["betas"] = (0.95, 0.999)
    assert handover.group_differences(handed, saved) == [
        "group 1 'betas': (0.95, 0.999) (the hook's) vs (0.9, 0.999) (the unit's)"]


def test_counters_of_a_chained_scheduler_come_from_its_children():
    _, opt = _opt()
    lr = torch.optim.lr_scheduler
    sch = lr.ChainedScheduler([lr.LinearLR(opt, start_factor=0.5, total_iters=4), lr.ExponentialLR(opt, 0.9)])
    assert not hasattr(sch, "last_epoch") and handover.counter(sch) == 0
    saved = sch.state_dict()
    for _ in range(3):
        opt.step()
        sch.step()
    assert handover.counter(sch) == 3
    assert handover.state_differences(handover.take(opt, sch).scheduler_state, saved) == [
        "_schedulers[0].last_epoch 3 (the hook's) vs 0 (the unit's)",
        "_schedulers[0]._step_count 4 (the hook's) vs 1 (the unit's)",
        "_schedulers[1].last_epoch 3 (the hook's) vs 0 (the unit's)",
        "_schedulers[1]._step_count 4 (the hook's) vs 1 (the unit's)"]
