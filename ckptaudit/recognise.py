"""Structural recognition: find training-state components in a pruned tree by their shape.

A component is what it looks like, wherever it is stored and whatever its key
is called.  The shapes come from the code that writes them:

* optimizer state_dict — ``torch.optim.Optimizer.state_dict()`` (torch/optim/optimizer.py):
  ``{"state": {param_id: {...}}, "param_groups": [{"params": [ids], "lr": ..., ...}]}``;
  DCP flattens it to ``state.<fqn>.<leaf>`` / ``param_groups.<fqn>.<leaf>`` keys
  (torch/distributed/checkpoint/state_dict.py ``_flatten_optim_state_dict``; torchtitan's too), or state
  name first, ``state.<leaf>.<fqn>`` (Megatron-Core): the order is read from the shape
  (:func:`flat_state_table`), and such per-parameter moments alone are an optimizer state too;
* ZeRO optimizer wrapper — DeepSpeed ``DeepSpeedZeroOptimizer.state_dict()``
  (deepspeed/runtime/zero/stage_1_and_2.py): ``base_optimizer_state`` plus
  ``partition_count`` / ``zero_stage``; stage 3 keeps ``fp32_flat_groups``;
* LR scheduler — ``torch.optim.lr_scheduler.LRScheduler.state_dict()``: its ``__dict__``
  less the optimizer (``last_epoch``, ``base_lrs``, ``_step_count``, ``_last_lr``), or its
  ``last_epoch`` alone (torchtitan 0.3.0 ``lr_scheduler.py`` :226-231);
  Megatron's ``OptimizerParamScheduler`` (``num_steps``, ``max_lr``, ``warmup_steps``);
* gradient scaler — ``torch.amp.GradScaler.state_dict()`` (``scale``, ``growth_factor``,
  ``backoff_factor``, ``growth_interval``, ``_growth_tracker``); DeepSpeed's ``LossScaler``;
* RNG state — ``torch.get_rng_state()`` (a uint8 tensor of 5056 bytes: the CPU
  mt19937 generator), ``torch.cuda.get_rng_state()`` (uint8, 16 bytes),
  ``random.getstate()`` (``(3, <625 ints>, None)``), ``numpy.random.get_state()``
  (``("MT19937", <624 uint32>, pos, has_gauss, cached)``); a mapping of two or more of
  these with only scalars beside them is one RNG bundle (accelerate's
  ``random_states_<rank>.pkl``, the Trainer's ``rng_state.pth``): its scalars belong to the
  RNG state — accelerate's ``"step"`` there is ``Accelerator.step``, the gradient-accumulation
  counter that only ``accumulate()`` advances and the end of each dataloader resets
  (accelerate 1.15 ``checkpointing.py`` ``save_accelerator_state``, ``accelerator.py``
  ``_do_sync``), not the training step;
* model weights — a mapping whose values are mostly tensors, outside every
  component above; an EMA copy has the same keys and shapes as the weights; a mapping holding
  tensors beside components is weights by those tensors alone (:func:`beside_tensors`);
* a whole ``torch.nn.Module`` pickled as an object (``torch.save(model)``, ultralytics' ``"model"``): an
  instance whose state holds the ``_parameters``, ``_buffers`` and ``_modules`` dicts that
  ``Module.__init__`` sets and ``Module.__getstate__`` returns (torch/nn/modules/module.py); it is the
  weights, its tensors named by their path through those dicts.

Tree conventions (:func:`ckptaudit.layouts.base.prune`): tensors are
``{"__tensor__": dtype, "shape": [...], "value": v?}``, instances
``{"__instance__": "module.Name", "args", "state", "items"}``, long numeric
lists ``{"__list__": n}``.  Paths are returned in the dotted form that the
scan's tensor rows use (dict key, list index, instance state key), so a
component's path is also the prefix of its tensors' names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

__all__ = ["Node", "Found", "find", "is_tensor", "is_module", "module_classes", "children", "unflatten_optimizer",
           "flat_state_table", "beside_tensors"]

SCHEDULER_FIELDS = {"base_lrs", "_step_count", "_last_lr", "_get_lr_called_within_step", "lr_lambdas",
                    "T_max", "eta_min", "step_size", "gamma", "milestones", "total_steps", "_schedulers"}
#: OptimizerParamScheduler.state_dict() fields (Megatron-LM megatron/core/optimizer_param_scheduler.py; 0.16.1: lr_…)
PARAM_SCHEDULER_FIELDS = {"num_steps", "max_lr", "warmup_steps"}
PARAM_SCHEDULER_FIELDS_CORE = {"num_steps", "max_lr", "lr_warmup_steps"}
SCALER_FIELDS = {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
TORCH_CPU_RNG_BYTES = 5056  # torch/csrc/CPUGeneratorImpl.cpp: sizeof(CPUGeneratorImplState)
TORCH_CUDA_RNG_BYTES = 16  # seed + offset (CUDAGeneratorImpl get_state)
MAX_NODES = 200_000


def is_tensor(x: Any) -> bool:
    return isinstance(x, dict) and "__tensor__" in x


def _state_dict_of(inst: dict) -> Optional[dict]:
    st = inst.get("state")
    if isinstance(st, list) and len(st) == 2 and isinstance(st[0], dict):
        st = st[0]
    return st if isinstance(st, dict) else None


def _object_children(x: dict) -> Iterator[Tuple[str, Any]]:
    """(name, child) pairs of an object node: its arguments, its state's fields, its items."""
    for i, a in enumerate(x.get("args") or []):
        yield f"<arg{i}>", a
    st = _state_dict_of(x)
    if st is not None:
        yield from st.items()
    items = x.get("items")
    if isinstance(items, dict):
        yield from items.items()
    elif isinstance(items, list):
        yield from ((str(i), v) for i, v in enumerate(items))


