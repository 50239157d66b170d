"""A tiny training job stepped by each LR scheduler of ``torch.optim.lr_scheduler`` that a training loop steps, its
checkpoints, and four restore hooks that resume it: faithfully, with the scheduler rebuilt fresh, with the
scheduler built after ``optimizer.load_state_dict``, and with the config LR set again after loading.

The job is what a user's would be: a two-group MLP (weights decayed, biases not), SGD with momentum or AdamW, a
scheduler stepped after every update (``per_epoch_step``: once per epoch of :data:`EPOCH` updates), batches drawn
from torch's global RNG, and a ``torch.save`` checkpoint of ``{model, optimizer, scheduler, rng, step, loss,
config}``.  A hook is named by the drill as ``"tests.drill_sched_job:restore_<how>"``.

:func:`resumed_run` is the truth a drill is judged against: it resumes through a hook and trains to the end of the
run, recording every update's optimizer hyperparameters (lr, momentum / betas, ...), for comparison with the
uninterrupted run's (:func:`train`).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
from torch.optim import lr_scheduler as L

TOTAL = 100  #: updates in the whole run (OneCycleLR's total_steps; lr_at is defined for steps 0..TOTAL-1)
EPOCH = 10  #: updates per epoch, for the scheduler stepped once per epoch
CONFIG_LR = 0.05  #: the learning rate in the job's config (what the optimizer is built with)


def _steplr(opt):
    return L.StepLR(opt, step_size=15, gamma=0.5)


SCHEDULERS: Dict[str, Callable] = {
    "StepLR": _steplr,
    "MultiStepLR": lambda opt: L.MultiStepLR(opt, milestones=[20, 45, 70], gamma=0.5),
    "ExponentialLR": lambda opt: L.ExponentialLR(opt, gamma=0.97),
    "CosineAnnealingLR": lambda opt: L.CosineAnnealingLR(opt, T_max=TOTAL, eta_min=1e-4),
    "CosineAnnealingWarmRestarts": lambda opt: L.CosineAnnealingWarmRestarts(opt, T_0=30, eta_min=1e-4),
    "OneCycleLR": lambda opt: L.OneCycleLR(opt, max_lr=0.1, total_steps=TOTAL, cycle_momentum=True,
                                           base_momentum=0.8, max_momentum=0.95),
    "CyclicLR": lambda opt: L.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=15, cycle_momentum=True,
                                       base_momentum=0.8, max_momentum=0.95),
    "LinearLR": lambda opt: L.LinearLR(opt, start_factor=0.1, total_iters=60),
    "LambdaLR": lambda opt: L.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 60)),
    "SequentialLR": lambda opt: L.SequentialLR(opt, [L.LinearLR(opt, start_factor=0.1, total_iters=10),
                                                     L.CosineAnnealingLR(opt, T_max=TOTAL - 10, eta_min=1e-4)],
                                               milestones=[10]),
    "ChainedScheduler": lambda opt: L.ChainedScheduler([L.LinearLR(opt, start_factor=0.1, total_iters=10),
                                                        L.ExponentialLR(opt, gamma=0.98)]),
    # stepped once per epoch (EPOCH updates): decays at epochs 3, 6, 9
    "per_epoch_StepLR": lambda opt: L.StepLR(opt, step_size=3, gamma=0.5),
}

OPTIMIZERS: Dict[str, Callable] = {
    "sgd": lambda groups: torch.optim.SGD(groups, lr=CONFIG_LR, momentum=0.9),
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=CONFIG_LR, betas=(0.9, 0.99)),
}

HOOKS = ("faithful", "fresh", "built_after", "config_lr")


def per_epoch(sched: str) -> bool:
    return sched.startswith("per_epoch")


def build(sched: str, opt: str) -> Tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The job's model (seeded) and optimizer: weights with weight decay, biases without."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
    other = [p for n, p in model.named_parameters() if not n.endswith("weight")]
    return model, OPTIMIZERS[opt]([{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}])


LOSS_BATCH = (torch.linspace(-1, 1, 32).reshape(8, 4), torch.linspace(0, 1, 8).reshape(8, 1))


def draw_batch():
    x = torch.randn(8, 4)
    return x, x.sum(1, keepdim=True).tanh()


def _loss(model, batch) -> torch.Tensor:
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def make_step(model, optimizer, scheduler, sched: str, start: int) -> Callable:
    """The loop body: one update; the scheduler stepped after it (per epoch: after the epoch's last update)."""
    done = [start]

    def train_step(batch):
        loss = _loss(model, batch)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done[0] += 1
        if not per_epoch(sched) or done[0] % EPOCH == 0:
            scheduler.step()
        return loss.item(), gn.item()

    return train_step


def hyper(optimizer) -> List[dict]:
    """Each param group's hyperparameters (every key but ``params``)."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def train(sched: str, opt: str, run_dir: Path, save_at=(40, 50)) -> List[List[dict]]:
    """Train the whole run (TOTAL updates), saving ``ckpt_<step>.pt`` at each step of ``save_at``; return every
    update's hyperparameters (index s: the groups used by the update after s updates)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    model, optimizer = build(sched, opt)
    scheduler = SCHEDULERS[sched](optimizer)
    step = make_step(model, optimizer, scheduler, sched, 0)
    torch.manual_seed(1)
    used = []
    for s in range(TOTAL):
        if s in save_at:
            with torch.no_grad():
                loss = float(_loss(model, LOSS_BATCH))
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "step": s, "loss": loss,
                        "config": {"sched": sched, "opt": opt}}, run_dir / f"ckpt_{s:06d}.pt")
        used.append(copy.deepcopy(hyper(optimizer)))
        step(draw_batch())
    return used


