"""Which per-parameter state an optimizer keeps, from the hyper-parameters its param_groups carry.

``Optimizer.state_dict()["param_groups"]`` records every constructor argument
of the optimizer (torch/optim/optimizer.py ``state_dict``), so the class can be
told from the key set and whether it needs per-parameter state from the values.
Sources, each optimizer's ``_init_group`` / ``step`` in torch 2.x:

* SGD (``momentum``, ``dampening``, ``nesterov``): a ``momentum_buffer`` only when
  ``momentum != 0``; plain SGD keeps no state at all (torch/optim/sgd.py);
* Adam / AdamW (``betas``, ``eps``, ``amsgrad``): ``step``, ``exp_avg``, ``exp_avg_sq``
  (+ ``max_exp_avg_sq`` with amsgrad), created at the first step;
* Adamax (``betas`` without ``amsgrad``): ``exp_avg``, ``exp_inf``; NAdam
  (``momentum_decay``): ``mu_product`` too; RAdam (``betas`` and ``decoupled_weight_decay``
  without ``amsgrad``);
* Adagrad (``lr_decay``, ``initial_accumulator_value``): ``sum`` and ``step`` from construction;
* RMSprop (``alpha``, ``centered``): ``square_avg``; Adadelta (``rho``): ``square_avg``, ``acc_delta``;
* Adafactor (transformers.optimization; ``scale_parameter``, ``relative_step``): ``step`` and
  factored second moments;
* Lion (lion-pytorch; ``betas`` and ``weight_decay`` only): ``exp_avg``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass(frozen=True)
class OptimizerNeeds:
    name: str  # the class it is recognised as ("AdamW", "SGD", "unknown")
    needs_state: Optional[bool]  # True: a step leaves per-parameter state; None: cannot tell
    why: str


def _get(groups: List[dict], key: str) -> Any:
    for g in groups:
        if isinstance(g, dict) and key in g:
            return g[key]
    return None


def recognise(param_groups: Any) -> OptimizerNeeds:
    """The optimizer class and its state needs from saved ``param_groups`` (a list of dicts)."""
    groups = [g for g in (param_groups or []) if isinstance(g, dict)]
    keys = set().union(*(g.keys() for g in groups)) if groups else set()
    if not keys:
        return OptimizerNeeds("unknown", None, "no param_groups were saved")
    if {"momentum", "dampening", "nesterov"} <= keys:
        moms = [g.get("momentum") for g in groups]
        if all(isinstance(m, (int, float)) and m == 0 for m in moms):
            return OptimizerNeeds("SGD", False, "SGD with momentum 0 keeps no per-parameter state")
        return OptimizerNeeds("SGD", True, "SGD with momentum keeps a momentum_buffer per parameter")
    if {"scale_parameter", "relative_step"} & keys:
        return OptimizerNeeds("Adafactor", True, "Adafactor keeps a step and second moments per parameter")
    if {"lr_decay", "initial_accumulator_value"} <= keys:
        return OptimizerNeeds("Adagrad", True, "Adagrad keeps a sum and step per parameter")
    if {"alpha", "centered"} <= keys:
        return OptimizerNeeds("RMSprop", True, "RMSprop keeps square_avg per parameter")
    if "rho" in keys and "betas" not in keys:
        return OptimizerNeeds("Adadelta", True, "Adadelta keeps square_avg and acc_delta per parameter")
    if "betas" in keys:
        return _with_betas(groups, keys)
    return OptimizerNeeds("unknown", None, f"param_groups keys {sorted(keys)} match no known optimizer")


def _with_betas(groups: List[dict], keys: set) -> OptimizerNeeds:
    """An optimizer whose param groups hold ``betas``: Adam or AdamW (``amsgrad``), NAdam, Lion (no ``eps``),
    else Adam-like."""
    if "amsgrad" in keys:
        name = "AdamW" if _get(groups, "decoupled_weight_decay") or (_get(groups, "weight_decay") or 0) >= 0.01 \
            else "Adam"
        return OptimizerNeeds(name, True, f"{name} keeps step, exp_avg and exp_avg_sq per parameter")
    if "momentum_decay" in keys:
        return OptimizerNeeds("NAdam", True, "NAdam keeps step, exp_avg and exp_avg_sq per parameter")
    if "eps" not in keys:
        return OptimizerNeeds("Lion", True, "Lion keeps exp_avg per parameter")
    return OptimizerNeeds("Adam-like", True, "an Adam-family optimizer keeps moments per parameter")
