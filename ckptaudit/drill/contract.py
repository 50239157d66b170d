"""The drill's contract: the restore hook's Protocol, the checks, the exit codes and a row of drill.parquet."""

from __future__ import annotations

import importlib
from dataclasses import field, make_dataclass
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Protocol, Tuple, runtime_checkable

SCHEMA = "ckptaudit.drill/1"


EXIT_PASSED, EXIT_PROBLEM, EXIT_NO_UNIT, EXIT_FAILED = 0, 1, 2, 3


STATUS_WORDS = {EXIT_PASSED: "PASSED", EXIT_PROBLEM: "FAILED", EXIT_NO_UNIT: "NO RESTORABLE UNIT",
                EXIT_FAILED: "DRILL FAILED"}

#: Every check, in the order the child runs them, and what it compares.
CHECKS: Dict[str, str] = {
    "eligibility": "the unit is in the verdict, has no security error and is not marked unusable "
                   "(decided before any child starts)",
    "child_process": "a fresh child process finished within drill.timeout_seconds and drill.memory_limit_mib",
    "device_available": "the device exists (CUDA is skipped with a note when torch.cuda.is_available() is False)",
    "restore_hook": "the hook imported, returned every Restored member and did not raise while restoring",
    "model_load_strict": "restored model keys, shapes and values equal the unit's model state_dict, and "
                         "load_state_dict(strict=True) accepts it",
    "optimizer_load_strict": "the optimizer as the hook handed it over has the unit's param groups (parameters per "
                             "group and every hyperparameter: lr, initial_lr, betas, momentum, weight_decay, eps, "
                             "...) and per-parameter state, moments have their parameters' shapes, and "
                             "optimizer.load_state_dict accepts the unit's state (tried on a copy)",
    "optimizer_moments": "every parameter's optimizer moments are finite and, once step > 0, not all zero",
    "global_step": "the step the loop continues from equals the unit's step in the verdict; per-parameter "
                   "optimizer steps agree",
    "rng_stream": "the RNG state right after restore equals the saved RNG state (warns when none was saved)",
    "data_sampler": "the data sampler's state after restore equals the saved one (when the hook exposes it)",
    "loss_scale": "the GradScaler's scale and growth tracker equal the saved ones",
    "loss_at_restore": "the loss on the hook's fixed batch equals the loss the run recorded, within "
                       "drill.loss_tolerance (relative)",
    "continuation_steps": "drill.steps further updates give a finite loss and gradient norm",
    "lr_continuity": "each continuation update uses the schedule's LR for its step (Restored.lr_at; else the "
                     "saved LR): no re-warm-up; the scheduler as handed over has the unit's counters (last_epoch, "
                     "_step_count, its children's) and base LRs; stepped ahead alone it follows lr_at through the "
                     "schedule's next change (per-update schedulers); skip when none of these can judge",
    "next_unit_match": "continuing to the next intact unit's step reproduces its weights bit for bit "
                       "(deterministic hook with RNG restored), else after drill.steps updates the weights are "
                       "finite and within drill.norm_tolerance of its weight norm",
}


#: Checks whose failure means the drill could not run (exit 3) rather than a problem with the unit (exit 1).
INFRA_CHECKS = ("eligibility", "child_process", "device_available", "unit_stable")


#: Raised inside the child when anything calls torch.load(weights_only=False).
WEIGHTS_ONLY_REFUSAL = ("the restore drill only allows torch.load(weights_only=True); "
                        "the hook asked for weights_only=False")