@functools.lru_cache(maxsize=None)
def schedule(sched: str, opt: str) -> Tuple[Tuple[float, ...], ...]:
    """The uninterrupted run's LR per group for each step 0..TOTAL-1 (no training: the scheduler alone)."""
    model, optimizer = build(sched, opt)
    scheduler = SCHEDULERS[sched](optimizer)
    out = []
    for s in range(TOTAL):
        out.append(tuple(float(g["lr"]) for g in optimizer.param_groups))
        if not per_epoch(sched) or (s + 1) % EPOCH == 0:
            optimizer.step()
            scheduler.step()
    return tuple(out)


def _restore(path: str, device: str, how: str):
    from ckptaudit.drill import SimpleRestored

    ck = torch.load(path, map_location="cpu", weights_only=True)
    sched, opt = ck["config"]["sched"], ck["config"]["opt"]
    model, optimizer = build(sched, opt)
    scheduler = None if how == "built_after" else SCHEDULERS[sched](optimizer)
    model.load_state_dict(ck["model"])
    optimizer.load_state_dict(ck["optimizer"])
    if how == "built_after":  # the constructor writes the group LRs the optimizer just loaded
        scheduler = SCHEDULERS[sched](optimizer)
    if how != "fresh":
        scheduler.load_state_dict(ck["scheduler"])
    if how == "config_lr":  # "lr from the config wins": set after loading
        for g in optimizer.param_groups:
            g["lr"] = CONFIG_LR
    table = schedule(sched, opt)  # (seeds torch to build its model: before the RNG is restored)
    torch.set_rng_state(ck["rng"])
    step = int(ck["step"])

    def lr_at(s: int):
        return list(table[s])  # IndexError past the run's end: the schedule ends there

    def batches():
        while True:
            yield draw_batch()

    def eval_loss(batch):
        with torch.no_grad():
            return float(_loss(model, batch))

    saved = dict(ck, loss_source="loss on LOSS_BATCH at save time")
    return SimpleRestored(model=model, optimizer=optimizer, scheduler=scheduler, scaler=None, step=step, saved=saved,
                          loss_batch=LOSS_BATCH, batches=batches(),
                          train_step=make_step(model, optimizer, scheduler, sched, step), eval_loss=eval_loss,
                          deterministic=True, lr_at=lr_at)


def restore_faithful(path, device):
    return _restore(path, device, "faithful")


def restore_fresh(path, device):
    return _restore(path, device, "fresh")


def restore_built_after(path, device):
    return _restore(path, device, "built_after")


def restore_config_lr(path, device):
    return _restore(path, device, "config_lr")


def resumed_run(path: str, how: str) -> Tuple[List[List[dict]], dict]:
    """What the job does resumed through hook ``how``: every update's hyperparameters from the unit's step to the
    end of the run, and the scheduler's state as the hook handed it over."""
    r = _restore(path, "cpu", how)
    state = copy.deepcopy(r.scheduler.state_dict())
    used = []
    for _ in range(r.step, TOTAL):
        used.append(copy.deepcopy(hyper(r.optimizer)))
        r.train_step(next(r.batches))
    return used, state
