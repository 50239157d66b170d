"""Which training-state components a unit holds: recognised by structure, placed by contract.

:func:`collect` finds every component of a unit's scan tree by its shape
(:mod:`ckptaudit.recognise`): optimizer state_dicts, schedulers, scalers, RNG
state and the model weights, wherever they are stored and whatever their key
is called.  When a producer contract (:mod:`ckptaudit.producers`) matches, it
names the producer, picks the weights and step among candidates by the
producer's own paths, and says which components the producer never writes;
the structural result stands on its own when contracts are off.

Everything works on the *pruned tree* the scan stored (tensors described as
``{"__tensor__": dtype, "shape": [...], "value": small}``), never on loaded
objects.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import optimizers
from .. import producers
from .. import recognise as R
from .tree_values import (TRUNCATED, group_size, is_cut, is_tensor, lookup, n_entries, scalar,  # noqa: F401 - re-exported
                          state_of, tensor_map)

STEP_KEYS = ["global_step", "iter_num", "step", "iteration", "global_steps", "num_updates", "steps", "train_step",
             "total_steps", "curr_step"]
EPOCH_KEYS = ["epoch", "epochs", "current_epoch"]
BEST_KEYS = ["best_val_loss", "best_metric", "best_loss", "best_score", "best_model_score"]
LOSS_KEYS = ["loss", "train_loss", "last_loss"]  # the loss at the save step (a run counter, not a metric)
SAMPLER_KEYS = ["sampler", "sampler_state", "dataloader", "data_loader", "dataloader_state", "data_state", "loops",
                "consumed_samples", "consumed_train_samples", "train_iterator", "data_iter"]
MODEL_ARG_KEYS = ["model_args", "model_config", "hparams", "hyper_parameters", "args", "config", "model_cfg"]
VERSION_KEYS = {"torch_version": "torch", **producers.VERSION_KEYS, "cuda_version": "cuda"}
EMA_RE = re.compile(r"(^|[._])(ema|averaged?|shadow|swa)([._]|$)|^ema|_ema$", re.I)
MAX_SCALAR_DEPTH = 3


@dataclass
class Components:
    """What one unit holds.  Steps count optimizer updates; paths are ``file:dotted.path``."""

    producer: str = ""  # the producer contract that matched ("" = recognised by structure alone)
    weights: Optional[Dict[str, dict]] = None  # name -> tensor desc
    weights_source: str = ""
    weights_at: List[Tuple[str, str]] = field(default_factory=list)  # (file key, dotted prefix) of weight tensors
    weights_cut_at: List[Tuple[str, str]] = field(default_factory=list)  # of weights_at, the pruned ones (weights_rows)
    weights_only_format: bool = False  # safetensors / HF weights without any training state
    optimizer: Optional[dict] = None  # {"state": {...}, "param_groups": [...]} (merged over files)
    optimizer_source: str = ""
    optimizer_at: List[Tuple[str, str]] = field(default_factory=list)  # (file key, dotted prefix of "state")
    optimizer_partitioned: bool = False  # ZeRO: state lives in per-rank partitions
    optimizer_nonempty: Optional[bool] = None
    optimizer_needs: Optional[optimizers.OptimizerNeeds] = None
    scheduler: Optional[dict] = None
    schedulers: List[dict] = field(default_factory=list)
    scheduler_source: str = ""
    scaler: bool = False
    rng: bool = False
    sampler: bool = False
    ema: bool = False
    step: Optional[int] = None
    step_source: str = ""
    step_counts: str = "steps"  # or "epochs": where an epoch-based resume continues (producers.resume_step)
    epoch: Optional[float] = None
    best_metric: Optional[float] = None
    loss: Optional[float] = None
    model_args: Optional[dict] = None
    model_args_source: str = ""
    versions: Dict[str, str] = field(default_factory=dict)
    top_keys: List[str] = field(default_factory=list)
    never_saves: frozenset = frozenset()  # components the producer does not write
    always_saves: frozenset = frozenset()  # components every unit of the producer has (an absence is damage)
    name_number: str = "step"  # what the number in the unit's name counts: "step" | "save_index"
    restores_together: tuple = ()  # (producer key, RestoreRule): what the resume restores only together

    @property
    def optimizer_step(self) -> Optional[float]:
        st = (self.optimizer or {}).get("state")
        vals = [s for v in (st.values() if isinstance(st, dict) else ()) if isinstance(v, dict)
                and (s := scalar(v.get("step"))) is not None]
        return max(vals) if vals else None

    @property
    def group_lrs(self) -> List[float]:
        """The learning rate of each optimizer param group as saved (what the schedule had reached)."""
        out = []
        for g in (self.optimizer or {}).get("param_groups") or []:
            v = scalar(g.get("lr")) if isinstance(g, dict) else None
            if v is None:
                return []
            out.append(float(v))
        return out

    @property
    def scheduled_by_torch(self) -> bool:
        """True when a torch LR scheduler wrapped the optimizer: ``LRScheduler.__init__`` sets
        ``initial_lr`` in every param group, and the optimizer's state_dict keeps it."""
        groups = (self.optimizer or {}).get("param_groups") or []
        return bool(groups) and all(isinstance(g, dict) and scalar(g.get("initial_lr")) is not None for g in groups)

    @property
    def scheduler_last_epoch(self) -> Optional[int]:
        sch = self.scheduler
        if isinstance(sch, dict):
            v = scalar(sch.get("last_epoch"))
            if v is None:
                v = scalar(sch.get("num_steps"))  # Megatron OptimizerParamScheduler
            if v is None:
                v = scalar(sch.get("last_batch_iteration"))  # DeepSpeed lr_schedules
            return int(v) if v is not None else None
        return None