@runtime_checkable
class Restored(Protocol):
    """What a restore hook returns: the training state *after* the job's own resume code ran.

    Required members (``isinstance(obj, Restored)`` checks they exist):

    * ``model`` – the ``torch.nn.Module``, on the hook's device, in train mode, loaded from the unit.
    * ``optimizer`` – the ``torch.optim.Optimizer`` over ``model``'s parameters, loaded from the unit.
    * ``scheduler`` – the LR scheduler loaded from the unit, or ``None`` when the trainer has none.
      When the unit holds no scheduler state, return the scheduler the resume code builds anyway
      (a fresh one): the drill is there to notice that the LR then re-warms.
    * ``scaler`` – the ``torch.amp.GradScaler`` loaded from the unit, or ``None`` without fp16 scaling.
    * ``step`` – int, optimizer updates done: the global step the loop continues from.
    * ``saved`` – mapping of what the unit recorded, read with ``torch.load(weights_only=True)``:
      ``"model"`` (state_dict) and ``"optimizer"`` (state_dict) required; when saved:
      ``"scheduler"``, ``"scaler"`` (state_dicts), ``"rng"`` (a uint8 tensor from
      ``torch.get_rng_state()`` or a mapping with ``"torch"`` and any of ``"cuda"``, ``"numpy"``,
      ``"python"``; ``None`` when the unit has none), ``"sampler"`` (the data sampler's state),
      ``"loss"`` (float, nats: the loss the run recorded at save time — ``best_val_loss``, the last
      logged loss, or a value the writer stored for this purpose) and ``"loss_source"`` (str, which).
    * ``loss_batch`` – a fixed batch drawn from no RNG, on which ``eval_loss`` should reproduce
      ``saved["loss"]``.
    * ``batches`` – iterator of training batches in the order the run would have consumed them after
      this unit (drawn lazily from the restored RNG or sampler: nothing may be drawn before the drill
      asks for the first batch).
    * ``deterministic`` – bool: continuing on this device reproduces the original run bit for bit
      when the RNG is restored (e.g. one CPU thread, deterministic kernels).
    * ``train_step(batch) -> (loss, grad_norm)`` – one optimizer update exactly as the training loop
      does it (forward, backward, clipping, ``optimizer.step()``, ``scheduler.step()``,
      ``scaler.update()``, zero_grad); returns the loss of the forward pass (before the update) and the
      gradient norm (floats or 0-d tensors).
    * ``eval_loss(batch) -> float`` – the loss of ``batch`` without updating anything and without
      drawing from any RNG (the drill also shields torch's RNG around the call).

    Optional members (looked up with ``getattr``):

    * ``lr_at(step) -> sequence of float`` – the schedule: each param group's LR for the update that
      follows ``step`` updates.  Without it the drill compares with the saved LR and scheduler counter.
    * ``rng_state() -> same structure as saved["rng"]`` – the live RNG state, so numpy and python RNGs
      are compared too; without it only ``torch.get_rng_state()`` (and CUDA) is compared.
    * ``sampler_state() -> same structure as saved["sampler"]`` – the live data sampler state.
    """

    model: Any
    optimizer: Any
    scheduler: Optional[Any]
    scaler: Optional[Any]
    step: int
    saved: Mapping[str, Any]
    loss_batch: Any
    batches: Iterator[Any]
    deterministic: bool
    train_step: Callable[[Any], Tuple[float, float]]  # a method or a callable attribute
    eval_loss: Callable[[Any], float]


class RestoreHook(Protocol):
    """``drill.hook`` names a callable of this type.  It must load only with
    ``torch.load(weights_only=True)`` (the child enforces it) and may raise: an exception while
    restoring is reported as a failed ``restore_hook`` check, with its message."""

    def __call__(self, path: str, device: str) -> Restored: ...


#: Every member a :class:`Restored` must have, in the order the Protocol declares them.
REQUIRED_MEMBERS: Tuple[str, ...] = tuple(Restored.__annotations__)

#: The members a hook may leave out (the drill looks them up with ``getattr``), with their types.
OPTIONAL_MEMBERS: Dict[str, str] = {
    "lr_at": "Optional[Callable[[int], Sequence[float]]]",
    "rng_state": "Optional[Callable[[], Any]]",
    "sampler_state": "Optional[Callable[[], Any]]",
}

#: A plain implementation of :class:`Restored` for hooks that do not want their own class: a dataclass
#: whose fields are the Protocol's members (``deterministic`` defaults to False), then the optional
#: members (default None) and ``extra`` (a dict for the hook's own use).  Built from the Protocol, so the
#: two cannot drift apart.
SimpleRestored = make_dataclass(
    "SimpleRestored",
    [(m, t) for m, t in Restored.__annotations__.items() if m != "deterministic"]
    + [("deterministic", "bool", field(default=False))]
    + [(m, t, field(default=None)) for m, t in OPTIONAL_MEMBERS.items()]
    + [("extra", "Dict[str, Any]", field(default_factory=dict))],
    namespace={"__doc__": "A plain implementation of :class:`Restored` (fields: its members, the optional "
                          "ones and ``extra``)."},
)
SimpleRestored.__module__ = __name__


def import_hook(spec: str) -> Callable[[str, str], Any]:
    """The callable named by ``"package.module:function"``.  Raises ValueError/ImportError/AttributeError."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"drill.hook {spec!r}: expected 'package.module:function'")
    obj = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"drill.hook {spec!r} names a {type(obj).__name__}, not a callable")
    return obj


def check_row(check: str, status: str, expected: str = "", actual: str = "", message: str = "",
         check_seconds: float = 0.0, **extra: Any) -> dict:
    """One row of drill.parquet for check ``name`` with its status, expected and actual values and message."""
    r = {"check": check, "status": status, "expected": expected, "actual": actual, "message": message,
         "check_seconds": float(check_seconds)}
    r.update(extra)
    return r
