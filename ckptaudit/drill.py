"""Restore drill: "it loads" is not "it resumes".

The audit says which unit to roll back to; the drill checks that training can
really *continue* from it, before an incident needs it.  It restores the unit
in a **fresh child process** (``python -m ckptaudit.drill child``: nothing
imported or cached by the parent leaks in) through the team's own restore code,
a *restore hook* named in the config (``drill.hook: "package.module:function"``),
continues training ``drill.steps`` updates, and compares what it sees with what
the run recorded.  CPU first; then each CUDA device of ``drill.devices`` when
``torch.cuda.is_available()`` in the CPU child (skipped with a note otherwise).

The hook contract (:class:`RestoreHook`, :class:`Restored`)::

    def restore_hook(path: str, device: str) -> Restored: ...

``path`` is the unit (a file or folder); ``device`` a torch device string
("cpu", "cuda", "cuda:1").  The hook does what the resuming job does: build the
model, optimizer, scheduler and scaler, load the unit into them **with
torch.load(weights_only=True)**, restore the RNG, and hand back the objects plus
the raw saved state so the drill can compare the two.  ``ckptaudit.demo:restore_hook``
is the reference implementation for the bundled demo trainer.

Checks (one row each in ``drill.parquet``; :data:`CHECKS` says what each compares):
``eligibility``, ``child_process``, ``restore_hook``, ``model_load_strict``,
``optimizer_load_strict``, ``optimizer_moments``, ``global_step``, ``rng_stream``,
``data_sampler``, ``loss_scale``, ``loss_at_restore``, ``continuation_steps``,
``lr_continuity``, ``next_unit_match``, ``device_available``.  A row's status is
``pass``, ``warn`` (the resume works but is not faithful in one respect, e.g. no
RNG state: not bit-exact), ``fail`` or ``skip``.

Exit codes (:func:`exit_code`, for cron and CI): **0** the drill passed (warnings
allowed); **1** the drill found a problem (a check failed, or the hook raised
while restoring the unit); **2** no restorable unit (the verdict has no rollback
point, or the chosen unit is refused); **3** the drill itself failed (verdict
unreadable, hook not importable or not implementing :class:`Restored`, child
timed out, hit its memory limit or died, no device of ``drill.devices`` available).  A failed check wins over an
incomplete drill: 1 before 3.

Security: a unit whose verdict findings include layer ``security`` with
severity ``error``, or whose ``usable_for`` is ``none``, is refused **before**
any child starts.  Inside the child ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` is set
and ``torch.load`` is wrapped so that an explicit ``weights_only=False`` raises
(:data:`WEIGHTS_ONLY_REFUSAL`) instead of unpickling.

Limits: the child runs with ``RLIMIT_AS`` = ``drill.memory_limit_mib`` (CPU
devices; CUDA maps tens of GiB of address space, so CUDA children get a
resident-set watchdog instead) and is killed (its whole process group) after
``drill.timeout_seconds``.

Importing this module is cheap (no torch, no pyarrow): ``rules/drill.smk``
imports it.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import (Any, Callable, Dict, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple, Union,
                    runtime_checkable)

import click

from . import liveness
from .cli_common import ExitThreeOnUsageError, check_paths

SCHEMA = "ckptaudit.drill/1"
EXIT_PASSED, EXIT_PROBLEM, EXIT_NO_UNIT, EXIT_FAILED = 0, 1, 2, 3
STATUS_WORDS = {EXIT_PASSED: "PASSED", EXIT_PROBLEM: "FAILED", EXIT_NO_UNIT: "NO RESTORABLE UNIT",
                EXIT_FAILED: "DRILL FAILED"}

#: Defaults of the ``drill:`` block of config/config.yaml (config/schema.yaml documents each key).
DEFAULTS: Dict[str, Any] = {
    "hook": "ckptaudit.demo:restore_hook",
    "unit": "",
    "devices": ["cpu", "cuda"],
    "steps": 5,
    "loss_tolerance": 0.1,
    "norm_tolerance": 0.05,
    "compare_max_steps": 200,
    "num_threads": 1,
    "timeout_seconds": 600,
    "memory_limit_mib": 8192,
    "report_date": "",
}

#: Every check, in the order the child runs them, and what it compares.
CHECKS: Dict[str, str] = {
    "eligibility": "the unit is in the verdict, has no security error and is not marked unusable "
                   "(decided before any child starts)",
    "child_process": "a fresh child process finished within drill.timeout_seconds and drill.memory_limit_mib",
    "device_available": "the device exists (CUDA is skipped with a note when torch.cuda.is_available() is False)",
    "restore_hook": "the hook imported, returned every Restored member and did not raise while restoring",
    "model_load_strict": "restored model keys, shapes and values equal the unit's model state_dict, and "
                         "load_state_dict(strict=True) accepts it",
    "optimizer_load_strict": "restored optimizer param groups and per-parameter state equal the unit's, moments "
                             "have their parameters' shapes, and optimizer.load_state_dict accepts it",
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
                     "saved LR and scheduler counter): no re-warm-up",
    "next_unit_match": "continuing to the next intact unit's step reproduces its weights bit for bit "
                       "(deterministic hook with RNG restored), else after drill.steps updates the weights are "
                       "finite and within drill.norm_tolerance of its weight norm",
}

#: Checks whose failure means the drill could not run (exit 3) rather than a problem with the unit (exit 1).
INFRA_CHECKS = ("eligibility", "child_process", "device_available", "unit_stable")

#: Raised inside the child when anything calls torch.load(weights_only=False).
WEIGHTS_ONLY_REFUSAL = ("the restore drill only allows torch.load(weights_only=True); "
                        "the hook asked for weights_only=False")

#: Columns of ``drill.parquet`` (one row per device and check).  Units are in the names.
COLUMNS: Tuple[Tuple[str, str], ...] = (
    ("unit", "string"), ("step", "int64"), ("device", "string"), ("check", "string"), ("status", "string"),
    ("expected", "string"), ("actual", "string"), ("message", "string"), ("check_seconds", "float64"),
    ("wall_seconds", "float64"), ("peak_rss_bytes", "int64"),
)


# --------------------------------------------------------------------------- the hook contract
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

    def train_step(self, batch: Any) -> Tuple[float, float]: ...

    def eval_loss(self, batch: Any) -> float: ...


class RestoreHook(Protocol):
    """``drill.hook`` names a callable of this type.  It must load only with
    ``torch.load(weights_only=True)`` (the child enforces it) and may raise: an exception while
    restoring is reported as a failed ``restore_hook`` check, with its message."""

    def __call__(self, path: str, device: str) -> Restored: ...


REQUIRED_MEMBERS = ("model", "optimizer", "scheduler", "scaler", "step", "saved", "loss_batch", "batches",
                    "deterministic", "train_step", "eval_loss")


@dataclass
class SimpleRestored:
    """A plain implementation of :class:`Restored` for hooks that do not want their own class."""

    model: Any
    optimizer: Any
    scheduler: Optional[Any]
    scaler: Optional[Any]
    step: int
    saved: Mapping[str, Any]
    loss_batch: Any
    batches: Iterator[Any]
    train_step: Callable[[Any], Tuple[float, float]]
    eval_loss: Callable[[Any], float]
    deterministic: bool = False
    lr_at: Optional[Callable[[int], Sequence[float]]] = None
    rng_state: Optional[Callable[[], Any]] = None
    sampler_state: Optional[Callable[[], Any]] = None
    extra: Dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- config, unit choice
def drill_config(cfg: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The ``drill`` block of a full config (``cfg["drill"]``) over :data:`DEFAULTS`."""
    out = dict(DEFAULTS)
    out.update(((cfg or {}).get("drill") or {}))
    out["devices"] = list(out["devices"])
    return out


