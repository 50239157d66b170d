"""Helpers shared by the benchmark scripts (stdlib only; torch is imported only
by :func:`make_big_checkpoint`, which the scripts run in a child process).

Every script prints a Markdown table to stdout; the paragraph above each table
in BENCHMARKS.md names the exact command that produced it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SNAKEMAKE = str(Path(PYTHON).with_name("snakemake"))
TIME = "/usr/bin/time"
MIB = 1 << 20
GIB = 1 << 30


def machine_line() -> str:
    """One line: nproc, CPU model, memory, date, versions."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    try:
        import importlib.metadata as md

        snk = md.version("snakemake")
        trc = md.version("torch")
    except Exception:  # noqa: BLE001 - versions are informational only
        snk = trc = "?"
    return (f"nproc={os.cpu_count()}, CPU: {model}, RAM {mem_gib:.0f} GiB, "
            f"{_dt.datetime.now().strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
            f"torch {trc}, snakemake {snk}; code: {code_state()}")


def code_state() -> str:
    """``HEAD <short sha> + N changed paths`` of the checkout being measured (or the snapshot's
    ``COMMIT`` when :func:`code_root` is one)."""
    root = code_root()
    if root != REPO:
        commit = (root / "COMMIT").read_text().strip()[:7] if (root / "COMMIT").exists() else "?"
        return f"snapshot {root} of commit {commit} (PYTHONPATH)"
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", ".", ":!benchmarks"],
                               capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return "unknown"
    return f"HEAD {head or '?'} + {len(dirty)} uncommitted paths (outside benchmarks/)"


def md_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(out)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def require_gnu_time() -> None:
    if not os.access(TIME, os.X_OK):
        raise SystemExit(f"{TIME} is missing: apt-get install -y time")


_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
_USER = re.compile(r"User time \(seconds\): ([\d.]+)")
_SYS = re.compile(r"System time \(seconds\): ([\d.]+)")


def busy_core_seconds() -> float:
    """Machine-wide busy CPU time so far (all cores, all processes), from /proc/stat."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
    return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_gnu_time(cmd: Sequence[str], *, cwd: Optional[Path] = None, env: Optional[dict] = None,
                 check: bool = True) -> Dict:
    """Run ``cmd`` under ``/usr/bin/time -v``; return {wall_s, max_rss_mib, cpu_s,
    other_cpu_s, stdout, stderr, rc}.

    ``cpu_s`` is user+system time of the whole process tree (every descendant
    that was waited for); ``other_cpu_s`` is the machine's busy CPU time during
    the run minus ``cpu_s``: load from other processes (noise).  ``max_rss_mib``
    is GNU time's "Maximum resident set size": the largest RSS of any single process of the tree that was waited for (getrusage RUSAGE_CHILDREN),
    not the sum over processes.
    """
    require_gnu_time()
    tf = Path(f"/tmp/ckptaudit-bench-time-{os.getpid()}.txt")
    b0 = busy_core_seconds()
    t0 = time.perf_counter()
    p = subprocess.run([TIME, "-v", "-o", str(tf), *cmd], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    busy = busy_core_seconds() - b0
    text = tf.read_text()
    tf.unlink()
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    m = _RSS.search(text)
    u, sy = _USER.search(text), _SYS.search(text)
    cpu = (float(u.group(1)) if u else float("nan")) + (float(sy.group(1)) if sy else float("nan"))
    return {"wall_s": wall, "max_rss_mib": int(m.group(1)) / 1024 if m else float("nan"),
            "cpu_s": cpu, "other_cpu_s": max(0.0, busy - cpu),
            "stdout": p.stdout, "stderr": p.stderr, "rc": p.returncode, "time_v": text}


def code_root() -> Path:
    """The tree whose Snakefile the benchmarks run: the first ``PYTHONPATH`` entry holding a
    Snakefile (a snapshot of another commit, ``git archive C | tar -x -C DIR``), else the checkout."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "Snakefile").is_file():
            return Path(entry).resolve()
    return REPO


def snakemake_cmd(run_dir: Path, out_dir: Path, workdir: Path, cores: int = 2, extra: Sequence[str] = ()) -> List[str]:
    """``snakemake --cores N audit --config run_dir=… out_dir=…`` on the Snakefile of
    :func:`code_root`, with Snakemake's own state (``.snakemake/``) in ``workdir`` so the
    shared checkout is not touched."""
    return [SNAKEMAKE, "--snakefile", str(code_root() / "Snakefile"), "--directory", str(workdir), "--cores", str(cores),
            "audit", "--config", f"run_dir={run_dir}", f"out_dir={out_dir}", *extra]