def of_scan_row(scan_row: dict) -> Tuple[Components, Dict[str, Any], Dict[str, Any]]:
    """(components, tree, facts) of a ``scan`` table row: its ``tree_json`` and ``facts_json`` parsed once, for
    the caller and for :func:`collect`.  Nothing is kept between calls: each stage collects the units it judges
    once (in the workflow each stage is its own process, so a cache shared by stages served only the in-process
    audit)."""
    tree = json.loads(scan_row.get("tree_json") or "{}")
    facts = json.loads(scan_row.get("facts_json") or "{}")
    return collect(scan_row.get("layout") or "", tree, facts), tree, facts


def collect(layout: str, tree: Dict[str, Any], facts: Dict[str, Any]) -> Components:
    """Components of a unit from its scan tree (keys are file keys, or ``"root"`` for a file unit)."""
    c = Components()
    tree = {k: v for k, v in (tree or {}).items()}
    contract = producers.identify(layout, list(facts.get("unit_files") or []) + list(tree), tree)
    if contract is not None:
        c.producer, c.never_saves, c.always_saves = contract.producer, contract.never_saves, contract.saves
        c.name_number = contract.name_number
    c.restores_together = tuple((p.key, r) for p in [producers.for_layout(layout)] if p for r in p.restores_together)
    for sub in tree.values():
        if isinstance(sub, dict) and "__safetensors__" not in sub:
            c.top_keys = sorted(set(c.top_keys) | {str(k) for k in sub if not str(k).startswith("__")})
    found = R.find(tree)
    _weights(c, found, contract, facts.get("weights_files") or ())
    _optimizer(c, found, frozenset(c.weights or ()))
    for n in found.of("scheduler"):
        c.schedulers.append(R._fields(n.node) or {})
    if c.schedulers:
        c.scheduler = c.schedulers[0]
        c.scheduler_source = found.of("scheduler")[0].where
    c.scaler = bool(found.of("scaler"))
    c.rng = bool(found.of("rng"))
    _scalars(c, tree, found, contract, facts, layout)
    c.weights_only_format = bool(c.weights) and c.optimizer is None and c.scheduler is None and all(
        n.key == "__safetensors__" for n in found.of("weights") if (n.file, n.path) in c.weights_at)
    return c


# ------------------------------------------------------------------ weights
def _weights(c: Components, found: R.Found, contract, weights_files=()) -> None:
    """The model weights among the candidates (:func:`_chosen_weights`), into ``c``; another candidate with
    the weights' keys and shapes, or an EMA name, marks the unit as holding an EMA."""
    cands = found.of("weights")
    if not cands:
        return
    chosen = _chosen_weights(cands, contract, weights_files)
    c.weights = {}
    for n in chosen:
        c.weights.update(tensor_map(n.node))
        c.weights_at.append((n.file, n.path))
        c.weights_cut_at.extend([(n.file, n.path)] if is_cut(n.node) else [])
    c.weights_source = f"{chosen[0].file}:{chosen[0].path or '(root)'}"
    keys = set(c.weights)
    shapes = {k: v.get("shape") for k, v in c.weights.items()}
    for n in cands:
        if n in chosen:
            continue
        other = tensor_map(n.node)
        if EMA_RE.search(n.key or "") or (set(other) == keys and {k: v.get("shape") for k, v in other.items()} == shapes):
            c.ema = True