def rule_config_json(config: Mapping[str, Any]) -> str:
    """The drill block as sorted JSON (a Snakemake param: a changed drill config re-runs the drill)."""
    return json.dumps(drill_config(config), sort_keys=True)


def rule_mem_mb(config: Mapping[str, Any]) -> int:
    """``mem_mb`` of the drill job: one child's limit (children run one after another) plus the parent."""
    return int(drill_config(config)["memory_limit_mib"]) + 512


def rule_runtime_minutes(config: Mapping[str, Any]) -> int:
    """``runtime`` (minutes) of the drill job: every device's child at its timeout, plus a minute."""
    c = drill_config(config)
    return int(math.ceil(float(c["timeout_seconds"]) * len(c["devices"]) / 60.0)) + 1


def report_date(config: Mapping[str, Any]) -> str:
    """``drill.report_date``, or today's UTC date (YYYY-MM-DD): the folder of the dated nightly report."""
    d = drill_config(config).get("report_date") or ""
    return d or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")


def security_errors(unit: Mapping[str, Any]) -> List[dict]:
    """The unit's findings of layer ``security`` and severity ``error``."""
    return [f for f in unit.get("findings", []) if f.get("layer") == "security" and f.get("severity") == "error"]


def refusal(unit: Mapping[str, Any]) -> Optional[str]:
    """Why the drill must not restore ``unit`` (a verdict entry), or None."""
    sec = security_errors(unit)
    if sec:
        kinds = ", ".join(sorted({f["kind"] for f in sec}))
        return (f"{unit['unit']}: refused: the audit found security errors ({kinds}); the drill never loads "
                "such a unit, not even with weights_only=True")
    if unit.get("usable_for") == "none":
        kinds = ", ".join(sorted({f["kind"] for f in unit.get("findings", []) if f.get("severity") == "error"}))
        return (f"{unit['unit']}: refused: the audit marks it unusable ({kinds or 'usable_for none'}); "
                "drill a unit the verdict can use")
    return None


def _order(u: Mapping[str, Any]) -> int:
    return u["step"] if u.get("step") is not None else -1


def select_unit(verdict: Mapping[str, Any], unit: Optional[str] = None
                ) -> Tuple[Optional[dict], Optional[dict], str]:
    """(the unit to drill, the next later drillable unit or None, why none) from a verdict.

    ``unit`` (a path relative to the run folder, or a base name) overrides the verdict's rollback point.
    The first element is None when there is nothing to drill; the third then says why.  A refused
    unit is returned as None too (see :func:`refusal`)."""
    units = list(verdict.get("units") or [])
    if unit:
        hits = [u for u in units if u["unit"] == unit] or [u for u in units if u["unit"].rsplit("/", 1)[-1] == unit]
        if not hits:
            names = ", ".join(repr(u["unit"]) for u in units) or "none"
            return None, None, f"{unit}: not a unit of the audited run (units: {names})"
        chosen = hits[0]
    else:
        rb = verdict.get("rollback")
        if not rb:
            return None, None, (f"the audit found no restorable unit (recommendation "
                                f"{verdict.get('recommendation', '?')!r}, no rollback point)")
        chosen = next((u for u in units if u["unit"] == rb["unit"]), None)
        if chosen is None:
            return None, None, f"{rb['unit']}: the verdict's rollback point is not among its units"
    why = refusal(chosen)
    if why:
        return None, None, why
    later = sorted((u for u in units if u.get("step") is not None and chosen.get("step") is not None
                    and u["step"] > chosen["step"] and refusal(u) is None), key=_order)
    return chosen, (later[0] if later else None), ""


def exit_code(rows: Sequence[Mapping[str, Any]], infra_failed: bool, no_unit: bool) -> int:
    """0 passed, 1 a check failed, 2 no restorable unit, 3 the drill itself failed (1 wins over 3, except
    when the unit changed during the drill: then no check speaks for it)."""
    if no_unit:
        return EXIT_NO_UNIT
    if any(r["check"] == "unit_stable" and r["status"] == "fail" for r in rows):
        return EXIT_FAILED
    if any(r["status"] == "fail" and r["check"] not in INFRA_CHECKS for r in rows):
        return EXIT_PROBLEM
    if infra_failed:
        return EXIT_FAILED
    return EXIT_PASSED


# --------------------------------------------------------------------------- the parent
def _row(check: str, status: str, expected: str = "", actual: str = "", message: str = "",
         check_seconds: float = 0.0, **extra: Any) -> dict:
    r = {"check": check, "status": status, "expected": expected, "actual": actual, "message": message,
         "check_seconds": float(check_seconds)}
    r.update(extra)
    return r


