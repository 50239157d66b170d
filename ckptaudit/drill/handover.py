"""What the restore hook handed over: its optimizer's group hyperparameters and its scheduler's state, taken
before any check runs, and how they compare with what the unit saved.

The job trains with the objects its resume code built, not with the unit's state: a scheduler built after
``optimizer.load_state_dict`` writes every group's ``lr`` (torch's ``LRScheduler.__init__`` takes an initial
step, ``torch/optim/lr_scheduler.py``, class ``LRScheduler``; its docstring warns of exactly this), a
``g["lr"] = cfg.lr`` after loading overrides the run's schedule, a scheduler rebuilt fresh restarts its counter.
So the drill snapshots the hook's objects *as handed over* (:func:`take`), compares each group's
hyperparameters (:func:`group_differences`) and the scheduler's counters (:func:`state_differences`) with the
unit's, and tests ``optimizer.load_state_dict(saved)`` on a copy (:func:`load_on_copy`) so that the
continuation still runs with what the hook built.

Nothing here imports torch at module level; every function takes the live objects or plain state dicts.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: Group keys that choose how an update is computed (the kernel), not what it computes: a hook may build its
#: optimizer with ``foreach=True`` where the run had the default, and train identically.
IMPLEMENTATION_KEYS = frozenset({"foreach", "fused", "capturable", "differentiable"})

#: Scheduler state entries that are the scheduler's own bookkeeping, not its position in the schedule.
NOT_STATE = frozenset({"_get_lr_called_within_step", "_is_initial", "verbose", "_last_lr", "optimizer"})

#: The entries of a scheduler's state that count steps (torch's ``LRScheduler``: ``last_epoch`` and
#: ``_step_count``; ``CosineAnnealingWarmRestarts``: ``T_cur`` and ``T_i``): named "counter" in messages.
COUNTER_KEYS = ("last_epoch", "_step_count", "T_cur", "T_i")

#: The group keys said first when they differ: what a schedule sets.
LEADING_KEYS = ("lr", "initial_lr", "momentum", "betas")


@dataclass(frozen=True)
class Handover:
    """The hook's optimizer and scheduler as handed over.

    ``groups``: one dict per param group, every key but ``params``, deep-copied.  ``scheduler_state``: a deep
    copy of ``scheduler.state_dict()``, None without a scheduler (or when it cannot give one: ``scheduler_error``
    says why).  ``counter``: :func:`counter` of the scheduler (None without one)."""

    groups: Tuple[Dict[str, Any], ...]
    scheduler_state: Optional[Dict[str, Any]]
    scheduler_error: str
    counter: Optional[int]


def take(optimizer: Any, scheduler: Any) -> Handover:
    """Snapshot ``optimizer``'s groups and ``scheduler``'s state (either may be None) before any check runs."""
    groups = tuple(copy.deepcopy({k: v for k, v in g.items() if k != "params"})
                   for g in getattr(optimizer, "param_groups", None) or ())
    state, err = None, ""
    if scheduler is not None:
        try:
            state = copy.deepcopy(dict(scheduler.state_dict()))
        except Exception as e:  # noqa: BLE001 - a user class without a usable state_dict: said, not fatal
            err = f"{type(scheduler).__name__}.state_dict() raised {type(e).__name__}: {str(e)[:200]}"
    return Handover(groups, state, err, counter(scheduler) if scheduler is not None else None)


def counter(scheduler: Any) -> Optional[int]:
    """How many times ``scheduler`` was stepped, as far as it says: its ``last_epoch``; for a scheduler without
    one (``ChainedScheduler`` keeps its children's only) the first child's (``_schedulers``); else its
    ``_step_count``; None for a class that keeps none of these."""
    le = getattr(scheduler, "last_epoch", None)
    if isinstance(le, int) and not isinstance(le, bool):
        return le
    for child in getattr(scheduler, "_schedulers", None) or ():
        c = counter(child)
        if c is not None:
            return c
    sc = getattr(scheduler, "_step_count", None)
    return sc if isinstance(sc, int) and not isinstance(sc, bool) else None


def group_differences(handed: Sequence[Mapping[str, Any]], saved: Sequence[Mapping[str, Any]]) -> List[str]:
    """``group i 'key': hook's value vs unit's`` for each hyperparameter (every group key but ``params`` and
    :data:`IMPLEMENTATION_KEYS`, present in both) that differs; floats equal within 1e-9 relative.  A key in
    only one of the two is not compared (another torch version adds or drops defaults)."""
    out = []
    for i, (h, s) in enumerate(zip(handed, saved)):
        for k in sorted(set(h) & set(s) - {"params"} - IMPLEMENTATION_KEYS, key=lambda k: _first(k, LEADING_KEYS)):
            if not _close(h[k], s[k]):
                out.append(f"group {i} {k!r}: {_shown(h[k])} (the hook's) vs {_shown(s[k])} (the unit's)")
    return out


def state_differences(handed: Mapping[str, Any], saved: Mapping[str, Any], where: str = "") -> List[str]:
    """``name: hook's vs unit's`` for each numeric entry of a scheduler's state (counters, ``base_lrs``, ...;
    not :data:`NOT_STATE`) that differs, recursing into the states of ``_schedulers`` (``SequentialLR``,
    ``ChainedScheduler``).  An entry in only one of the two is not compared."""
    out = []
    for k in sorted(set(handed) & set(saved), key=lambda k: _first(k, COUNTER_KEYS)):
        if k in NOT_STATE:
            continue
        h, s = handed[k], saved[k]
        name = f"{where}{k}"
        if k == "_schedulers" and isinstance(h, (list, tuple)) and isinstance(s, (list, tuple)):
            if len(h) != len(s):
                out.append(f"{name}: {len(h)} schedulers (the hook's) vs {len(s)} (the unit's)")
            for i, (a, b) in enumerate(zip(h, s)):
                if isinstance(a, Mapping) and isinstance(b, Mapping):
                    out.extend(state_differences(a, b, f"{name}[{i}]."))
        elif _numeric(h) and _numeric(s) and not _close(h, s):
            out.append(f"{name} {_shown(h)} (the hook's) vs {_shown(s)} (the unit's)")
    return out


def counters_in(state: Mapping[str, Any]) -> bool:
    """Whether a scheduler state holds at least one numeric entry :func:`state_differences` can compare."""
    for k, v in state.items():
        if k in NOT_STATE:
            continue
        if k == "_schedulers" and isinstance(v, (list, tuple)):
            if any(isinstance(c, Mapping) and counters_in(c) for c in v):
                return True
        elif _numeric(v):
            return True
    return False


def load_on_copy(optimizer: Any, saved: Mapping[str, Any]) -> Tuple[str, str]:
    """Call ``load_state_dict(saved)`` on a copy of ``optimizer``: ``("accepted", "")``, ``("refused", torch's
    first line)``, or ``("untried", why)`` when the optimizer cannot be copied (a wrapper holding process
    groups, say).  The copy shares the optimizer's tensors (parameters and state: ``load_state_dict`` replaces
    the copy's state and groups wholesale and writes into no tensor), so it costs no tensor memory and the hook's
    optimizer keeps its own groups and state."""
    import torch

    memo: Dict[int, Any] = {}
    for g in optimizer.param_groups:
        for p in g["params"]:
            memo[id(p)] = p
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor):
                memo[id(v)] = v
    try:
        clone = copy.deepcopy(optimizer, memo)
    except Exception as e:  # noqa: BLE001 - an optimizer that cannot be copied: the load is not tried
        return "untried", (f"the optimizer could not be copied to try load_state_dict "
                           f"({type(e).__name__}: {str(e)[:200]})")
    try:
        clone.load_state_dict(saved)
    except Exception as e:  # noqa: BLE001 - torch's message names the mismatch
        first = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        return "refused", f"optimizer.load_state_dict raised: {first}"
    return "accepted", ""


def _first(key: Any, leading: Sequence[str]) -> tuple:
    """Sort key: the names of ``leading`` first, in its order, then the rest by name."""
    return (leading.index(key), "") if key in leading else (len(leading), str(key))


def _numeric(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(_numeric(x) for x in v)


def _close(a: Any, b: Any) -> bool:
    """Equal, floats within 1e-9 relative, tensors by value, sequences element-wise."""
    if hasattr(a, "item") and getattr(a, "numel", lambda: 0)() == 1:
        a = a.item()
    if hasattr(b, "item") and getattr(b, "numel", lambda: 0)() == 1:
        b = b.item()
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if hasattr(a, "shape") or hasattr(b, "shape"):  # tensors of several elements: by value
        import torch

        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and bool(torch.equal(a.detach().cpu(), b.detach().cpu().to(a.dtype)))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value that cannot say whether it equals another: not equal
        return False


def _shown(v: Any) -> str:
    if hasattr(v, "item") and getattr(v, "numel", lambda: 0)() == 1:
        v = v.item()
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_shown(x) for x in v[:6]) + (", …" if len(v) > 6 else "")
        return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
    return repr(v)