def read_benchmark_tsvs(out_dir: Path) -> List[Dict]:
    """Rows of every Snakemake ``benchmark:`` file under ``OUT/benchmarks/<stage>/*.tsv``.  A job that ran in
    the audit's stage job server (``ckptaudit.stages.jobs.server``) adds its forked child's CPU seconds and takes
    the child's max RSS where larger: its benchmark file measured only the process that waited for it."""
    from ckptaudit.stages.jobs.costs import job_costs

    forked = job_costs(out_dir / "work")
    rows = []
    for tsv in sorted((out_dir / "benchmarks").glob("*/*.tsv")):
        lines = tsv.read_text().splitlines()
        if len(lines) < 2:
            continue
        head = lines[0].split("\t")
        for line in lines[1:]:
            vals = dict(zip(head, line.split("\t")))
            vals["stage"] = tsv.parent.name
            vals["job"] = tsv.stem
            if job := forked.get((tsv.parent.name, tsv.stem)):
                vals["cpu_time"] = str(as_float(vals.get("cpu_time")) + job["cpu_s"])
                vals["max_rss"] = str(max(as_float(vals.get("max_rss")), job["max_rss_mib"]))
            rows.append(vals)
    return rows


def as_float(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def mtimes(root: Path) -> Dict[str, int]:
    """{relative path: mtime_ns} of every file under ``root``."""
    out = {}
    for dp, _dn, fns in os.walk(root):
        for fn in fns:
            p = Path(dp) / fn
            out[str(p.relative_to(root))] = p.stat().st_mtime_ns
    return out


def free_gib(path: str = "/tmp") -> float:
    return shutil.disk_usage(path).free / GIB


def make_big_checkpoint(path: str, size_gib: float, n_tensors: int = 4, seed: int = 0, step: int = 1000) -> Dict:
    """A ~``size_gib`` torch.save checkpoint: ``n_tensors`` large float32 weights plus
    an AdamW-like optimizer dict (``exp_avg``, ``exp_avg_sq`` of the same shapes), a
    scheduler dict and the training step ``step`` (optimizer ``step``, ``iter_num``,
    scheduler ``last_epoch``), and a sha256sum sidecar.  Weights are 1/3 of the bytes.
    Holds the whole checkpoint in memory while saving (run it in a child process)."""
    import hashlib

    import torch

    g = torch.Generator().manual_seed(seed)
    per = int(size_gib * GIB / 3 / n_tensors / 4)  # float32 elements per tensor
    cols = 4096
    rows = max(1, per // cols)
    model = {f"layers.{i}.weight": torch.randn(rows, cols, generator=g) * 0.02 for i in range(n_tensors)}
    state = {i: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(rows, cols, generator=g) * 1e-3,
                 "exp_avg_sq": torch.rand(rows, cols, generator=g) * 1e-6} for i in range(n_tensors)}
    ckpt = {
        "model": model,
        "optimizer": {"state": state, "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8,
                                                        "weight_decay": 0.1, "params": list(range(n_tensors))}]},
        "scheduler": {"last_epoch": step, "_step_count": step + 1, "base_lrs": [3e-4]},
        "iter_num": step,
        "model_args": {"n_layer": n_tensors, "n_embd": cols},
    }
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, p)
    del ckpt, model, state
    with open(p, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    p.with_name(p.name + ".sha256").write_text(f"{digest}  {p.name}\n")
    return {"size_bytes": p.stat().st_size, "sha256_hex": digest}


def build_big_in_child(path: Path, size_gib: float, step: int = 1000) -> Dict:
    """Run :func:`make_big_checkpoint` in a child process; return its facts and seconds."""
    import json

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import _common; "
            "print(json.dumps(_common.make_big_checkpoint(sys.argv[2], float(sys.argv[3]), step=int(sys.argv[4]))))")
    t0 = time.perf_counter()
    p = subprocess.run([PYTHON, "-c", code, str(Path(__file__).parent), str(path), str(size_gib), str(step)],
                       capture_output=True, text=True, check=True)
    facts = json.loads(p.stdout.strip().splitlines()[-1])
    facts["build_s"] = time.perf_counter() - t0
    return facts