def children(x: Any) -> Iterator[Tuple[str, Any]]:
    """(name, child) pairs of a tree node, named as the scan names tensors."""
    if isinstance(x, dict):
        if "__tensor__" in x or "__list__" in x or "__bytes__" in x or "__global__" in x:
            return
        if "__instance__" in x or "__call__" in x:
            yield from _object_children(x)
            return
        for k, v in x.items():
            if k != "__truncated__":
                yield str(k), v
    elif isinstance(x, list):
        yield from ((str(i), v) for i, v in enumerate(x))


def _fields(x: Any) -> Optional[dict]:
    """The key → value view of a mapping-like node (dict or instance state)."""
    if isinstance(x, dict) and "__tensor__" not in x:
        if "__instance__" in x:
            return _state_dict_of(x) or (x.get("items") if isinstance(x.get("items"), dict) else None)
        return x
    return None


def is_optimizer(x: Any) -> bool:
    d = _fields(x)
    if not d:
        return False
    groups = d.get("param_groups")
    # each group lists its params, or not at all (Megatron-Core: LocalNonpersistentObject, its optimizer.py:147-149)
    return isinstance(d.get("state"), dict) and isinstance(groups, list) and all(
        isinstance(g, dict) and ("params" in g or "lr" in g) for g in groups)


def is_flat_optimizer(x: Any) -> bool:
    """A flattened optimizer state_dict: ``state.…`` and ``param_groups.…`` keys only, or per-parameter
    moments alone (``state.…`` keys only) whose keys split into a table of parameters by state names in which
    every parameter has the same two or more state names and its moments one shape (:func:`flat_state_table`)."""
    d = _fields(x)
    if not d or "state" in d:
        return False
    keys = [k for k in d if k != "__truncated__"]
    if any(k.startswith("param_groups.") for k in keys) and all(k.startswith(("state.", "param_groups.")) for k in keys):
        return True
    if len(keys) < 2 or not all(k.startswith("state.") for k in keys):
        return False
    table = flat_state_table(d)  # moments alone: >= 2 parameters, each with the same >= 2 state names, one shape
    return bool(table) and len(table[0]) >= 2 and table[1] and table[2] and len(next(iter(table[0].values()))) >= 2


