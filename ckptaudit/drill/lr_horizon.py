"""The LR schedule past the drill's few continuation steps: far enough to cross its next change.

A step schedule keeps the same LR for many steps, so comparing the LRs of ``drill.steps`` updates with the
hook's ``lr_at(step)`` proves nothing about a scheduler that was rebuilt fresh at step 70 (``StepLR(30)``:
the restored optimizer keeps the saved LR, the fresh scheduler's counter is 0, and the two part only at the
next boundary, where the fresh one decays 20 steps late).  :func:`mismatch` steps the restored scheduler
ahead on its own (``scheduler.step()``, no training), comparing each LR it sets with ``lr_at``, until the
schedule has changed once and one step more (or :data:`MAX_STEPS`), then puts the scheduler's state and the
optimizer's LRs back.  Only for a scheduler the continuation stepped once per update (its ``last_epoch``
advanced with each one: the per-step cadence the simulation assumes).
"""

from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

#: Steps simulated at most when the schedule does not change (a constant tail); past a change, one more.
MAX_STEPS = 100_000


def per_step(trace: Sequence[dict]) -> bool:
    """Whether the scheduler's counter advanced by one with each continuation update (``scheduler_last_epoch``
    of the trace entries, recorded before each update)."""
    epochs = [e.get("scheduler_last_epoch") for e in trace]
    return len(epochs) >= 2 and all(isinstance(x, int) for x in epochs) and \
        all(b - a == 1 for a, b in zip(epochs, epochs[1:]))


def _same(a: List[float], b: List[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-15) for x, y in zip(a, b))


def mismatch(scheduler: Any, optimizer: Any, lr_at: Callable[[int], Sequence[float]], next_step: int
             ) -> Optional[Tuple[int, List[float], List[float]]]:
    """``(step, schedule's LR, scheduler's LR)`` at the first step from ``next_step`` on where the restored
    scheduler, stepped ahead alone, departs from ``lr_at``; None when it follows it through the next change
    of the schedule.  The scheduler and the optimizer's LRs are as before when it returns."""
    groups = optimizer.param_groups
    saved_lrs = [g["lr"] for g in groups]
    state = scheduler.state_dict()
    try:
        first = [float(x) for x in lr_at(next_step)]
        changed_at = None
        for k in range(MAX_STEPS):
            step = next_step + k
            want = [float(x) for x in lr_at(step)] if k else first
            got = [float(g["lr"]) for g in groups]
            if not _same(got, want):
                return step, want, got
            if changed_at is None and not _same(want, first):
                changed_at = k
            if changed_at is not None and k > changed_at:
                return None
            scheduler.step()
        return None
    finally:
        scheduler.load_state_dict(state)
        for g, lr in zip(groups, saved_lrs):
            g["lr"] = lr
