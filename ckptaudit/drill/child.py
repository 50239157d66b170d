"""The drill's child process: restore one unit on one device through the hook, under limits, and run the checks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .._io import atomic_write
from . import handover
from .checks_continue import ContinueChecks
from .checks_restore import quoted, RestoreChecks
from .contract import REQUIRED_MEMBERS, WEIGHTS_ONLY_REFUSAL, check_row, import_hook


class LimitHit(Exception):
    """An allocation failed under RLIMIT_AS inside a check: the limit, not the unit."""


def is_alloc_error(e: BaseException) -> bool:
    """Whether ``e`` is an allocation failure (what RLIMIT_AS raises), not a fault of the unit."""
    m = str(e).lower()
    return isinstance(e, MemoryError) or "can't allocate memory" in m or "cannot allocate memory" in m \
        or ("out of memory" in m and "cuda" in m)


def guard_torch_load(torch) -> None:
    """Make torch.load refuse an explicit weights_only=False (the env var already forces True)."""
    real = torch.load

    def load(*args, **kwargs):
        if kwargs.get("weights_only") is False:
            raise RuntimeError(WEIGHTS_ONLY_REFUSAL)
        kwargs["weights_only"] = True
        return real(*args, **kwargs)

    load.__wrapped__ = real  # type: ignore[attr-defined]
    torch.load = load
    import torch.serialization as ser

    ser.load = load


class Child(RestoreChecks, ContinueChecks):
    """The checks, run in order on one restored object.  Every check appends exactly one row."""

    def __init__(self, spec: Mapping[str, Any], out_path: Path):
        self.spec, self.out_path = spec, out_path
        self.result: Dict[str, Any] = {"status": "ok", "rows": [], "trace": [], "cuda_available": None,
                                       "final": False}
        self.r: Any = None
        self.torch: Any = None
        self.rng_at_restore: Any = None
        self.rng_ok = False
        self.sched_epoch_at_restore: Optional[int] = None
        self.handed: Optional[handover.Handover] = None

    def flush(self) -> None:
        atomic_write(self.out_path, json.dumps(self.result, default=str).encode())

    def add(self, row: dict) -> dict:
        self.result["rows"].append(row)
        self.flush()
        return row

    def check(self, name: str, fn: Callable[[], Tuple[str, str, str, str]]) -> dict:
        t = time.perf_counter()
        try:
            status, expected, actual, msg = fn()
        except Exception as e:  # noqa: BLE001 - a check that raises is a failed check, with its cause
            if is_alloc_error(e):
                raise LimitHit(f"{name}: {type(e).__name__}: {str(e)[:300]}") from e
            status, expected, actual, msg = "fail", "", type(e).__name__, f"{name} raised: {str(e)[:600]}"
        return self.add(check_row(name, status, expected, actual, msg, time.perf_counter() - t))

    def run(self) -> None:
        spec = self.spec
        dev = str(spec["device"])
        import torch

        self.torch = torch
        self.result["torch_version"] = torch.__version__
        self.result["cuda_available"] = bool(torch.cuda.is_available())
        self.flush()
        torch.set_num_threads(int(spec.get("num_threads", 1)))
        if dev.startswith("cuda"):
            if not torch.cuda.is_available():
                self.add(check_row("device_available", "skip", "torch.cuda.is_available()", "False",
                              f"{dev}: no CUDA device here; the GPU drill was skipped"))
                return
            self.result["device_name"] = torch.cuda.get_device_name(torch.device(dev))
        guard_torch_load(torch)
        try:
            hook = import_hook(spec["hook"])
        except Exception as e:  # noqa: BLE001 - a hook that cannot be imported is the drill's own failure
            self.result.update(status="hook_error", error=f"drill.hook {spec['hook']!r}: {type(e).__name__}: {e}")
            return
        t = time.perf_counter()
        try:
            self.r = hook(spec["unit_path"], dev)
        except Exception as e:  # noqa: BLE001 - the unit could not be restored by the job's own code
            if is_alloc_error(e):
                raise LimitHit(f"restore_hook: {type(e).__name__}: {str(e)[:300]}") from e
            if getattr(e, "hook_mismatch", False):  # e.g. the demo hook on a user's run: configuration, exit 3
                self.result.update(status="hook_error", error=(  # the advice first: summaries cut long lines
                    "set drill.hook to your job's restore function (\"package.module:function\", see "
                    f"docs/drill.md): {spec['hook']!r} cannot restore {spec['unit']}: {str(e)[:300]}"))
                return
            self.add(check_row("restore_hook", "fail", f"{spec['hook']}({spec['unit']!r}, {dev!r}) returns a Restored",
                          type(e).__name__, f"the restore hook raised while restoring {spec['unit']}: "
                                            f"{type(e).__name__}: {str(e)[:800]}", time.perf_counter() - t))
            return
        missing = [m for m in REQUIRED_MEMBERS if not hasattr(self.r, m)]
        if missing:
            self.result.update(status="hook_error", error=f"drill.hook {spec['hook']!r} returned a "
                               f"{type(self.r).__name__} without {quoted(missing)} (see ckptaudit.drill.Restored)")
            return
        self.rng_at_restore = self._live_rng()  # first thing: nothing below may draw before this
        # then the optimizer and scheduler as the job will train with them, before any check touches them
        self.handed = handover.take(self.r.optimizer, self.r.scheduler)
        self.sched_epoch_at_restore = self.handed.counter
        self.add(check_row("restore_hook", "pass", "a Restored", type(self.r).__name__,
                      f"{spec['hook']} restored {spec['unit']} on {dev}", time.perf_counter() - t))
        self.check("model_load_strict", self.c_model)
        self.check("optimizer_load_strict", self.c_optimizer)
        self.check("optimizer_moments", self.c_moments)
        self.check("global_step", self.c_step)
        rng_row = self.check("rng_stream", self.c_rng)
        self.rng_ok = rng_row["status"] == "pass"
        self.check("data_sampler", self.c_sampler)
        self.check("loss_scale", self.c_scaler)
        self.check("loss_at_restore", self.c_loss)
        cont = self.check("continuation_steps", self.c_continue)
        if cont["status"] == "fail" and not self.result["trace"]:
            self.add(check_row("lr_continuity", "skip", message="no continuation step ran"))
        else:
            self.check("lr_continuity", self.c_lr)
        self.check("next_unit_match", self.c_next)

    def _live_rng(self) -> Any:
        torch = self.torch
        fn = getattr(self.r, "rng_state", None)
        if callable(fn):
            return fn()
        out: Dict[str, Any] = {"torch": torch.get_rng_state()}
        if str(self.spec["device"]).startswith("cuda"):
            out["cuda"] = torch.cuda.get_rng_state_all()
        return out


def child_main(spec_path: str, out_path: str) -> int:
    """Entry point of the fresh child process.  Writes the result document; returns 0 unless killed."""
    spec = json.loads(Path(spec_path).read_text())
    limit = int(spec.get("address_space_limit_bytes") or 0)
    if limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    ch = Child(spec, Path(out_path))
    try:
        ch.run()
    except LimitHit as e:
        ch.result.update(status="memory", error=str(e))
    except BaseException as e:  # noqa: BLE001 - reported to the parent as data, with the traceback in the log
        import traceback

        traceback.print_exc()
        ch.result.update(status="error", error=f"{type(e).__name__}: {str(e)[:800]}")
    ch.result["final"] = True
    ch.flush()
    return 0