def flat_state_table(d: dict, params=()) -> Optional[Tuple[Dict[str, Dict[str, str]], bool, bool]]:
    """``({parameter: {state name: flat key}}, rectangular, same shapes)`` of a flat optimizer mapping's
    ``state.…`` keys (None: it has none).  A key is ``state.<fqn>.<name>`` (torch's
    ``_flatten_optim_state_dict``, torchtitan 0.3.0 ``components/optimizer/utils.py`` :77-96) or
    ``state.<name>.<fqn>`` (Megatron-Core 0.16.1 ``optimizer/distrib_optimizer.py`` :1745).  Of the two splits
    the one kept has, in order: more parameters in ``params`` (the unit's weight names); every parameter's
    tensor moments at one shape (``exp_avg``, ``exp_avg_sq`` have the parameter's, ``step`` is a scalar; the
    wrong split puts a weight and a bias, or two modules, under one name); the same state names for every
    parameter (``rectangular``); the parameter-first order on a tie."""
    rests = [k[len("state."):] for k in d if isinstance(k, str) and k.startswith("state.") and "." in k[6:]]
    if not rests:
        return None
    best = None
    for rank, split in ((1, lambda r: r.rpartition(".")[::2]), (0, lambda r: r.partition(".")[::-2])):
        table: Dict[str, Dict[str, str]] = {}
        for r in rests:
            fqn, leaf = split(r)
            table.setdefault(fqn, {})[leaf] = "state." + r
        same = sum(len({tuple(v["shape"]) for leaf, k in t.items() if is_tensor(v := d[k])
                        and isinstance(v.get("shape"), list) and v["shape"]}) <= 1 for t in table.values())
        rect = len({frozenset(t) for t in table.values()}) == 1
        score = (sum(f in params for f in table), same == len(table), rect, rank)
        if best is None or score > best[0]:
            best = (score, table, rect, same == len(table))
    return best[1], best[2], best[3]


def unflatten_optimizer(d: dict, params=()) -> dict:
    """A flattened optimizer state_dict as a nested one.

    Two flat forms exist: a plain flatten of ``Optimizer.state_dict()``
    (``param_groups.<index>.<leaf>``, with a ``params`` leaf) and the per-parameter
    form of ``torch.distributed.checkpoint.state_dict.get_state_dict``
    (``state.<fqn>.<leaf>``, ``param_groups.<fqn>.<leaf>``, no ``params``; each fqn is one
    parameter of the group with its hyper-parameters).  The per-parameter state may come state
    name first (:func:`flat_state_table`, which ``params``, the unit's weight names, helps decide).
    """
    groups: Dict[str, dict] = {}
    by_index = any(k.startswith("param_groups.") and k.endswith(".params") for k in d)
    table = flat_state_table(d, params)
    state = {fqn: {leaf: d[k] for leaf, k in leaves.items()} for fqn, leaves in (table[0] if table else {}).items()}
    for k, v in d.items():
        if k.startswith("param_groups."):
            rest = k[len("param_groups."):]
            gid, _, leaf = rest.partition(".") if by_index else rest.rpartition(".")
            groups.setdefault(gid, {})[leaf] = v
    if by_index:
        return {"state": state, "param_groups": [groups[g] for g in sorted(groups)]}
    merged: Dict[str, dict] = {}
    for fqn, g in groups.items():
        key = repr(sorted((k, repr(v)) for k, v in g.items() if k != "params"))
        merged.setdefault(key, {**g, "params": []})["params"].append(fqn)
    return {"state": state, "param_groups": list(merged.values())}


def is_zero_wrapper(x: Any) -> bool:
    d = _fields(x)
    return bool(d) and ("partition_count" in d or "zero_stage" in d) and (
        "base_optimizer_state" in d or "optimizer_state_dict" in d or "fp32_flat_groups" in d
        or "single_partition_of_fp32_groups" in d)


def is_scheduler(x: Any) -> bool:
    d = _fields(x)
    if not d or is_optimizer(x):
        return False
    if "last_epoch" in d and SCHEDULER_FIELDS & set(d):
        return True
    if "last_batch_iteration" in d and all(isinstance(v, (int, float, list, type(None))) for v in d.values()):
        return True  # DeepSpeed lr_schedules (WarmupLR, OneCycle, LRRangeTest) state_dict
    if [k for k in d if k != "__truncated__"] == ["last_epoch"]:
        v = d["last_epoch"]  # the position alone (torchtitan LRSchedulersContainer), or a DCP item not read
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, dict) and "__bytes_item__" in v)
    return PARAM_SCHEDULER_FIELDS <= set(d) or PARAM_SCHEDULER_FIELDS_CORE <= set(d)


