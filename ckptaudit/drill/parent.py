"""The drill's parent process: pick the unit, run one fresh child per device, judge the children, write the outputs."""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from ..stages import liveness
from ..text import step_text
from .contract import SCHEMA, STATUS_WORDS, check_row
from .outputs import summary_line, write_outputs
from .select import exit_code, select_unit
from .settings import drill_config


def child_env(num_threads: int) -> Dict[str, str]:
    """The environment of a drill child: this one with torch.load forced to ``weights_only=True`` and
    ``num_threads`` threads for OpenMP and MKL."""
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    env["OMP_NUM_THREADS"] = str(num_threads)
    env["MKL_NUM_THREADS"] = str(num_threads)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (0 when it is gone)."""
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
                             env=child_env(int(spec.get("num_threads", 1))), start_new_session=True,
                             close_fds=True)
        outcome, status, usage, watchdog_rss = _watch(p.pid, t0 + timeout_seconds, cpu, memory_limit_bytes)
        p.returncode = os.waitstatus_to_exitcode(status)  # we reaped it; keep Popen from waiting again
    wall = time.perf_counter() - t0
    rss = int(usage.ru_maxrss) * 1024 if usage is not None else 0  # Linux reports KiB
    try:
        res = json.loads(result_path.read_text())
    except (OSError, ValueError):
        res = {}
    outcome = outcome or _outcome(res, p.returncode, status)
    res.setdefault("rows", [])
    res.setdefault("trace", [])
    res.update(outcome=outcome, returncode=p.returncode, wall_seconds=wall, peak_rss_bytes=max(rss, watchdog_rss),
               log=str(log_path))
    return res


def _watch(pid: int, deadline: float, cpu: bool, memory_limit_bytes: int) -> tuple:
    """Wait for child ``pid``, polling every 50 ms; kill its process group at ``deadline`` (a
    ``time.perf_counter()`` value) or, on a GPU, when its RSS passes ``memory_limit_bytes`` (a CPU child
    limits its own address space).  Returns ``(outcome, wait status, rusage, watched peak RSS)``;
    ``outcome`` is "timeout", "memory" or "" (it ended by itself)."""
    watchdog_rss = 0
    while True:
        got, status, usage = os.wait4(pid, os.WNOHANG)
        if got:
            return "", status, usage, watchdog_rss
        now = time.perf_counter()
        if not cpu:
            watchdog_rss = max(watchdog_rss, rss_bytes(pid))
        if now >= deadline or (not cpu and watchdog_rss > memory_limit_bytes):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(pid, 0)
            return ("timeout" if now >= deadline else "memory"), status, usage, watchdog_rss
        time.sleep(0.05)


def _outcome(res: Mapping[str, Any], returncode: int, status: int) -> str:
    """How a child that ended by itself ended: ok, died, memory or no_result (from its result document)."""
    if res.get("status") == "memory":
        return "memory"
    if res.get("final"):
        return "ok" if returncode == 0 else "died"
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return "memory"  # the kernel's OOM killer; RLIMIT_AS failures usually raise instead
    return "died" if res else "no_result"


def log_tail(path: str, n: int = 6) -> str:
    """The last ``n`` lines of the log at ``path``, joined with `` | `` (empty when it cannot be read)."""
    try:
        lines = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-n:])


def child_row(res: Mapping[str, Any], timeout_seconds: float, limit_mib: int) -> dict:
    """The ``child`` row of drill.parquet: how the child process ended against its time and memory limits."""
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
                               f"{res.get('error', '') or log_tail(res['log'])}")
    return check_row("child_process", status, expected, actual, msg, wall_seconds=wall, peak_rss_bytes=rss)


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
        v = read_verdict(run_dir, out, cfg, verdict)
    except Exception as e:  # noqa: BLE001 - an unreadable verdict is "the drill itself failed"
        rows.append(check_row("eligibility", "fail", "a readable verdict", type(e).__name__,
                         f"the drill could not obtain the audit's verdict: {e}"))
        infra_failed, v = True, None
    if v is not None:
        run_root = Path(run_dir) if run_dir else Path(v["run_dir"])
        doc["run_dir"] = str(run_root)
        chosen, nxt, why = select_unit(v, unit)
        if chosen is None:
            no_unit = True
            rows.append(check_row("eligibility", "fail", "a restorable unit", "none", why))
        else:
            doc.update(unit=chosen["unit"], step=chosen.get("step"), next_unit=nxt["unit"] if nxt else None)
            rows.append(check_row("eligibility", "pass", "no security error, usable_for resume or warm-start",
                             f"usable_for {chosen['usable_for']}",
                             f"{chosen['unit']} ({step_text(chosen.get('step'))}): "
                             + ("the audit's rollback point" if not unit else "chosen with --unit/drill.unit")))
            snap = liveness.snapshot(run_root, unit_files(run_root, chosen["unit"]))
            infra_failed = drill_devices(c, run_root, chosen, nxt, out, rows, doc)
            changed = liveness.changed_files(run_root, snap)
            if changed:  # retention pruned it or a writer replaced it while the children ran
                rows.append(check_row("unit_stable", "fail", "the unit's files unchanged during the drill",
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


def unit_files(run_root: Path, unit: str) -> List[str]:
    """Paths (relative to ``run_root``) of every file of ``unit``: the file itself, or all files under the folder."""
    p = run_root / unit
    if not p.is_dir():
        return [unit]
    return sorted(os.path.relpath(os.path.join(d, f), run_root) for d, _, fs_ in os.walk(p) for f in fs_)


def read_verdict(run_dir, out: Path, cfg, verdict) -> dict:
    """The verdict the drill starts from: ``verdict`` (a dict or a verdict.json path), else a fresh audit of
    ``run_dir`` into ``out/audit``; ``ValueError`` when neither is given."""
    if isinstance(verdict, Mapping):
        return dict(verdict)
    if verdict is not None:
        return json.loads(Path(verdict).read_text())
    if run_dir is None:
        raise ValueError("neither a verdict nor a run folder was given")
    from ..pipeline import audit_in_process
    from ..workflow.support import STAGE_KEYS

    stage_cfg = {k: v for k, v in (cfg or {}).items() if k in STAGE_KEYS and v is not None}
    return audit_in_process(run_dir, stage_cfg, out_dir=out / "audit")


def drill_devices(c: Mapping[str, Any], run_root: Path, chosen: dict, nxt: Optional[dict], out: Path,
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
            rows.append(check_row("device_available", "skip", "torch.cuda.is_available()", "False",
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
        crow = child_row(res, timeout, limit_mib)
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
        rows.append(check_row("device_available", "fail", f"one of {devices} available", "none",
                         f"none of drill.devices {devices} is available here: nothing was restored"))
        infra = True
    return infra
