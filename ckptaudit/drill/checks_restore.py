"""The drill's checks of the restored state: model, optimizer, moments, step, RNG, sampler, loss scale."""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple


def as_float(x: Any) -> float:
    """A tensor's or number's value as a float."""
    return float(x.item()) if hasattr(x, "item") else float(x)


def same_values(a: Any, b: Any, where: str = "") -> Optional[str]:
    """None when ``a`` and ``b`` are equal (tensors by value, containers element-wise), else where they differ."""
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return _same_tensor(a, b, where)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return None if np.array_equal(np.asarray(a), np.asarray(b)) else f"{where or 'array'}: values differ"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return f"{where or 'mapping'}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        return _first_difference((a[k], b[k], f"{where}.{k}" if where else str(k)) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where or 'sequence'}: length {len(a)} vs {len(b)}"
        return _first_difference((x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else f"{where or 'value'}: {a!r} vs {b!r}"


def _same_tensor(a: Any, b: Any, where: str) -> Optional[str]:
    """:func:`same_values` where one side is a tensor: both tensors of one shape and equal values (``b`` cast to
    ``a``'s dtype)."""
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return f"{where or 'value'}: {type(a).__name__} vs {type(b).__name__}"
    a_, b_ = a.detach().cpu(), b.detach().cpu()
    if a_.shape != b_.shape:
        return f"{where or 'tensor'}: shape {tuple(a_.shape)} vs {tuple(b_.shape)}"
    if a_.dtype != b_.dtype:
        b_ = b_.to(a_.dtype)
    return None if torch.equal(a_, b_) else f"{where or 'tensor'}: values differ"


def _first_difference(pairs) -> Optional[str]:
    """The first difference :func:`same_values` finds over ``(a, b, where)`` triples, in order; None if none."""
    for x, y, where in pairs:
        d = same_values(x, y, where)
        if d:
            return d
    return None


def quoted(keys: Sequence[str], n: int = 6) -> str:
    """Up to ``n`` of ``keys``, sorted and quoted, and how many more there are."""
    ks = sorted(keys)
    s = ", ".join(repr(k) for k in ks[:n])
    return s + (f" … (+{len(ks) - n})" if len(ks) > n else "")


def _misshapen_moments(params, sst: Mapping) -> List[str]:
    """``name.key (shape) vs parameter (shape)`` for each saved per-parameter tensor (``sst``: the optimizer
    state_dict's ``state``, by parameter index) whose shape is not its parameter's."""
    bad = []
    for i, (name, p) in enumerate(params):
        for k, v in (sst.get(i) or {}).items():
            if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0 and tuple(v.shape) != tuple(p.shape):
                bad.append(f"{name}.{k} {tuple(v.shape)} vs parameter {tuple(p.shape)}")
    return bad


def _moment_facts(torch, params, state: Mapping, step: int) -> Tuple[List[str], List[str], List[str], int]:
    """``(no_state, all_zero, nonfinite, n_with)`` over the live optimizer's ``state`` (parameter -> dict):
    parameters without state, parameters whose moments (float tensors of the parameter's shape) are all zero
    at a ``step`` after 0, ``name.key`` of non-finite moments, and how many parameters have moments."""
    no_state, zero, nonfinite, n_with = [], [], [], 0
    for name, p in params:
        st = state.get(p)
        if not st:
            no_state.append(name)
            continue
        moments = {k: v for k, v in st.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
                   and tuple(v.shape) == tuple(p.shape) and v.numel() > 0}
        if not moments:
            continue
        n_with += 1
        nonfinite.extend(f"{name}.{k}" for k, v in moments.items() if not bool(torch.isfinite(v).all()))
        if step > 0 and all(int(torch.count_nonzero(v)) == 0 for v in moments.values()):
            zero.append(name)
    return no_state, zero, nonfinite, n_with


class RestoreChecks:
    """Checks of what the hook restored (mixed into the child's :class:`~ckptaudit.drill.child._Child`).

    Each returns (status, expected, actual, message); they read ``self.r`` (the Restored), ``self.spec``,
    ``self.torch`` and ``self.rng_at_restore``."""

    r: Any
    spec: Mapping[str, Any]
    torch: Any
    rng_at_restore: Any

    def _params(self) -> List[Tuple[str, Any]]:
        names = {id(p): n for n, p in self.r.model.named_parameters()}
        return [(names.get(id(p), f"param[{i}]"), p)
                for i, p in enumerate(p for g in self.r.optimizer.param_groups for p in g["params"])]

    def c_model(self):
        saved = self.r.saved.get("model")
        if saved is None:
            return "fail", "a model state_dict in the unit", "none", "the unit holds no model state_dict"
        cur = self.r.model.state_dict()
        missing = sorted(set(cur) - set(saved))
        unexpected = sorted(set(saved) - set(cur))
        common = [k for k in cur if k in saved]
        shape = [k for k in common if tuple(cur[k].shape) != tuple(saved[k].shape)]
        differ = [k for k in common if k not in shape and same_values(cur[k], saved[k]) is not None]
        problems = []
        if missing:
            problems.append(f"{len(missing)} key(s) the model has but the unit lacks: {quoted(missing)}")
        if unexpected:
            problems.append(f"{len(unexpected)} key(s) in the unit the model does not have: {quoted(unexpected)}")
        if shape:
            problems.append("shape differs for " + ", ".join(
                f"{k!r} (model {tuple(cur[k].shape)}, unit {tuple(saved[k].shape)})" for k in shape[:4]))
        if differ:
            problems.append(f"the hook's restored values differ from the unit's for {quoted(differ)}")
        if not problems:  # equal values: the strict load changes nothing the continuation trains with
            try:
                self.r.model.load_state_dict(saved, strict=True)
            except Exception as e:  # noqa: BLE001 - strict load's own message names the keys
                problems.append(f"load_state_dict(strict=True) raised: {str(e).splitlines()[0][:300]}")
        exp = f"{len(saved)} tensors: same keys, shapes and values; strict load accepted"
        if problems:
            return "fail", exp, f"{len(cur)} tensors in the model", "; ".join(problems)
        return "pass", exp, f"{len(cur)} tensors equal", "model restored exactly; strict load_state_dict accepted it"

    def c_optimizer(self):
        """The optimizer as handed over against the unit's: parameters per group, every group's hyperparameters
        (lr, initial_lr, betas, momentum, weight_decay, eps, ...: :func:`.handover.group_differences`), the
        per-parameter state, moment shapes, and ``load_state_dict(saved)`` tried on a copy
        (:func:`.handover.load_on_copy`), so that the hook's own optimizer is what the continuation trains."""
        from . import handover

        saved = self.r.saved.get("optimizer")
        if saved is None:
            return ("fail", "an optimizer state_dict in the unit", "none",
                    "the unit holds no optimizer state: a resume restarts the optimizer (moments lost)")
        cur = self.r.optimizer.state_dict()
        problems = []
        sg, cg = saved.get("param_groups", []), cur.get("param_groups", [])
        if [len(g["params"]) for g in sg] != [len(g["params"]) for g in cg]:
            problems.append(f"param groups hold {[len(g['params']) for g in cg]} parameters in the optimizer but "
                            f"{[len(g['params']) for g in sg]} in the unit")
        handed = self.handed.groups if getattr(self, "handed", None) is not None else cg
        hyper = handover.group_differences(handed, sg)
        if hyper:
            problems.append("the job would train with other hyperparameters than the unit saved: "
                            + "; ".join(hyper[:4]) + (f" … (+{len(hyper) - 4})" if len(hyper) > 4 else "")
                            + " (a scheduler built after optimizer.load_state_dict, or a config value set after "
                              "loading, overrides the restored groups)")
        sst, cst = saved.get("state", {}), cur.get("state", {})
        if set(sst) != set(cst):
            problems.append(f"the hook's optimizer has state for {len(cst)} parameters, the unit for {len(sst)}")
        else:
            diff = next((d for k in sst for d in [same_values(cst[k], sst[k], f"state[{k}]")] if d), None)
            if diff:
                problems.append(f"the hook's restored optimizer state differs from the unit's ({diff})")
        bad_shape = _misshapen_moments(self._params(), sst)
        if bad_shape:
            problems.append("moments do not match their parameters: " + "; ".join(bad_shape[:4]))
        loaded, why = handover.load_on_copy(self.r.optimizer, saved)
        if loaded == "refused":
            problems.append(why)
        exp = (f"{len(sg)} param group(s) with the unit's hyperparameters, state for {len(sst)} parameters, equal "
               "to the hook's")
        if problems:
            return "fail", exp, f"{len(cg)} group(s), state for {len(cst)} parameters", "; ".join(problems)
        if loaded == "untried":
            return "pass", exp, "equal", f"optimizer restored exactly (groups and state); {why}"
        return "pass", exp, "equal", "optimizer restored exactly (groups and state); load_state_dict accepted it"

    def c_moments(self):
        step = int(self.r.step)
        no_state, zero, nonfinite, n_with = _moment_facts(self.torch, self._params(), self.r.optimizer.state, step)
        n = len(self._params())
        exp = f"moments for {n} parameters, finite, not all zero at step {step}"
        if step > 0 and no_state:
            return ("fail", exp, f"no state for {len(no_state)} of {n}",
                    f"at step {step} the optimizer has no moments for {len(no_state)} of {n} parameters "
                    f"({quoted(no_state, 4)}): they restart from zero (expect a loss spike)")
        if nonfinite:
            return "fail", exp, f"{len(nonfinite)} non-finite", f"non-finite optimizer moments: {quoted(nonfinite, 4)}"
        if zero:
            return ("fail", exp, f"all-zero moments for {len(zero)} of {n_with} parameters",
                    f"at step {step} every moment of {len(zero)} of {n_with} parameters is exactly zero "
                    f"({quoted(zero, 4)}): the optimizer state was reset or zeroed, so the resume is not "
                    "faithful (only a parameter that never received a gradient may legitimately look like this)")
        if n_with == 0:
            return "skip", exp, "no moment tensors", "the optimizer keeps no per-parameter moments (e.g. plain SGD)"
        return "pass", exp, f"{n_with} parameters with finite, non-zero moments", "optimizer moments present"

    def c_step(self):
        torch = self.torch
        step, want = int(self.r.step), self.spec.get("unit_step")
        opt_steps = set()
        for _, p in self._params():
            s = (self.r.optimizer.state.get(p) or {}).get("step")
            if s is not None:
                opt_steps.add(as_float(s) if isinstance(s, torch.Tensor) else float(s))
        exp = f"step {want}" if want is not None else "the unit's step"
        actual = f"step {step}" + (f"; optimizer per-parameter step {sorted(opt_steps)}" if opt_steps else "")
        if want is not None and step != int(want):
            return ("fail", exp, actual, f"the restored loop would continue from step {step}, but the unit was "
                    f"saved at step {want}: step counting (and everything keyed on it) restarts or jumps")
        if opt_steps and opt_steps != {float(step)}:
            return ("warn", exp, actual, f"the optimizer's per-parameter step {sorted(opt_steps)} differs from the "
                    f"global step {step} (gradient accumulation, skipped steps, or a reset optimizer)")
        if want is None:
            return "warn", exp, actual, "the audit found no step for this unit; nothing to compare with"
        return "pass", exp, actual, f"continues from step {step}"

    def c_rng(self):
        saved = self.r.saved.get("rng")
        if saved is None:
            return ("warn", "the saved RNG state", "none",
                    "the unit holds no RNG state: the continuation is not bit-exact and the data order may repeat")
        cur = self.rng_at_restore
        if not isinstance(saved, Mapping):
            saved = {"torch": saved}
        if not isinstance(cur, Mapping):
            cur = {"torch": cur}
        common = [k for k in saved if k in cur]
        if not common:
            return ("warn", f"components {sorted(saved)}", f"components {sorted(cur)}",
                    "no RNG component of the unit could be compared with the live state")
        for k in common:
            d = same_values(cur[k], saved[k], k)
            if d:
                return ("fail", f"live RNG == saved for {common}", f"{k} differs",
                        f"the RNG state after restore differs from the saved one ({d}): the hook did not restore it, "
                        "or something drew random numbers after restoring; the data order and dropout masks diverge")
        skipped = sorted(set(saved) - set(common))
        note = f"; not compared: {skipped} (give the hook an rng_state())" if skipped else ""
        return "pass", f"live RNG == saved for {common}", "equal", f"RNG stream continues from the saved state{note}"

    def c_sampler(self):
        fn = getattr(self.r, "sampler_state", None)
        if not callable(fn):
            return ("skip", "", "", "the hook exposes no data sampler (sampler_state); the data order is checked "
                    "through the RNG stream only")
        saved = self.r.saved.get("sampler")
        if saved is None:
            return "warn", "the saved sampler state", "none", "the unit holds no sampler state: the data order restarts"
        d = same_values(fn(), saved, "sampler")
        if d:
            return "fail", "sampler == saved", d, f"the data sampler does not resume where it left off ({d})"
        return "pass", "sampler == saved", "equal", "the data sampler resumes where it left off"

    def c_scaler(self):
        sc, saved = self.r.scaler, self.r.saved.get("scaler")
        if sc is None and saved is None:
            return "skip", "", "", "no GradScaler (no fp16 loss scaling) in the run"
        if sc is None:
            return ("fail", f"loss scale {saved.get('scale')}", "no scaler",
                    "the unit holds GradScaler state but the restored job has no scaler")
        if saved is None:
            return ("warn", "the saved GradScaler state", "none",
                    f"the unit holds no GradScaler state: the loss scale restarts at {as_float(sc.get_scale())} and the "
                    "first steps may be skipped for overflow")
        cur = sc.state_dict()
        keys = [k for k in ("scale", "growth_tracker") if k in saved]
        d = next((x for k in keys for x in [same_values(cur.get(k), saved.get(k), k)] if x), None)
        if d:
            return "fail", f"{ {k: saved.get(k) for k in keys} }", f"{ {k: cur.get(k) for k in keys} }", \
                f"the loss scale does not continue from the saved value ({d})"
        return "pass", f"scale {saved.get('scale')}", f"scale {cur.get('scale')}", "loss scale continues"