def is_scaler(x: Any) -> bool:
    d = _fields(x)
    if isinstance(x, dict) and str(x.get("__instance__", "")).endswith(("LossScaler", "DynamicLossScaler")):
        return True
    return bool(d) and len(SCALER_FIELDS & set(d)) >= 3


def is_rng(x: Any) -> bool:
    if is_tensor(x):
        return x.get("__tensor__") == "uint8" and x.get("shape") in ([TORCH_CPU_RNG_BYTES], [TORCH_CUDA_RNG_BYTES])
    if isinstance(x, list) and len(x) == 3 and x[0] == 3 and x[2] is None and isinstance(x[1], (dict, list)):
        n = x[1].get("__list__") if isinstance(x[1], dict) else len(x[1])
        return n == 625  # random.getstate(): version 3, 624 words + position
    if isinstance(x, list) and len(x) == 5 and x[0] == "MT19937":
        return True
    return False


def is_rng_bundle(x: Any) -> bool:
    """A plain mapping of at least two RNG states (or lists of them: ``get_rng_state_all()``)
    whose other values are all scalars."""
    if not isinstance(x, dict) or any(k in x for k in ("__tensor__", "__instance__", "__call__", "__list__")):
        return False
    n_rng = 0
    for v in x.values():
        if is_rng(v) or (isinstance(v, list) and v and all(is_rng(e) for e in v)):
            n_rng += 1
        elif not (v is None or isinstance(v, (bool, int, float, str))):
            return False
    return n_rng >= 2


def _tensor_share(d: dict) -> Tuple[int, int]:
    vals = [v for k, v in d.items() if k != "__truncated__"]
    return sum(1 for v in vals if is_tensor(v)), len(vals)


