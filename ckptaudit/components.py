"""Which training-state components a unit holds, per producer, as data.

The producers' contracts (where each component lives) come from their save
code: nanoGPT ``train.py`` (``model``, ``optimizer``, ``model_args``,
``iter_num``, ``best_val_loss``, ``config``); Lightning
``trainer/connectors/checkpoint_connector.py`` (``state_dict``,
``optimizer_states``, ``lr_schedulers``, ``global_step``, ``epoch``,
``loops``, ``hyper_parameters``, ``native_amp_scaling_state``); Hugging Face
``Trainer._save_checkpoint`` (files, see :mod:`ckptaudit.layouts.hf`);
DeepSpeed ``engine.save_checkpoint`` (``module``, ``lr_scheduler``,
``global_steps``, ZeRO optimizer files); Megatron ``checkpointing.py``
(``model``, ``optimizer``, ``opt_param_scheduler``, ``rng_state``,
``iteration``, ``args``).

Everything works on the *pruned tree* the scan stored (tensors described as
``{"__tensor__": dtype, "shape": [...], "value": small}``), never on loaded
objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

WEIGHT_KEYS = ["model", "state_dict", "model_state_dict", "module", "net", "network", "params", "weights",
               "model_state"]
OPTIMIZER_KEYS = ["optimizer", "optimizer_state_dict", "optimizer_states", "optim", "opt", "optimizers"]
SCHEDULER_KEYS = ["scheduler", "lr_scheduler", "lr_schedulers", "opt_param_scheduler", "sched", "schedulers"]
SCALER_KEYS = ["scaler", "grad_scaler", "amp", "native_amp_scaling_state", "loss_scaler", "amp_scaling_state"]
RNG_KEYS = ["rng", "rng_state", "rng_states", "torch_rng_state", "cuda_rng_state", "numpy_rng_state",
            "python_rng_state", "random_rng_state", "rng_tracker_states"]
SAMPLER_KEYS = ["sampler", "sampler_state", "dataloader", "data_loader", "dataloader_state", "data_state", "loops",
                "consumed_samples", "consumed_train_samples", "train_iterator", "data_iter"]
STEP_KEYS = ["iter_num", "global_step", "step", "iteration", "global_steps", "num_updates", "steps", "train_step"]
EPOCH_KEYS = ["epoch", "epochs"]
EMA_KEYS = ["ema", "ema_state_dict", "model_ema", "ema_model", "ema_state", "averaged_model"]
BEST_KEYS = ["best_val_loss", "best_metric", "best_loss", "best_score", "best_model_score"]
MODEL_ARG_KEYS = ["model_args", "model_config", "hparams", "hyper_parameters", "args", "config", "model_cfg"]
VERSION_KEYS = {"torch_version": "torch", "pytorch-lightning_version": "lightning", "ds_version": "deepspeed",
                "transformers_version": "transformers", "cuda_version": "cuda"}


def is_tensor(x: Any) -> bool:
    return isinstance(x, dict) and "__tensor__" in x


def state_of(x: Any) -> Any:
    """The attribute dict of a pruned instance (argparse.Namespace, AttributeDict…)."""
    if isinstance(x, dict) and "__instance__" in x:
        st = x.get("state")
        if isinstance(st, list) and len(st) == 2 and isinstance(st[1], dict):
            st = {**(st[0] or {}), **st[1]}
        if isinstance(st, dict):
            return st
        if isinstance(x.get("items"), dict):
            return x["items"]
        return {}
    return x


def tensor_map(d: Any, prefix: str = "") -> Dict[str, dict]:
    """Flatten nested dicts of tensors into {"a.b.c": tensor-desc}."""
    out: Dict[str, dict] = {}
    if not isinstance(d, dict):
        return out
    for k, v in d.items():
        if k in ("__truncated__",):
            continue
        name = f"{prefix}{k}"
        if is_tensor(v):
            out[name] = v
        elif isinstance(v, dict) and "__instance__" not in v and "__tensor__" not in v:
            out.update(tensor_map(v, name + "."))
    return out


def group_size(group: Any) -> Optional[int]:
    """Number of parameter ids in an optimizer param group (long id lists are pruned
    to ``{"__list__": n}`` in the scan tree)."""
    if not isinstance(group, dict):
        return None
    p = group.get("params")
    if isinstance(p, list):
        return len(p)
    if isinstance(p, dict) and isinstance(p.get("__list__"), int):
        return p["__list__"]
    return None


def _scalar(x: Any) -> Optional[float]:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return x
    if is_tensor(x) and isinstance(x.get("value"), (int, float)) and not isinstance(x.get("value"), bool):
        return x["value"]
    return None


def _first(d: dict, keys: List[str]) -> Tuple[Optional[str], Any]:
    for k in keys:
        if k in d and d[k] is not None:
            return k, d[k]
    return None, None


def _mostly_tensors(d: Any) -> bool:
    if not isinstance(d, dict) or not d:
        return False
    vals = [v for k, v in d.items() if k != "__truncated__"]
    n = sum(1 for v in vals if is_tensor(v))
    return n >= max(1, len(vals) // 2)


@dataclass
class Components:
    """What one unit holds.  Shapes are lists of ints; steps are optimizer steps."""

    weights: Optional[Dict[str, dict]] = None  # name -> tensor desc
    weights_source: str = ""
    weights_only_format: bool = False  # safetensors / HF weights without any training state
    optimizer: Optional[dict] = None  # {"state": {...}, "param_groups": [...]} (merged over files)
    optimizer_source: str = ""
    optimizer_partitioned: bool = False  # ZeRO: state lives in per-rank partitions
    optimizer_nonempty: Optional[bool] = None
    scheduler: Optional[dict] = None
    scaler: bool = False
    rng: bool = False
    sampler: bool = False
    ema: bool = False
    step: Optional[int] = None
    step_source: str = ""
    epoch: Optional[float] = None
    best_metric: Optional[float] = None
    model_args: Optional[dict] = None
    model_args_source: str = ""
    versions: Dict[str, str] = field(default_factory=dict)
    top_keys: List[str] = field(default_factory=list)

    @property
    def optimizer_step(self) -> Optional[float]:
        st = (self.optimizer or {}).get("state")
        if not isinstance(st, dict):
            return None
        vals = []
        for v in st.values():
            if isinstance(v, dict):
                s = _scalar(v.get("step"))
                if s is not None:
                    vals.append(s)
        return max(vals) if vals else None

    @property
    def scheduler_last_epoch(self) -> Optional[int]:
        sch = self.scheduler
        if isinstance(sch, list) and sch:
            sch = sch[0]
        if isinstance(sch, dict):
            v = _scalar(sch.get("last_epoch"))
            if v is None:
                v = _scalar(sch.get("num_steps"))  # Megatron OptimizerParamScheduler
            return int(v) if v is not None else None
        return None


def from_dict(root: dict, c: Components, source: str) -> None:
    """Fill ``c`` from one checkpoint dict (nanoGPT, Lightning, DeepSpeed, Megatron, plain)."""
    if not isinstance(root, dict):
        return
    c.top_keys = sorted(set(c.top_keys) | {str(k) for k in root})
    if c.weights is None:
        k, v = _first(root, WEIGHT_KEYS)
        if k and isinstance(v, dict):
            c.weights, c.weights_source = tensor_map(v), f"{source}:{k}"
        elif _mostly_tensors(root):
            c.weights, c.weights_source = tensor_map(root), f"{source}:(root)"
    k, v = _first(root, OPTIMIZER_KEYS)
    if k is not None:
        opt = v[0] if isinstance(v, list) and v else v
        if isinstance(opt, dict):
            inner = opt.get("base_optimizer_state") if isinstance(opt.get("base_optimizer_state"), dict) else opt
            merge_optimizer(c, inner, f"{source}:{k}")
            if "zero_stage" in opt or "partition_count" in opt:
                c.optimizer_partitioned = True
    k, v = _first(root, SCHEDULER_KEYS)
    if k is not None and c.scheduler is None:
        c.scheduler = v if isinstance(v, (dict, list)) else {"value": v}
    if _first(root, SCALER_KEYS)[0]:
        c.scaler = True
    if _first(root, RNG_KEYS)[0]:
        c.rng = True
    if _first(root, SAMPLER_KEYS)[0]:
        c.sampler = True
    if _first(root, EMA_KEYS)[0]:
        c.ema = True
    for key in STEP_KEYS:
        if key in root:
            s = _scalar(root[key])
            if s is not None and c.step is None:
                c.step, c.step_source = int(s), f"{source}:{key}"
                break
    k, v = _first(root, EPOCH_KEYS)
    if k and _scalar(v) is not None:
        c.epoch = float(_scalar(v))
    k, v = _first(root, BEST_KEYS)
    if k and _scalar(v) is not None:
        c.best_metric = float(_scalar(v))
    if c.model_args is None:
        for key in MODEL_ARG_KEYS:
            v = state_of(root.get(key))
            if isinstance(v, dict) and v:
                c.model_args, c.model_args_source = v, f"{source}:{key}"
                break
    for key, name in VERSION_KEYS.items():
        if isinstance(root.get(key), (str, int, float)):
            c.versions[name] = str(root[key])
        elif isinstance(root.get(key), dict) and "__instance__" in root[key]:
            args = root[key].get("args")
            if isinstance(args, list) and args and isinstance(args[0], str):
                c.versions[name] = args[0]


def merge_optimizer(c: Components, opt: dict, source: str) -> None:
    state = opt.get("state")
    groups = opt.get("param_groups")
    if c.optimizer is None:
        c.optimizer = {"state": {}, "param_groups": []}
        c.optimizer_source = source
    if isinstance(state, dict):
        for k, v in state.items():
            c.optimizer["state"][f"{len(c.optimizer['state'])}:{k}" if k in c.optimizer["state"] else k] = v
    if isinstance(groups, list):
        c.optimizer["param_groups"].extend(g for g in groups if isinstance(g, dict))
    c.optimizer_nonempty = bool(c.optimizer["state"])


def collect(layout: str, tree: Dict[str, Any], facts: Dict[str, Any]) -> Components:
    """Components of a unit from its scan tree (keys are files or "root")."""
    c = Components()
    if layout in ("hf-trainer", "hf-sharded"):
        names = facts.get("trainer_files") or []
        for fname, sub in tree.items():
            base = fname.rsplit("/", 1)[-1]
            if isinstance(sub, dict) and "__safetensors__" in sub:
                if c.weights is None:
                    c.weights = {}
                    c.weights_source = fname
                c.weights.update(tensor_map(sub["__safetensors__"]))
            elif base in ("pytorch_model.bin",) or base.startswith("pytorch_model-"):
                if c.weights is None:
                    c.weights, c.weights_source = {}, fname
                c.weights.update(tensor_map(sub))
            elif base == "optimizer.pt" and isinstance(sub, dict):
                merge_optimizer(c, sub, fname)
            elif base == "scheduler.pt":
                c.scheduler = sub if isinstance(sub, dict) else {"value": sub}
            elif base == "scaler.pt":
                c.scaler = True
            elif base.startswith("rng_state"):
                c.rng = True
            elif base == "trainer_state.json" and isinstance(sub, dict):
                if isinstance(sub.get("global_step"), int):
                    c.step, c.step_source = sub["global_step"], "trainer_state.json:global_step"
                if isinstance(sub.get("epoch"), (int, float)):
                    c.epoch = float(sub["epoch"])
                if isinstance(sub.get("best_metric"), (int, float)):
                    c.best_metric = float(sub["best_metric"])
            elif base == "training_args.bin":
                pass
        if layout == "hf-sharded" and not names:
            c.weights_only_format = True
        return c
    for fname, sub in tree.items():
        if isinstance(sub, dict) and "__safetensors__" in sub:
            c.weights = tensor_map(sub["__safetensors__"])
            c.weights_source = fname
            c.weights_only_format = True
            md = sub.get("__metadata__")
            if isinstance(md, dict):
                for k in STEP_KEYS:
                    if k in md and str(md[k]).isdigit():
                        c.step, c.step_source = int(md[k]), f"{fname}:__metadata__.{k}"
            continue
        if layout == "dcp" and isinstance(sub, dict):
            # DCP flattens the optimizer: "optim.state.<fqn>.exp_avg", "optim.param_groups.0.params"
            # (torch/distributed/checkpoint/state_dict.py); rebuild the nested shape first
            sub = dict(sub)
            for key in ("optim", "optimizer"):
                flat = sub.get(key)
                if isinstance(flat, dict) and "state" not in flat:
                    state: Dict[str, dict] = {}
                    groups: Dict[str, dict] = {}
                    for k, v in flat.items():
                        if k.startswith("state."):
                            fqn, _, leaf = k[len("state."):].rpartition(".")
                            state.setdefault(fqn, {})[leaf] = v
                        elif k.startswith("param_groups."):
                            gi, _, leaf = k[len("param_groups."):].partition(".")
                            groups.setdefault(gi, {})[leaf] = v
                    sub[key] = {"state": state, "param_groups": [groups[g] for g in sorted(groups)]}
            from_dict(sub, c, fname)
            continue
        from_dict(sub, c, fname)
    if layout == "deepspeed":
        steps = facts.get("global_steps") or []
        if c.step is None and steps:
            c.step, c.step_source = max(steps), "model_states:global_steps"
    if layout == "megatron" and c.step is None and isinstance(facts.get("step"), int):
        c.step, c.step_source = facts["step"], "model_optim_rng.pt:iteration"
    return c