def _chosen_weights(cands: List[R.Node], contract, weights_files) -> List[R.Node]:
    """The weights: by the producer's paths, else in the files the unit's manifest declares as weights, else
    the largest plain (non-EMA) group found by structure."""
    want = (contract.keys.get("weights") if contract else None) or ()
    chosen = [n for n in cands if n.path in want] if want else []
    if not chosen and weights_files:
        chosen = [n for n in cands if n.file in weights_files and not EMA_RE.search(n.key or "")]
    if chosen:
        return chosen
    pool = [n for n in cands if not EMA_RE.search(n.key or "")] or cands
    groups: Dict[Any, List[R.Node]] = {}
    for n in pool:
        groups.setdefault(_group_key(n), []).append(n)
    return max(groups.values(), key=lambda g: (sum(_numel(n.node) for n in g), -len(g[0].path)))


def _group_key(n: R.Node):
    if n.path:
        return ("path", n.path)
    base = n.file.rsplit("/", 1)[-1]
    if n.key == "__safetensors__" or re.match(r"(pytorch_)?model([-_.]|$)", base) or n.file == "root":
        return ("model-files",)
    return ("file", n.file)


def _numel(node: Any) -> int:
    total = 0
    for v in tensor_map(node).values():
        k = 1
        for d in v.get("shape") or []:
            k *= int(d) if isinstance(d, int) else 1
        total += k
    return total


# ---------------------------------------------------------------- optimizer
def _optimizer(c: Components, found: R.Found, params: frozenset = frozenset()) -> None:  # params: weight names
    zero_paths = [(n.file, n.path) for n in found.of("zero")]
    for n in found.of("optimizer"):
        d = R._fields(n.node) or {}
        if R.is_flat_optimizer(n.node):
            d = R.unflatten_optimizer(d, params)
        merge_optimizer(c, d, n.where)
        c.optimizer_at.append((n.file, f"{n.path}.state" if n.path else "state"))
        if any(f == n.file and (p == "" or n.path.startswith(p + ".")) for f, p in zero_paths):
            c.optimizer_partitioned = True
    for n in found.of("zero"):  # ZeRO's fp32 master weights: the values a resume continues from
        for key in ("fp32_flat_groups", "single_partition_of_fp32_groups"):
            if key in (R._fields(n.node) or {}):
                c.weights_at.append((n.file, f"{n.path}.{key}" if n.path else key))
    if zero_paths:
        c.optimizer_partitioned = True
        if c.optimizer is None:  # ZeRO-3 wrapper without a nested torch state_dict
            c.optimizer = {"state": {}, "param_groups": []}
            c.optimizer_source = f"{found.of('zero')[0].where}"
            c.optimizer_nonempty = True
    if c.optimizer is not None:
        c.optimizer_needs = optimizers.recognise(c.optimizer.get("param_groups"))


def merge_optimizer(c: Components, opt: dict, source: str) -> None:
    state = opt.get("state")
    groups = opt.get("param_groups")
    if c.optimizer is None:
        c.optimizer = {"state": {}, "param_groups": []}
        c.optimizer_source = source
    if isinstance(state, dict):
        merged = c.optimizer["state"]
        total = n_entries(merged) + n_entries(state)
        for k, v in state.items():
            if k != TRUNCATED:
                merged[f"{len(merged)}:{k}" if k in merged else k] = v
        if TRUNCATED in merged or TRUNCATED in state:  # a pruned state keeps its full count
            merged[TRUNCATED] = total
    if isinstance(groups, list):
        c.optimizer["param_groups"].extend(g for g in groups if isinstance(g, dict))
    c.optimizer_nonempty = bool(c.optimizer["state"]) or bool(c.optimizer_nonempty)


# ------------------------------------------------------------------ scalars
def _inside(found: R.Found, fkey: str, path: str) -> bool:
    """True when ``path`` lies inside a recognised component (its internals are not run counters)."""
    return any(n.file == fkey and n.kind != "zero" and (not n.path or path == n.path or path.startswith(n.path + "."))
               and n.covers(path[len(n.path) + 1:] if n.path else path) for n in found.nodes)


def _search(tree: Dict[str, Any], found: R.Found, keys: List[str], max_depth: int = MAX_SCALAR_DEPTH):
    """(value, where) of the shallowest scalar under one of ``keys`` outside every component."""
    best = None
    for fkey, sub in tree.items():
        todo = [(sub, "", 0)]
        while todo:
            node, path, depth = todo.pop(0)
            for k, v in R.children(node):
                wanted = k in keys and scalar(v) is not None
                deeper = not wanted and isinstance(v, (dict, list)) and not R.is_tensor(v) and depth + 1 < max_depth
                if not (wanted or deeper):  # a leaf of no interest: no need to ask whether a component holds it
                    continue
                p = f"{path}.{k}" if path else k
                if _inside(found, fkey, p):
                    continue
                if wanted:
                    rank = (depth, keys.index(k))
                    if best is None or rank < best[0]:
                        best = (rank, scalar(v), f"{fkey}:{p}")
                else:
                    todo.append((v, p, depth + 1))
    return (best[1], best[2]) if best else (None, "")