def is_weights(x: Any) -> bool:
    """A mapping of parameter names to tensors (at least half of its values are tensors,
    at least one of them a float tensor with elements)."""
    d = _fields(x)
    if not d or is_optimizer(x) or is_scheduler(x) or is_scaler(x):
        return False
    n_t, n = _tensor_share(d)
    if n_t == 0 or n_t < max(1, n // 2):
        return False
    return any(is_tensor(v) and str(v["__tensor__"]).startswith(("float", "bfloat")) and v.get("shape")
               for v in d.values())


MODULE_FIELDS = ("_parameters", "_buffers", "_modules")  # torch/nn/modules/module.py Module.__init__


def is_module(x: Any) -> bool:
    """A whole ``torch.nn.Module`` pickled as an object (its ``__dict__`` as the instance state)."""
    if not (isinstance(x, dict) and "__instance__" in x):
        return False
    st = _state_dict_of(x)
    return st is not None and all(isinstance(st.get(k), dict) for k in MODULE_FIELDS)


def module_classes(x: Any) -> List[str]:
    """The classes of a pickled module (:func:`is_module`) and of every module under it, in tree order."""
    out: List[str] = []
    stack = [x]
    while stack and len(out) < 10_000:
        m = stack.pop()
        if is_module(m):
            out.append(str(m["__instance__"]))
            subs = (_state_dict_of(m) or {}).get("_modules") or {}
            stack.extend(reversed([v for k, v in subs.items() if k != "__truncated__"]))
    return list(dict.fromkeys(out))


@dataclass
class Node:
    """One recognised component: where it is (file key of the tree, dotted path) and the node."""

    kind: str  # optimizer | zero | scheduler | scaler | rng | weights
    file: str
    path: str  # dotted, as tensor names ("" = the file's root)
    node: Any
    key: str = ""  # the last key of the path (its name in the checkpoint)
    #: the keys of the mapping at ``path`` that the component is made of, when it is not all of them (weights
    #: beside components in one mapping: :func:`beside_tensors`); None: everything under ``path``
    keys: Optional[frozenset] = None

    def covers(self, rel: str) -> bool:
        """Whether ``rel`` (a dotted path relative to :attr:`path`) lies inside the component."""
        return self.keys is None or not rel or rel in self.keys or any(
            rel[:i] in self.keys for i, ch in enumerate(rel) if ch == ".")

    @property
    def where(self) -> str:
        return f"{self.file}:{self.path or '(root)'}"


@dataclass
class Found:
    nodes: List[Node] = field(default_factory=list)

    def of(self, kind: str) -> List[Node]:
        return [n for n in self.nodes if n.kind == kind]


def find(tree: Dict[str, Any]) -> Found:
    """Every component in a unit's tree (``{file key: pruned object}``).

    Components do not nest into each other's insides: an optimizer's ``state``
    is not searched for weights, a recognised weights mapping is not searched
    further.  Work is bounded by :data:`MAX_NODES` nodes.
    """
    out = Found()
    budget = [MAX_NODES]
    for fkey, sub in tree.items():
        if isinstance(sub, dict) and "__safetensors__" in sub:
            out.nodes.append(Node("weights", fkey, "", sub["__safetensors__"], "__safetensors__"))
            continue
        _visit(fkey, sub, "", "", out, budget, 0)
    return out


#: the component kinds in the order they are tried (first match wins): (kind, its recognisers)
_KINDS = (
    ("zero", (is_zero_wrapper,)),
    ("optimizer", (is_optimizer, is_flat_optimizer)),
    ("scheduler", (is_scheduler,)),
    ("scaler", (is_scaler,)),
    ("rng", (is_rng, is_rng_bundle)),
    ("weights", (is_weights, is_module)),
)


def _kind(x: Any) -> Optional[str]:
    return next((k for k, tests in _KINDS if any(t(x) for t in tests)), None)


def beside_tensors(x: Any) -> Optional[Tuple[dict, List[str]]]:
    """``(its tensors, the keys of the rest)`` of a plain mapping holding tensors of its own beside at least one
    component (optimizer, ZeRO wrapper, scheduler, scaler, RNG state), else None: a training state with the
    model's entries at its root (torchtitan 0.3.0 ``components/checkpointer/dcp.py`` :692-713
    ``_flattened_model_states_sd``), which taken whole as weights would hide its other components."""
    if not isinstance(x, dict) or any(k in x for k in ("__tensor__", "__instance__", "__call__", "__list__",
                                                           "__bytes__", "__global__", "__safetensors__")):
        return None
    own = {k: v for k, v in x.items() if is_tensor(v) and not is_rng(v)}
    if not own:
        return None
    rest = [k for k in x if k not in own and k != "__truncated__"]
    if not any(is_rng(x[k]) or (isinstance(x[k], (dict, list)) and _kind(x[k]) not in (None, "weights"))
               for k in rest):
        return None
    if "__truncated__" in x:
        own["__truncated__"] = x["__truncated__"]
    return own, rest


def _visit(fkey: str, x: Any, path: str, key: str, out: Found, budget: List[int], depth: int) -> None:
    budget[0] -= 1
    if budget[0] < 0 or depth > 40:
        return
    kind = _kind(x)
    split = beside_tensors(x) if kind in (None, "weights") else None
    if split is not None:
        own, rest = split
        if is_weights(own):
            out.nodes.append(Node("weights", fkey, path, own, key, keys=frozenset(k for k in own if k != "__truncated__")))
        for k in rest:
            v, p = x[k], f"{path}.{k}" if path else k
            if isinstance(v, (dict, list)) and not is_tensor(v):
                _visit(fkey, v, p, k, out, budget, depth + 1)
            elif is_rng(v):
                out.nodes.append(Node("rng", fkey, p, v, k))
        return
    if kind:
        out.nodes.append(Node(kind, fkey, path, x, key))
        if kind != "zero":
            return
    for k, v in children(x):
        if isinstance(v, (dict, list)) and not is_tensor(v):
            _visit(fkey, v, f"{path}.{k}" if path else k, k, out, budget, depth + 1)
        elif is_rng(v):
            out.nodes.append(Node("rng", fkey, f"{path}.{k}" if path else k, v, k))
