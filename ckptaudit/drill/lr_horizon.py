"""The LR schedule past the drill's few continuation steps: far enough to cross its next change.

A step schedule keeps the same LR for many steps, so comparing the LRs of ``drill.steps`` updates with the
hook's ``lr_at(step)`` proves nothing about a scheduler that was rebuilt fresh at step 70 (``StepLR(30)``:
the restored optimizer keeps the saved LR, the fresh scheduler's counter is 0, and the two part only at the
next boundary, where the fresh one decays 20 steps late).  :func:`mismatch` steps the restored scheduler
ahead on its own (``scheduler.step()``, no training), comparing each LR it sets with ``lr_at``, until the
schedule has changed once and one step more (or :data:`MAX_STEPS`, or the schedule's end: ``lr_at`` raising),
then puts back the scheduler's whole state and every key of every param group (OneCycleLR and CyclicLR with
``cycle_momentum`` also set ``momentum`` or ``betas``: torch/optim/lr_scheduler.py, their ``step``), so that
the training the drill does next starts from exactly where the continuation left it.  Only for a scheduler
the continuation stepped once per update (:func:`per_step`: the cadence the simulation assumes); a
per-epoch scheduler is judged by its counters instead (:mod:`.handover`).

What it cannot see: a change past the first one (``MultiStepLR`` rebuilt fresh whose next milestone happens
to fall on the schedule's is caught by the counters, not here), and the LR of a scheduler whose ``step``
depends on training (``ReduceLROnPlateau``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

#: Steps simulated at most when the schedule does not change (a constant tail); past a change, one more.
MAX_STEPS = 100_000


@dataclass(frozen=True)
class Departure:
    """Where the stepped-ahead scheduler left the schedule: at ``step`` the schedule gives ``want`` (one LR per
    group) and the scheduler ``got`` (LRs, or what it raised, as text)."""

    step: int
    want: List[float]
    got: Any


@dataclass(frozen=True)
class Horizon:
    """How far :func:`mismatch` looked: through ``last_step``; ``why`` it stopped there (in words)."""

    last_step: int
    why: str


def per_step(trace: Sequence[dict]) -> bool:
    """Whether the scheduler's counter advanced by one with each continuation update (``scheduler_last_epoch``
    of the trace entries, recorded before each update: :func:`ckptaudit.drill.handover.counter`)."""
    epochs = [e.get("scheduler_last_epoch") for e in trace]
    return len(epochs) >= 2 and all(isinstance(x, int) for x in epochs) and \
        all(b - a == 1 for a, b in zip(epochs, epochs[1:]))


def _same(a: List[float], b: List[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-15) for x, y in zip(a, b))


def _schedule(lr_at: Callable[[int], Sequence[float]], step: int) -> Optional[List[float]]:
    """``lr_at(step)`` as floats; None past the schedule's end (``lr_at`` raised IndexError, KeyError or
    ValueError: the run ends before ``step``)."""
    try:
        return [float(x) for x in lr_at(step)]
    except (IndexError, KeyError, ValueError):
        return None


def mismatch(scheduler: Any, optimizer: Any, lr_at: Callable[[int], Sequence[float]], next_step: int,
             seen: Optional[List[Horizon]] = None) -> Optional[Departure]:
    """The first step from ``next_step`` on where the restored scheduler, stepped ahead alone, departs from
    ``lr_at`` (its LRs differ, or its ``step()`` raises where the schedule goes on); None when it follows it
    through the next change of the schedule (or to the schedule's end).  ``seen``: when given, a
    :class:`Horizon` is appended.  The scheduler's state and every param group's keys are as before when it
    returns (or raises)."""
    groups = optimizer.param_groups
    saved_groups = [copy.deepcopy({k: v for k, v in g.items() if k != "params"}) for g in groups]
    state = copy.deepcopy(scheduler.state_dict())
    note = seen if seen is not None else []
    try:
        first = _schedule(lr_at, next_step)
        if first is None:
            note.append(Horizon(next_step - 1, f"the schedule (lr_at) ends before step {next_step}"))
            return None
        changed_at = None
        for k in range(MAX_STEPS):
            step = next_step + k
            want = first if not k else _schedule(lr_at, step)
            if want is None:
                note.append(Horizon(step - 1, f"to the end of the schedule (lr_at has no step {step})"))
                return None
            got = [float(g["lr"]) for g in groups]
            if not _same(got, want):
                return Departure(step, want, got)
            if changed_at is None and not _same(want, first):
                changed_at = k
            if changed_at is not None and k > changed_at:
                note.append(Horizon(step, f"through its next change (step {next_step + changed_at})"))
                return None
            try:
                scheduler.step()
            except Exception as e:  # noqa: BLE001 - the job would raise here too, where the schedule goes on
                nxt = _schedule(lr_at, step + 1)
                if nxt is None:
                    note.append(Horizon(step, f"to the end of the schedule (step {step})"))
                    return None
                return Departure(step + 1, nxt, f"{type(e).__name__}: {str(e)[:200]}")
        note.append(Horizon(next_step + MAX_STEPS - 1, f"for {MAX_STEPS} steps without a change"))
        return None
    finally:
        scheduler.load_state_dict(state)
        for g, saved in zip(groups, saved_groups):
            g.update(saved)