def _child_env(num_threads: int) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    env["OMP_NUM_THREADS"] = str(num_threads)
    env["MKL_NUM_THREADS"] = str(num_threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def run_child(spec: Mapping[str, Any], work_dir: Path, *, timeout_seconds: float, memory_limit_bytes: int
              ) -> dict:
    """Run one ``python -m ckptaudit.drill child`` for ``spec`` (one device) and wait for it.

    Returns the child's result document (``status``: ok | hook_error | memory | error, ``rows``,
    ``trace``, ``cuda_available`` …) plus ``outcome`` (ok | timeout | memory | died | no_result),
    ``wall_seconds``, ``peak_rss_bytes`` (``ru_maxrss`` of the child) and ``log`` (its stdout+stderr
    file).  Never raises for anything the child does."""
    dev = str(spec["device"]).replace(":", "")
    work_dir.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = (work_dir / f"child-{dev}.spec.json", work_dir / f"child-{dev}.result.json",
                                        work_dir / f"child-{dev}.log")
    cpu = not str(spec["device"]).startswith("cuda")
    # the child sets RLIMIT_AS on itself before importing torch (no preexec_fn: the parent may have threads)
    spec_path.write_text(json.dumps({**spec, "address_space_limit_bytes": memory_limit_bytes if cpu else 0},
                                    indent=1, sort_keys=True))
    if result_path.exists():
        result_path.unlink()

    cmd = [sys.executable, "-m", "ckptaudit.drill", "child", "--spec", str(spec_path), "--out", str(result_path)]
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=_child_env(int(spec.get("num_threads", 1))), start_new_session=True,
                             close_fds=True)
        outcome, status, usage, watchdog_rss = "", 0, None, 0
        deadline = t0 + timeout_seconds
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            now = time.perf_counter()
            if not cpu:
                watchdog_rss = max(watchdog_rss, _rss_bytes(p.pid))
            if now >= deadline or (not cpu and watchdog_rss > memory_limit_bytes):
                outcome = "timeout" if now >= deadline else "memory"
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status, usage = os.wait4(p.pid, 0)
                break
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)  # we reaped it; keep Popen from waiting again
    wall = time.perf_counter() - t0
    rss = int(usage.ru_maxrss) * 1024 if usage is not None else 0  # Linux reports KiB
    try:
        res = json.loads(result_path.read_text())
    except (OSError, ValueError):
        res = {}
    if not outcome:
        if res.get("status") == "memory":
            outcome = "memory"
        elif res.get("final"):
            outcome = "ok" if p.returncode == 0 else "died"
        elif os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            outcome = "memory"  # the kernel's OOM killer; RLIMIT_AS failures usually raise instead
        else:
            outcome = "died" if res else "no_result"
    res.setdefault("rows", [])
    res.setdefault("trace", [])
    res.update(outcome=outcome, returncode=p.returncode, wall_seconds=wall, peak_rss_bytes=max(rss, watchdog_rss),
               log=str(log_path))
    return res


def _log_tail(path: str, n: int = 6) -> str:
    try:
        lines = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-n:])


def _child_row(res: Mapping[str, Any], timeout_seconds: float, limit_mib: int) -> dict:
    wall, rss = res["wall_seconds"], res["peak_rss_bytes"]
    expected = f"exit 0 within {timeout_seconds:g} s and {limit_mib} MiB"
    actual = f"exit {res['returncode']} in {wall:.1f} s, peak RSS {rss / 2**20:.0f} MiB"
    out, st = res["outcome"], res.get("status")
    if out == "ok" and st == "ok":
        status, msg = "pass", "a fresh process ran the drill"
    elif out == "ok" and st == "hook_error":
        status, msg = "fail", f"the restore hook could not be used: {res.get('error', '')}"
    elif out == "timeout":
        status, msg = "fail", (f"the drill child was killed after {timeout_seconds:g} s (drill.timeout_seconds); "
                               "raise it if restoring this unit legitimately takes longer")
    elif out == "memory":
        status, msg = "fail", (f"the drill child exceeded its {limit_mib} MiB memory limit "
                               f"(drill.memory_limit_mib): {res.get('error', '') or 'killed'}")
    elif st == "error":
        status, msg = "fail", f"the drill child raised: {res.get('error', '')} (traceback in {res['log']})"
    else:
        status, msg = "fail", (f"the drill child exited with status {res['returncode']} without finishing: "
                               f"{res.get('error', '') or _log_tail(res['log'])}")
    return _row("child_process", status, expected, actual, msg, wall_seconds=wall, peak_rss_bytes=rss)


