"""lr_continuity over the horizon that can reveal a schedule (issue 28): StepLR, cosine and warm-up schedules
resumed at step 70 with the scheduler restored, rebuilt fresh, or rebuilt and fast-forwarded.  The check is the
drill child's own (ContinueChecks.c_lr) on real torch optimizers and schedulers; the schedule (the hook's
lr_at) is an uninterrupted run's LR at each step."""

from __future__ import annotations

import types

import pytest
import torch

from ckptaudit.drill.checks_continue import ContinueChecks

STEP, CONTINUE = 70, 5


def _make(kind: str, opt):
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.5)
    if kind == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))  # linear warm-up, 100 steps


def _model_opt():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 1)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def _schedule(kind: str, n: int) -> list:
    """The LR an uninterrupted run uses at each step 0..n-1."""
    m, opt = _model_opt()
    sch = _make(kind, opt)
    out = []
    for _ in range(n):
        out.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sch.step()
    return out


def _restored(kind: str, how: str):
    """Train to STEP saving {model, optimizer[, scheduler]}, then restore as a resume script would."""
    m, opt = _model_opt()
    sch = _make(kind, opt)
    for _ in range(STEP):
        m(torch.randn(2, 4)).sum().backward()
        opt.step()
        sch.step()
    saved = {"optimizer": opt.state_dict(), "scheduler": sch.state_dict() if how == "restored" else None}
    m2, opt2 = _model_opt()  # as training built them, then the saved state loaded into them
    sch2 = _make(kind, opt2)
    if how == "fast-forwarded":  # the audit's repair for a missing scheduler: before optimizer.load_state_dict
        for _ in range(STEP):
            sch2.step()
    opt2.load_state_dict(saved["optimizer"])
    if how == "restored":
        sch2.load_state_dict(saved["scheduler"])
    return m2, opt2, sch2, saved


class _Child(ContinueChecks):
    def __init__(self, kind: str, how: str):
        m, opt, sch, saved = _restored(kind, how)
        table = _schedule(kind, 20_000)
        self.r = types.SimpleNamespace(model=m, optimizer=opt, scheduler=sch, step=STEP, saved=saved,
                                       lr_at=lambda s: table[s])
        self.sched_epoch_at_restore = sch.last_epoch
        self.result = {"trace": []}
        for i in range(CONTINUE):  # the continuation: one update per step, the scheduler stepped with it
            self.result["trace"].append({"step": STEP + i, "lr": [g["lr"] for g in opt.param_groups],
                                         "scheduler_last_epoch": sch.last_epoch})
            opt.step()
            sch.step()


@pytest.mark.parametrize("kind", ["step", "cosine", "warmup"])
@pytest.mark.parametrize("how,want", [("restored", "pass"), ("fresh", "fail"), ("fast-forwarded", "pass")])
def test_lr_continuity_over_the_next_change_of_the_schedule(kind, how, want):
    child = _Child(kind, how)
    before = ([g["lr"] for g in child.r.optimizer.param_groups], child.r.scheduler.state_dict())
    status, expected, actual, message = child.c_lr()
    assert status == want, (kind, how, message)
    if kind == "step" and how == "fresh":  # the 5 continuation LRs match: only the horizon reveals it
        assert "stepped ahead" in message and "at step 90" in expected and "counter was 0" in message, message
    after = ([g["lr"] for g in child.r.optimizer.param_groups], child.r.scheduler.state_dict())
    assert after == before  # the look ahead puts the scheduler and the LRs back