def _scalars(c: Components, tree, found, contract, facts, layout) -> None:
    """The unit's step (and where it was read), epoch, best metric, loss, sampler and EMA, into ``c``."""
    c.step, c.step_source = _step(c, tree, found, contract, facts, layout)
    for spec in (contract.epoch_at if contract else ()):
        v, _ = lookup(tree, spec)
        if scalar(v) is not None:
            c.epoch = float(scalar(v))
            break
    if c.epoch is None:
        v, _ = _search(tree, found, EPOCH_KEYS, 2)
        c.epoch = float(v) if v is not None else None
    v, _ = _search(tree, found, BEST_KEYS, 4)
    c.best_metric = float(v) if v is not None else None
    v, _ = _search(tree, found, LOSS_KEYS, 2)
    c.loss = float(v) if v is not None else _logged_loss(tree, c.step)
    c.sampler = any(k in SAMPLER_KEYS for k in c.top_keys) or any(
        fnmatch.fnmatch(f.rsplit("/", 1)[-1], pat) for f in tree for pat in ("sampler*.bin", "dl_state_dict*"))
    if not c.ema:
        c.ema = any(EMA_RE.search(k) for k in c.top_keys)
    _model_args(c, tree)
    _versions(c, tree)


def _step(c: Components, tree, found, contract, facts, layout) -> Tuple[Optional[int], str]:
    """``(step, where it was read)``, first found of: the producer contract's places, the step the producer's
    resume continues at (by layout: :func:`ckptaudit.producers.resume_step`), a step key in the tree,
    the layout's own step (DeepSpeed global_steps, Megatron iteration), a safetensors ``__metadata__`` step,
    the optimizer's own update count; ``(c.step, c.step_source)`` when none has one."""
    for spec in (contract.step_at if contract else ()):
        v, where = lookup(tree, spec)
        if scalar(v) is not None:
            return int(scalar(v)), where
    if (own := producers.resume_step(layout, tree)) is not None:  # an epoch-based resume: where it continues
        c.step_counts = "epochs"
        return own
    v, where = _search(tree, found, STEP_KEYS)
    if v is not None:
        return int(v), where
    if isinstance(facts.get("step"), int):  # DeepSpeed global_steps, Megatron iteration
        return facts["step"], "layout:" + layout
    for sub in tree.values():  # safetensors __metadata__ may carry a step
        md = sub.get("__metadata__") if isinstance(sub, dict) and "__safetensors__" in sub else None
        k = next((k for k in STEP_KEYS if str(md.get(k, "")).isdigit()), None) if isinstance(md, dict) else None
        if k is not None:
            return int(md[k]), f"__metadata__.{k}"
    if c.optimizer_step is not None:  # updates counted by the optimizer itself
        return int(c.optimizer_step), c.optimizer_source + ".state.*.step"
    return c.step, c.step_source


def _logged_loss(tree, step) -> Optional[float]:
    """The loss a trainer logged last at or before ``step``, in a producer's loss log (``producers.LOSS_LOGS``)."""
    for fkey, sub in tree.items():
        key = next((k for name, k in producers.LOSS_LOGS if fkey.endswith(name)), None)
        hist = sub.get(key) if key is not None and isinstance(sub, dict) else None
        rows = [r for r in hist if isinstance(r, dict)] if isinstance(hist, list) else []
        got = [scalar(r.get("loss")) for r in rows if scalar(r.get("loss")) is not None
               and (step is None or (scalar(r.get("step")) is not None and scalar(r.get("step")) <= step))]
        if got:
            return float(got[-1])
    return None


def _model_args(c: Components, tree) -> None:
    for fkey, sub in tree.items():
        if fkey.rsplit("/", 1)[-1] == "config.json" and isinstance(sub, dict):
            c.model_args, c.model_args_source = sub, f"{fkey}"
            return
    for fkey, sub in tree.items():
        if not isinstance(sub, dict):
            continue
        for key in MODEL_ARG_KEYS:
            v = state_of(sub.get(key))
            if isinstance(v, dict) and v:
                c.model_args, c.model_args_source = v, f"{fkey}:{key}"
                return


def _versions(c: Components, tree) -> None:
    for sub in tree.values():
        if not isinstance(sub, dict):
            continue
        for key, name in VERSION_KEYS.items():
            v = sub.get(key)
            if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                c.versions.setdefault(name, str(v))
            elif isinstance(v, dict) and "__instance__" in v:
                args = v.get("args")
                if isinstance(args, list) and args and isinstance(args[0], str):
                    c.versions.setdefault(name, args[0])