def run_drill(run_dir: Union[str, Path, None], out_dir: Union[str, Path], cfg: Optional[Mapping[str, Any]] = None,
              unit: Optional[str] = None, *, verdict: Union[None, str, Path, Mapping[str, Any]] = None,
              write: bool = True) -> Tuple[List[dict], int]:
    """Drill one unit of ``run_dir``; return (rows of ``drill.parquet``, exit code).

    ``cfg``: a full config (its ``drill`` block is read; missing keys take :data:`DEFAULTS`).
    ``unit``: a unit path relative to ``run_dir`` (or a base name); default ``drill.unit``, else the
    verdict's rollback point.  ``verdict``: the audit's verdict (a dict or a ``verdict.json`` path);
    None audits ``run_dir`` in this process first (:func:`ckptaudit.pipeline.audit_in_process`, into
    ``out_dir/audit``).  ``run_dir`` None takes the verdict's ``run_dir``.  With ``write`` the rows,
    ``drill.json`` and ``drill.html`` are written into ``out_dir`` (which also holds the children's
    spec, result and log files).  Raises nothing for a damaged unit or a failing child: those are rows.
    """
    t0 = time.perf_counter()
    c = drill_config(cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    unit = unit or c.get("unit") or None
    rows: List[dict] = []
    doc: Dict[str, Any] = {"schema": SCHEMA, "run_dir": str(run_dir or ""), "unit": unit, "step": None,
                           "next_unit": None, "devices": [], "config": c,
                           "started_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    infra_failed, no_unit = False, False
    try:
        v = _read_verdict(run_dir, out, cfg, verdict)
    except Exception as e:  # noqa: BLE001 - an unreadable verdict is "the drill itself failed"
        rows.append(_row("eligibility", "fail", "a readable verdict", type(e).__name__,
                         f"the drill could not obtain the audit's verdict: {e}"))
        infra_failed, v = True, None
    if v is not None:
        run_root = Path(run_dir) if run_dir else Path(v["run_dir"])
        doc["run_dir"] = str(run_root)
        chosen, nxt, why = select_unit(v, unit)
        if chosen is None:
            no_unit = True
            rows.append(_row("eligibility", "fail", "a restorable unit", "none", why))
        else:
            doc.update(unit=chosen["unit"], step=chosen.get("step"), next_unit=nxt["unit"] if nxt else None)
            rows.append(_row("eligibility", "pass", "no security error, usable_for resume or warm-start",
                             f"usable_for {chosen['usable_for']}",
                             f"{chosen['unit']} (step {chosen.get('step')}): "
                             + ("the audit's rollback point" if not unit else "chosen with --unit/drill.unit")))
            snap = liveness.snapshot(run_root, _unit_files(run_root, chosen["unit"]))
            infra_failed = _drill_devices(c, run_root, chosen, nxt, out, rows, doc)
            changed = liveness.changed_files(run_root, snap)
            if changed:  # retention pruned it or a writer replaced it while the children ran
                rows.append(_row("unit_stable", "fail", "the unit's files unchanged during the drill",
                                 f"{len(changed)} file(s) changed or vanished ({', '.join(changed[:3])})",
                                 f"{chosen['unit']} changed while it was drilled (a writer's retention or a "
                                 "re-save): the results are not about the unit the audit chose; run the drill "
                                 "again, or exclude the rollback point from retention while it is drilled"))
                infra_failed = True
    code = exit_code(rows, infra_failed, no_unit)
    for r in rows:
        r.setdefault("unit", doc["unit"] or "")
        r.setdefault("step", doc["step"])
        r.setdefault("device", "")
    doc.update(exit_code=code, result=STATUS_WORDS[code], wall_seconds=time.perf_counter() - t0)
    doc["summary"] = summary_line(doc, rows)
    doc["rows"] = rows
    if write:
        write_outputs(out, doc, rows)
    return rows, code


def _unit_files(run_root: Path, unit: str) -> List[str]:
    """Paths (relative to ``run_root``) of every file of ``unit``: the file itself, or all files under the folder."""
    p = run_root / unit
    if not p.is_dir():
        return [unit]
    return sorted(os.path.relpath(os.path.join(d, f), run_root) for d, _, fs_ in os.walk(p) for f in fs_)


def _read_verdict(run_dir, out: Path, cfg, verdict) -> dict:
    if isinstance(verdict, Mapping):
        return dict(verdict)
    if verdict is not None:
        return json.loads(Path(verdict).read_text())
    if run_dir is None:
        raise ValueError("neither a verdict nor a run folder was given")
    from .pipeline import audit_in_process
    from .workflow_support import STAGE_KEYS

    stage_cfg = {k: v for k, v in (cfg or {}).items() if k in STAGE_KEYS and v is not None}
    return audit_in_process(run_dir, stage_cfg, out_dir=out / "audit")


def _drill_devices(c: Mapping[str, Any], run_root: Path, chosen: dict, nxt: Optional[dict], out: Path,
                   rows: List[dict], doc: Dict[str, Any]) -> bool:
    """Run one child per device (CPU ones first).  Appends rows; returns True if a child failed as
    infrastructure (timeout, memory, died, hook unusable)."""
    devices = sorted(c["devices"], key=lambda d: str(d).startswith("cuda"))
    limit_mib = int(c["memory_limit_mib"])
    timeout = float(c["timeout_seconds"])
    cuda_available: Optional[bool] = None
    infra = False
    for dev in devices:
        if str(dev).startswith("cuda") and cuda_available is False:
            rows.append(_row("device_available", "skip", "torch.cuda.is_available()", "False",
                             f"{dev}: no CUDA device here (torch.cuda.is_available() is False in the CPU drill "
                             "child); the GPU drill was skipped", device=dev))
            doc["devices"].append({"device": dev, "outcome": "skipped", "status": None, "wall_seconds": 0.0,
                                   "peak_rss_bytes": 0, "torch_version": None, "device_name": None, "trace": [],
                                   "log": ""})
            continue
        spec = {"hook": c["hook"], "unit": chosen["unit"], "unit_path": str(run_root / chosen["unit"]),
                "unit_step": chosen.get("step"), "device": dev, "steps": int(c["steps"]),
                "loss_tolerance": float(c["loss_tolerance"]), "norm_tolerance": float(c["norm_tolerance"]),
                "compare_max_steps": int(c["compare_max_steps"]), "num_threads": int(c["num_threads"]),
                "next_unit": nxt["unit"] if nxt else None, "next_path": str(run_root / nxt["unit"]) if nxt else None,
                "next_step": nxt.get("step") if nxt else None}
        res = run_child(spec, out / "children", timeout_seconds=timeout, memory_limit_bytes=limit_mib << 20)
        if res.get("cuda_available") is not None:
            cuda_available = bool(res["cuda_available"])
        crow = _child_row(res, timeout, limit_mib)
        dev_rows = [crow] + list(res.get("rows", []))
        for r in dev_rows:
            r["device"] = dev
        rows.extend(dev_rows)
        if crow["status"] != "pass":
            infra = True
        doc["devices"].append({"device": dev, "outcome": res["outcome"], "status": res.get("status"),
                               "wall_seconds": res["wall_seconds"], "peak_rss_bytes": res["peak_rss_bytes"],
                               "torch_version": res.get("torch_version"), "device_name": res.get("device_name"),
                               "trace": res.get("trace", []), "log": res["log"]})
    if not infra and not any(r["check"] == "restore_hook" for r in rows):
        rows.append(_row("device_available", "fail", f"one of {devices} available", "none",
                         f"none of drill.devices {devices} is available here: nothing was restored"))
        infra = True
    return infra


def summary_line(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """One line for cron mail and CI logs."""
    code = doc.get("exit_code", EXIT_FAILED)
    head = f"ckptaudit drill: {STATUS_WORDS[code]}"
    where = f" {doc['unit']} (step {doc.get('step')})" if doc.get("unit") else ""

    def short(s: str, n: int = 180) -> str:
        return s if len(s) <= n else s[: n - 1] + "…"

    if code == EXIT_NO_UNIT:
        why = next((r["message"] for r in rows if r["check"] == "eligibility"), "")
        return f"{head}: {short(why)}"
    if code in (EXIT_PROBLEM, EXIT_FAILED):
        bad = [r for r in rows if r["status"] == "fail" and (code == EXIT_FAILED or r["check"] not in INFRA_CHECKS)]
        parts = [f"{r['check']}@{r.get('device') or '-'}: {short(r['message'], 140)}" for r in bad[:3]]
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        return f"{head}{where}: " + "; ".join(parts) + more
    ran = [d["device"] for d in doc.get("devices", []) if d.get("outcome") != "skipped"]
    skipped = [d["device"] for d in doc.get("devices", []) if d.get("outcome") == "skipped"]
    n_pass = sum(r["status"] == "pass" for r in rows)
    warns = sorted({f"{r['check']}@{r.get('device')}" for r in rows if r["status"] == "warn"})
    tail = f"; {len(warns)} warning(s): {', '.join(warns)}" if warns else ""
    sk = f"; skipped: {', '.join(skipped)} (not available)" if skipped else ""
    return f"{head}{where} on {', '.join(ran)}: {n_pass} checks passed{tail}{sk}"


def write_outputs(out: Path, doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
    """``drill.parquet`` (:data:`COLUMNS`), ``drill.json`` and a self-contained ``drill.html`` in ``out``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(n, getattr(pa, t)()) for n, t in COLUMNS])
    cols = [n for n, _ in COLUMNS]
    for r in rows:
        extra = sorted(set(r) - set(cols))
        if extra:
            raise KeyError(f"drill table: unexpected columns {extra}")
    table = pa.Table.from_pylist([{n: r.get(n) for n in cols} for r in rows], schema=schema)
    out.mkdir(parents=True, exist_ok=True)
    _atomic(out / "drill.parquet", lambda p: pq.write_table(table, p))
    _atomic(out / "drill.json", lambda p: Path(p).write_text(json.dumps(doc, indent=2, default=str) + "\n"))
    html = render_html(doc, rows)
    _atomic(out / "drill.html", lambda p: Path(p).write_text(html))


def _atomic(path: Path, write: Callable[[Path], Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    tmp.replace(path)


def render_html(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """The drill report section (``templates/drill.html.j2``): one self-contained page."""
    import jinja2

    from ._version import __version__

    env = jinja2.Environment(loader=jinja2.PackageLoader("ckptaudit", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), undefined=jinja2.StrictUndefined)
    return env.get_template("drill.html.j2").render(
        doc=doc, rows=rows, checks=CHECKS, version=__version__,
        devices=[d["device"] for d in doc.get("devices", [])] or [""],
        mib=lambda b: f"{b / 2**20:.0f} MiB" if b else "-")


# --------------------------------------------------------------------------- the child
class _LimitHit(Exception):
    """An allocation failed under RLIMIT_AS inside a check: the limit, not the unit."""


def _is_alloc_error(e: BaseException) -> bool:
    m = str(e).lower()
    return isinstance(e, MemoryError) or "can't allocate memory" in m or "cannot allocate memory" in m \
        or ("out of memory" in m and "cuda" in m)


def _guard_torch_load(torch) -> None:
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


def _f(x: Any) -> float:
    return float(x.item()) if hasattr(x, "item") else float(x)


def _same(a: Any, b: Any, where: str = "") -> Optional[str]:
    """None when ``a`` and ``b`` are equal (tensors by value, containers element-wise), else where they differ."""
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where or 'value'}: {type(a).__name__} vs {type(b).__name__}"
        a_, b_ = a.detach().cpu(), b.detach().cpu()
        if a_.shape != b_.shape:
            return f"{where or 'tensor'}: shape {tuple(a_.shape)} vs {tuple(b_.shape)}"
        if a_.dtype != b_.dtype:
            b_ = b_.to(a_.dtype)
        return None if torch.equal(a_, b_) else f"{where or 'tensor'}: values differ"
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return None if np.array_equal(np.asarray(a), np.asarray(b)) else f"{where or 'array'}: values differ"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if set(a) != set(b):
            return f"{where or 'mapping'}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            d = _same(a[k], b[k], f"{where}.{k}" if where else str(k))
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where or 'sequence'}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _same(x, y, f"{where}[{i}]")
            if d:
                return d
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    return None if a == b else f"{where or 'value'}: {a!r} vs {b!r}"


def _quoted(keys: Sequence[str], n: int = 6) -> str:
    ks = sorted(keys)
    s = ", ".join(repr(k) for k in ks[:n])
    return s + (f" … (+{len(ks) - n})" if len(ks) > n else "")


class _Child:
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

    # ---- bookkeeping
    def flush(self) -> None:
        tmp = self.out_path.with_name(self.out_path.name + ".tmp")
        tmp.write_text(json.dumps(self.result, default=str))
        tmp.replace(self.out_path)

    def add(self, row: dict) -> dict:
        self.result["rows"].append(row)
        self.flush()
        return row

    def check(self, name: str, fn: Callable[[], Tuple[str, str, str, str]]) -> dict:
        t = time.perf_counter()
        try:
            status, expected, actual, msg = fn()
        except Exception as e:  # noqa: BLE001 - a check that raises is a failed check, with its cause
            if _is_alloc_error(e):
                raise _LimitHit(f"{name}: {type(e).__name__}: {str(e)[:300]}") from e
            status, expected, actual, msg = "fail", "", type(e).__name__, f"{name} raised: {str(e)[:600]}"
        return self.add(_row(name, status, expected, actual, msg, time.perf_counter() - t))

    # ---- run
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
                self.add(_row("device_available", "skip", "torch.cuda.is_available()", "False",
                              f"{dev}: no CUDA device here; the GPU drill was skipped"))
                return
            self.result["device_name"] = torch.cuda.get_device_name(torch.device(dev))
        _guard_torch_load(torch)
        try:
            hook = import_hook(spec["hook"])
        except Exception as e:  # noqa: BLE001 - a hook that cannot be imported is the drill's own failure
            self.result.update(status="hook_error", error=f"drill.hook {spec['hook']!r}: {type(e).__name__}: {e}")
            return
        t = time.perf_counter()
        try:
            self.r = hook(spec["unit_path"], dev)
        except Exception as e:  # noqa: BLE001 - the unit could not be restored by the job's own code
            if _is_alloc_error(e):
                raise _LimitHit(f"restore_hook: {type(e).__name__}: {str(e)[:300]}") from e
            self.add(_row("restore_hook", "fail", f"{spec['hook']}({spec['unit']!r}, {dev!r}) returns a Restored",
                          type(e).__name__, f"the restore hook raised while restoring {spec['unit']}: "
                                            f"{type(e).__name__}: {str(e)[:800]}", time.perf_counter() - t))
            return
        missing = [m for m in REQUIRED_MEMBERS if not hasattr(self.r, m)]
        if missing:
            self.result.update(status="hook_error", error=f"drill.hook {spec['hook']!r} returned a "
                               f"{type(self.r).__name__} without {_quoted(missing)} (see ckptaudit.drill.Restored)")
            return
        self.rng_at_restore = self._live_rng()  # first thing: nothing below may draw before this
        sch = self.r.scheduler
        self.sched_epoch_at_restore = getattr(sch, "last_epoch", None) if sch is not None else None
        self.add(_row("restore_hook", "pass", "a Restored", type(self.r).__name__,
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
            self.add(_row("lr_continuity", "skip", message="no continuation step ran"))
        else:
            self.check("lr_continuity", self.c_lr)
        self.check("next_unit_match", self.c_next)

    # ---- helpers
    def _live_rng(self) -> Any:
        torch = self.torch
        fn = getattr(self.r, "rng_state", None)
        if callable(fn):
            return fn()
        out: Dict[str, Any] = {"torch": torch.get_rng_state()}
        if str(self.spec["device"]).startswith("cuda"):
            out["cuda"] = torch.cuda.get_rng_state_all()
        return out

    def _params(self) -> List[Tuple[str, Any]]:
        names = {id(p): n for n, p in self.r.model.named_parameters()}
        return [(names.get(id(p), f"param[{i}]"), p)
                for i, p in enumerate(p for g in self.r.optimizer.param_groups for p in g["params"])]

    # ---- checks: each returns (status, expected, actual, message)
    def c_model(self):
        saved = self.r.saved.get("model")
        if saved is None:
            return "fail", "a model state_dict in the unit", "none", "the unit holds no model state_dict"
        cur = self.r.model.state_dict()
        missing = sorted(set(cur) - set(saved))
        unexpected = sorted(set(saved) - set(cur))
        common = [k for k in cur if k in saved]
        shape = [k for k in common if tuple(cur[k].shape) != tuple(saved[k].shape)]
        differ = [k for k in common if k not in shape and _same(cur[k], saved[k]) is not None]
        problems = []
        if missing:
            problems.append(f"{len(missing)} key(s) the model has but the unit lacks: {_quoted(missing)}")
        if unexpected:
            problems.append(f"{len(unexpected)} key(s) in the unit the model does not have: {_quoted(unexpected)}")
        if shape:
            problems.append("shape differs for " + ", ".join(
                f"{k!r} (model {tuple(cur[k].shape)}, unit {tuple(saved[k].shape)})" for k in shape[:4]))
        if differ:
            problems.append(f"the hook's restored values differ from the unit's for {_quoted(differ)}")
        try:
            self.r.model.load_state_dict(saved, strict=True)
        except Exception as e:  # noqa: BLE001 - strict load's own message names the keys
            problems.append(f"load_state_dict(strict=True) raised: {str(e).splitlines()[0][:300]}")
        exp = f"{len(saved)} tensors: same keys, shapes and values; strict load accepted"
        if problems:
            return "fail", exp, f"{len(cur)} tensors in the model", "; ".join(problems)
        return "pass", exp, f"{len(cur)} tensors equal", "model restored exactly; strict load_state_dict accepted it"

    def c_optimizer(self):
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
        sst, cst = saved.get("state", {}), cur.get("state", {})
        if set(sst) != set(cst):
            problems.append(f"the hook's optimizer has state for {len(cst)} parameters, the unit for {len(sst)}")
        else:
            diff = next((d for k in sst for d in [_same(cst[k], sst[k], f"state[{k}]")] if d), None)
            if diff:
                problems.append(f"the hook's restored optimizer state differs from the unit's ({diff})")
        params = self._params()
        bad_shape = []
        for i, (name, p) in enumerate(params):
            for k, v in (sst.get(i) or {}).items():
                if hasattr(v, "shape") and getattr(v, "ndim", 0) > 0 and tuple(v.shape) != tuple(p.shape):
                    bad_shape.append(f"{name}.{k} {tuple(v.shape)} vs parameter {tuple(p.shape)}")
        if bad_shape:
            problems.append("moments do not match their parameters: " + "; ".join(bad_shape[:4]))
        try:
            self.r.optimizer.load_state_dict(saved)
        except Exception as e:  # noqa: BLE001 - torch's message names the mismatch
            problems.append(f"optimizer.load_state_dict raised: {str(e).splitlines()[0][:300]}")
        exp = f"{len(sg)} param group(s), state for {len(sst)} parameters, equal to the hook's"
        if problems:
            return "fail", exp, f"{len(cg)} group(s), state for {len(cst)} parameters", "; ".join(problems)
        return "pass", exp, "equal", "optimizer restored exactly; load_state_dict accepted it"

    def c_moments(self):
        torch = self.torch
        step = int(self.r.step)
        no_state, zero, nonfinite, n_with = [], [], [], 0
        for name, p in self._params():
            st = self.r.optimizer.state.get(p)
            if not st:
                no_state.append(name)
                continue
            moments = {k: v for k, v in st.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
                       and tuple(v.shape) == tuple(p.shape) and v.numel() > 0}
            if not moments:
                continue
            n_with += 1
            for k, v in moments.items():
                if not bool(torch.isfinite(v).all()):
                    nonfinite.append(f"{name}.{k}")
            if step > 0 and all(int(torch.count_nonzero(v)) == 0 for v in moments.values()):
                zero.append(name)
        n = len(self._params())
        exp = f"moments for {n} parameters, finite, not all zero at step {step}"
        if step > 0 and no_state:
            return ("fail", exp, f"no state for {len(no_state)} of {n}",
                    f"at step {step} the optimizer has no moments for {len(no_state)} of {n} parameters "
                    f"({_quoted(no_state, 4)}): they restart from zero (expect a loss spike)")
        if nonfinite:
            return "fail", exp, f"{len(nonfinite)} non-finite", f"non-finite optimizer moments: {_quoted(nonfinite, 4)}"
        if zero:
            return ("fail", exp, f"all-zero moments for {len(zero)} of {n_with} parameters",
                    f"at step {step} every moment of {len(zero)} of {n_with} parameters is exactly zero "
                    f"({_quoted(zero, 4)}): the optimizer state was reset or zeroed, so the resume is not "
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
                opt_steps.add(_f(s) if isinstance(s, torch.Tensor) else float(s))
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
            d = _same(cur[k], saved[k], k)
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
        d = _same(fn(), saved, "sampler")
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
                    f"the unit holds no GradScaler state: the loss scale restarts at {_f(sc.get_scale())} and the "
                    "first steps may be skipped for overflow")
        cur = sc.state_dict()
        keys = [k for k in ("scale", "growth_tracker") if k in saved]
        d = next((x for k in keys for x in [_same(cur.get(k), saved.get(k), k)] if x), None)
        if d:
            return "fail", f"{ {k: saved.get(k) for k in keys} }", f"{ {k: cur.get(k) for k in keys} }", \
                f"the loss scale does not continue from the saved value ({d})"
        return "pass", f"scale {saved.get('scale')}", f"scale {cur.get('scale')}", "loss scale continues"

    def c_loss(self):
        torch = self.torch
        rec = self.r.saved.get("loss")
        src = self.r.saved.get("loss_source") or "loss"
        tol = float(self.spec["loss_tolerance"])
        dev = torch.device(self.spec["device"])
        devs = [dev.index or 0] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=devs):
            val = _f(self.r.eval_loss(self.r.loss_batch))
        if not math.isfinite(val):
            return "fail", "a finite loss", f"{val}", f"the loss on the fixed batch is {val}"
        if rec is None:
            return "warn", "a recorded loss", f"{val:.4f}", "the unit records no loss; nothing to compare with"
        rec = float(rec)
        rel = abs(val - rec) / max(abs(rec), 1e-12)
        exp = f"{rec:.4f} ({src}) ± {tol:.0%}"
        act = f"{val:.4f} ({rel:.1%} off)"
        if rel > tol:
            return ("fail", exp, act, f"the loss on the fixed batch after restore is {val:.4f} but the run recorded "
                    f"{rec:.4f} ({src}): {rel:.1%} off, over drill.loss_tolerance {tol:g} — the weights are not "
                    "the ones that produced the recorded loss")
        return "pass", exp, act, f"loss at restore matches the recorded {src}"

    def _one_step(self, gstep: int) -> dict:
        opt = self.r.optimizer
        lr = [float(g["lr"]) for g in opt.param_groups]
        sch = self.r.scheduler
        epoch = getattr(sch, "last_epoch", None) if sch is not None else None
        batch = next(self.r.batches)
        loss, gn = self.r.train_step(batch)
        e = {"step": gstep, "lr": lr, "loss": _f(loss), "grad_norm": _f(gn), "scheduler_last_epoch": epoch}
        self.result["trace"].append(e)
        return e

    def c_continue(self):
        k = int(self.spec["steps"])
        s0 = int(self.r.step)
        bad = []
        for i in range(k):
            e = self._one_step(s0 + i)
            if not (math.isfinite(e["loss"]) and math.isfinite(e["grad_norm"])):
                bad.append(f"step {s0 + i + 1}: loss {e['loss']}, grad norm {e['grad_norm']}")
        self.flush()
        tr = self.result["trace"]
        exp = f"{k} updates with finite loss and gradient norm"
        gmax = max(e["grad_norm"] for e in tr)
        act = f"loss {tr[0]['loss']:.4f} → {tr[-1]['loss']:.4f}, grad norm ≤ {gmax:.3g}"
        if bad:
            return "fail", exp, act, "non-finite values while continuing: " + "; ".join(bad[:3])
        return "pass", exp, act, f"{k} updates from step {s0} ran"

    def c_lr(self):
        tr = self.result["trace"]
        lr_at = getattr(self.r, "lr_at", None)
        s0 = int(self.r.step)
        saved_sched = self.r.saved.get("scheduler")
        note = ""
        if saved_sched is None and self.r.scheduler is not None:
            note = " The unit holds no scheduler state, so the resume code built a fresh scheduler."
        if callable(lr_at):
            for e in tr:
                want = [float(x) for x in lr_at(e["step"])]
                if len(want) != len(e["lr"]) or any(not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)
                                                    for a, b in zip(e["lr"], want)):
                    rewarm = all(a < b for a, b in zip(e["lr"], want))
                    return ("fail", f"LR {want} at step {e['step']} (the schedule)", f"LR {e['lr']}",
                            f"the update after step {e['step']} used LR {e['lr']} but the schedule gives {want}"
                            + (" — the learning rate re-warms" if rewarm else "")
                            + (f"; scheduler last_epoch was {self.sched_epoch_at_restore} at restore, step {s0}"
                               if self.sched_epoch_at_restore is not None else "") + "." + note)
            return ("pass", f"schedule LR for steps {tr[0]['step']}…{tr[-1]['step']}",
                    f"LR {tr[0]['lr']} … {tr[-1]['lr']}",
                    f"the LR continues the schedule from step {s0} (no re-warm-up)")
        want = [float(g["lr"]) for g in (self.r.saved.get("optimizer") or {}).get("param_groups", [])]
        first = tr[0]["lr"]
        if want and any(not math.isclose(a, b, rel_tol=1e-6) for a, b in zip(first, want)):
            return ("fail", f"saved LR {want}", f"LR {first}",
                    f"the first update after restore used LR {first} but the run saved {want}." + note)
        if saved_sched is not None and self.r.scheduler is not None:
            cur = getattr(self.r.scheduler, "last_epoch", None)
            sv = saved_sched.get("last_epoch") if isinstance(saved_sched, Mapping) else None
            if sv is not None and self.sched_epoch_at_restore != sv:
                return ("fail", f"scheduler last_epoch {sv}", f"last_epoch {self.sched_epoch_at_restore}",
                        "the scheduler's counter does not continue from the saved one")
            return ("warn", f"saved LR {want}", f"LR {first}, scheduler last_epoch {cur}",
                    "the hook gives no lr_at(step); only the first LR and the scheduler counter were compared")
        if saved_sched is None and self.r.scheduler is not None:
            return ("fail", f"scheduler state at step {s0}", "a fresh scheduler",
                    "the unit holds no scheduler state and the hook gives no lr_at(step) to prove the schedule "
                    "continues; a rebuilt scheduler starts from step 0 (re-warm-up)." + note)
        return "pass", f"saved LR {want}", f"LR {first}", "constant LR (no scheduler) continues"

    def c_next(self):
        torch = self.torch
        sp = self.spec
        if not sp.get("next_path"):
            return "skip", "", "", "no later intact unit to compare the continuation with"
        s0, k = int(self.r.step), int(sp["steps"])
        n_step = sp.get("next_step")
        if n_step is None or int(n_step) <= s0:
            return "skip", "", "", f"{sp['next_unit']}: its step is unknown or not after {s0}"
        gap = int(n_step) - s0
        reasons = []
        if not bool(getattr(self.r, "deterministic", False)):
            reasons.append("the hook does not declare this device deterministic")
        if not self.rng_ok:
            reasons.append("the RNG state was not restored")
        if gap > int(sp["compare_max_steps"]):
            reasons.append(f"the next unit is {gap} steps away (> drill.compare_max_steps {sp['compare_max_steps']})")
        if gap < k:
            reasons.append(f"the next unit is only {gap} steps away (< drill.steps {k})")
        exact = not reasons
        if exact:
            for i in range(len(self.result["trace"]), gap):
                self._one_step(s0 + i)
            self.flush()
        done = len(self.result["trace"])
        cur = {n: t.detach() for n, t in self.r.model.state_dict().items()}
        # free what the comparison does not need before loading the next unit
        self.r.optimizer.state.clear()
        nsaved = import_hook(sp["hook"])(sp["next_path"], "cpu").saved
        ref, ref_loss, ref_src = nsaved.get("model") or {}, nsaved.get("loss"), nsaved.get("loss_source") or "loss"
        del nsaved
        if exact:
            diffs = []
            for n, t in cur.items():
                if n not in ref:
                    diffs.append(f"{n!r} missing in {sp['next_unit']}")
                elif _same(t, ref[n]) is not None:
                    a, b = t.cpu().double(), ref[n].cpu().double()
                    md = float((a - b).abs().max()) if a.shape == b.shape else float("nan")
                    diffs.append(f"{n!r} (max |Δ| {md:.3g})")
            exp = f"weights bitwise equal to {sp['next_unit']} after {gap} updates"
            if diffs:
                return ("fail", exp, f"{len(diffs)} of {len(cur)} tensors differ",
                        f"continuing from step {s0} to {n_step} did not reproduce {sp['next_unit']}: "
                        f"{', '.join(diffs[:4])} — the restore is not faithful (or the run is not deterministic)")
            rec, last = ref_loss, self.result["trace"][-1]["loss"]
            lt = (f"; the last update's loss is {last:.6g}, {sp['next_unit']} recorded {rec:.6g} ({ref_src})"
                  if rec is not None else "")
            return ("pass", exp, f"all {len(cur)} tensors equal",
                    f"bit-exact: continuing reproduces {sp['next_unit']}{lt}")

        def norm(sd):
            return math.sqrt(sum(float(t.detach().cpu().double().pow(2).sum()) for t in sd.values()
                                 if t.is_floating_point()))

        a, b = norm(cur), norm(ref)
        tol = float(sp["norm_tolerance"])
        rel = abs(a - b) / max(b, 1e-12)
        exp = f"finite and within {tol:.0%} of {sp['next_unit']}'s weight norm {b:.4g}"
        act = f"norm {a:.4g} after {done} updates ({rel:.2%} off)"
        why = "; ".join(reasons)
        if not (math.isfinite(a) and math.isfinite(b)):
            return "fail", exp, act, "non-finite weights after continuing"
        if rel > tol:
            return ("fail", exp, act, f"after {done} updates the weight norm is {a:.4g}, {rel:.1%} from "
                    f"{sp['next_unit']}'s {b:.4g} (compared in norm only: {why})")
        return "pass", exp, act, f"finite and close in norm (not compared bit for bit: {why})"


def child_main(spec_path: str, out_path: str) -> int:
    """Entry point of the fresh child process.  Writes the result document; returns 0 unless killed."""
    spec = json.loads(Path(spec_path).read_text())
    limit = int(spec.get("address_space_limit_bytes") or 0)
    if limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    ch = _Child(spec, Path(out_path))
    try:
        ch.run()
    except _LimitHit as e:
        ch.result.update(status="memory", error=str(e))
    except BaseException as e:  # noqa: BLE001 - reported to the parent as data, with the traceback in the log
        import traceback

        traceback.print_exc()
        ch.result.update(status="error", error=f"{type(e).__name__}: {str(e)[:800]}")
    ch.result["final"] = True
    ch.flush()
    return 0


# --------------------------------------------------------------------------- command lines
def copy_dated(src_files: Sequence[str], out_dir: str, date: str, drill_json: str) -> None:
    """Copy the drill (and audit) reports into ``out_dir`` and write ``summary.txt`` (date + summary)."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in src_files:
        shutil.copy2(f, out / Path(f).name)
    doc = json.loads(Path(drill_json).read_text())
    (out / "summary.txt").write_text(f"{date} exit {doc['exit_code']} {doc['summary']}\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m ckptaudit.drill run|child|dated|status …``: ``run`` and ``dated`` are what
    rules/drill.smk calls; ``status DRILL_JSON`` prints the summary and exits with the drill's code."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ckptaudit.drill", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="drill the verdict's rollback point (or --unit)")
    r.add_argument("--verdict", required=True)
    g = r.add_mutually_exclusive_group(required=True)
    g.add_argument("--out-dir", help="folder for drill.parquet, drill.json, drill.html and the children's files")
    g.add_argument("--out-parquet", help="path of drill.parquet; the other outputs go next to it")
    r.add_argument("--run-dir", default=None, help="default: the verdict's run_dir")
    r.add_argument("--config-json", default="{}", help="the drill block as JSON")
    r.add_argument("--unit", default=None)
    r.add_argument("--exit-zero", action="store_true", help="exit 0 once the outputs are written (Snakemake)")
    c = sub.add_parser("child", help="internal: the fresh process that restores one unit on one device")
    c.add_argument("--spec", required=True)
    c.add_argument("--out", required=True)
    d = sub.add_parser("dated", help="copy reports into a dated folder")
    d.add_argument("--date", required=True)
    d.add_argument("--summary", required=True, help="path of summary.txt; the copies go next to it")
    d.add_argument("--drill-json", required=True)
    d.add_argument("files", nargs="+")
    st = sub.add_parser("status", help="print a drill.json's summary line and exit with its exit code")
    st.add_argument("drill_json")
    a = ap.parse_args(argv)
    if a.cmd == "status":
        try:
            doc = json.loads(Path(a.drill_json).read_text())
        except (OSError, ValueError) as e:
            print(f"ckptaudit drill: DRILL FAILED: {a.drill_json}: {e}")
            return EXIT_FAILED
        print(doc["summary"])
        return int(doc["exit_code"])
    if a.cmd == "child":
        return child_main(a.spec, a.out)
    if a.cmd == "dated":
        copy_dated(a.files, str(Path(a.summary).parent), a.date, a.drill_json)
        return 0
    out_dir = a.out_dir or str(Path(a.out_parquet).parent)
    drill_block = json.loads(a.config_json)
    rows, code = run_drill(a.run_dir, out_dir, {"drill": drill_block}, a.unit, verdict=a.verdict)
    print(json.loads((Path(out_dir) / "drill.json").read_text())["summary"])
    return 0 if a.exit_zero else code


@click.command("drill", cls=ExitThreeOnUsageError)
@click.argument("run_dir")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--unit", default="", help="Unit to drill (path relative to RUN_DIR); default: the rollback point.")
@click.option("--device", "devices", multiple=True, help="Device to drill on (repeatable); default drill.devices.")
@click.option("--config", "config_file", type=click.Path(),
              help="YAML/JSON with keys of config/config.yaml (drill.hook, drill.steps, …; a regular file of at "
                   "most 1 MiB).")
@click.option("--cores", default=2, show_default=True, type=click.IntRange(1), help="Snakemake cores.")
@click.option("--json", "as_json", is_flag=True, help="Print drill.json instead of the summary line.")
@click.option("--verbose", is_flag=True, help="Show Snakemake's own output.")
def drill_command(run_dir, out_dir, unit, devices, config_file, cores, as_json, verbose):
    """Audit RUN_DIR, then restore its rollback point in a fresh process and continue training.

    Writes DIR/drill/drill.parquet, drill.json and drill.html next to the audit's report.  Exit codes:
    0 drill passed, 1 drill found a problem, 2 no restorable unit, 3 the drill itself failed (bad
    arguments or config included: one line on stderr says why)."""
    from .cli import run_workflow
    from .config import load_user_config

    try:
        rd, out = check_paths(run_dir, out_dir)
        if "://" in rd:
            raise click.ClickException(f"{run_dir}: a drill restores from a local or shared folder; copy the unit "
                                       f"from object storage first")
        cfg = load_user_config(config_file)
        cfg.update(run_dir=rd, out_dir=str(out))
        cfg["drill"] = dict(cfg.get("drill") or {})
        if unit:
            cfg["drill"]["unit"] = unit
        if devices:
            import re

            bad = [d for d in devices if not re.fullmatch(r"cpu|cuda(:\d+)?", d)]
            if bad:
                raise click.ClickException(f"--device {bad[0]!r}: expected cpu, cuda or cuda:N")
            cfg["drill"]["devices"] = list(devices)
        run_workflow(cfg, out, cores, targets=("drill",), quiet=not verbose)
        doc = json.loads((out / "drill" / "drill.json").read_text())
    except click.ClickException as e:
        click.echo(f"ckptaudit drill: error: {e.message}", err=True)
        sys.exit(EXIT_FAILED)
    except Exception as e:  # noqa: BLE001 - any workflow failure is exit 3 with its cause
        click.echo(f"ckptaudit drill: the drill itself failed: {type(e).__name__}: {e}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(json.dumps(doc, indent=2) if as_json else doc["summary"])
    if not as_json:
        click.echo(f"report: {out / 'drill' / 'drill.html'}")
    sys.exit(int(doc["exit_code"]))


if __name__ == "__main__":
    sys.exit(main())
