"""A 2,000-unit run audited locally and through SLURM on this machine (single node).

1. Generates N small but real checkpoints with :func:`ckptaudit.demo.train` (a tiny
   nanoGPT GPT, 1 layer, n_embd 16: ``model``, AdamW ``optimizer``, LambdaLR
   ``scheduler``, ``rng``, ``iter_num`` …, one optimizer step per checkpoint) written
   with :func:`ckptaudit.demo.serialize`, each with a ``sha256sum`` sidecar.
2. Starts the single-node SLURM (:func:`ckptaudit.cluster.start_local_slurm`; root and
   ``apt-get install slurm-wlm munge`` needed).
3. Times ``snakemake --cores 2 audit --config run_dir=RUN out_dir=OUT`` (local), then
   ``snakemake --profile config/profiles/slurm audit …`` plus the settings a cluster
   without accounting database needs (:data:`ckptaudit.cluster.LOCAL_EXECUTOR_ARGS`),
   once per ``--group-components`` value given (the profile's ``unit=8`` by default).
   While SLURM runs, ``squeue -t all`` is polled for each job's submit/start/end times.
4. Checks that every SLURM verdict equals the local one apart from paths, and prints
   jobs submitted, wall time, and scheduler overhead per unit:
   ``(SLURM wall - local wall) / units``.

    /work/venv/bin/python benchmarks/bench_slurm.py [--units 2000] [--groups 8 1] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

PROFILE = C.REPO / "config" / "profiles" / "slurm"


def generate(run_dir: Path, n: int) -> float:
    """Train n steps of a tiny GPT, saving every step with a sha256 sidecar."""
    from ckptaudit import demo

    args = dict(demo.DEFAULT_MODEL_ARGS, n_layer=1, n_head=2, n_embd=16, block_size=16)

    def save(ckpt, path: Path):
        data = demo.serialize(ckpt)
        path.write_bytes(data)
        path.with_name(path.name + ".sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")

    t0 = time.perf_counter()
    run_dir.mkdir(parents=True)
    demo.train(run_dir, max_steps=n, save_every=1, seed=1, model_args=args, config=dict(eval_iters=1, batch_size=2),
               save=save)
    return time.perf_counter() - t0


class SqueuePoller(threading.Thread):
    """Snapshots ``squeue -t all`` every few seconds: {job id: fields} (finished jobs stay
    listed for MinJobAge = 600 s; polling keeps the ones that age out meanwhile)."""

    FMT = "%i|%j|%V|%S|%e|%T|%C|%m|%l"

    def __init__(self, every: float = 5.0):
        super().__init__(daemon=True)
        self.every, self.jobs, self.stop = every, {}, threading.Event()

    def snap(self):
        p = subprocess.run(["squeue", "-h", "-t", "all", "-o", self.FMT], capture_output=True, text=True)
        for line in p.stdout.splitlines():
            f = line.split("|")
            if len(f) == 9:
                self.jobs[f[0]] = dict(zip(("id", "name", "submit", "start", "end", "state", "cpus", "mem", "limit"), f))

    def run(self):
        while not self.stop.is_set():
            self.snap()
            self.stop.wait(self.every)
        self.snap()


def _ts(s: str) -> float:
    return datetime.fromisoformat(s).timestamp()


def strip_paths(doc: dict, out: Path) -> dict:
    return json.loads(json.dumps(doc, sort_keys=True).replace(str(out), "<OUT>"))


def stage_seconds(out: Path) -> float:
    """Sum of every job's wall seconds from Snakemake's ``benchmark:`` files."""
    secs = [C.as_float(b.get("s")) for b in C.read_benchmark_tsvs(out)]
    return sum(x for x in secs if x == x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=2000)
    ap.add_argument("--groups", type=int, nargs="+", default=[8], help="--group-components unit=N values to run")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)

    from ckptaudit import cluster

    info = cluster.start_local_slurm()
    tmp = Path(tempfile.mkdtemp(prefix="ckptaudit-bench-slurm-", dir=a.tmp))
    run_dir = tmp / "run"
    rows, notes = [], []
    try:
        gen_s = generate(run_dir, a.units)
        files = sorted(run_dir.iterdir())
        run_mib = sum(p.stat().st_size for p in files) / C.MIB
        print(f"# generated {a.units} units ({len(files)} files, {run_mib:.1f} MiB) in {gen_s:.0f} s", file=sys.stderr)

        load0 = os.getloadavg()[0]
        out_l, work_l = tmp / "out-local", tmp / "work-local"
        work_l.mkdir()
        r = C.run_gnu_time(C.snakemake_cmd(run_dir, out_l, work_l, 2))
        local_wall = r["wall_s"]
        v_local = strip_paths(json.loads((out_l / "verdict.json").read_text()), out_l)
        inv = json.loads((out_l / "work" / "inventory.json").read_text())
        n_parts = len(inv["parts"])
        local_stage_s = stage_seconds(out_l)
        print(f"# local {local_wall:.0f} s", file=sys.stderr)
        rows.append(["local, `--cores 2`", 0, f"{local_wall:.0f}", f"{local_stage_s:.0f}", "–", "–", "–", "–", "–",
                     f"{os.getloadavg()[0]:.1f}"])

        for g in a.groups:
            out_s, work_s = tmp / f"out-slurm-{g}", tmp / f"work-slurm-{g}"
            work_s.mkdir()
            poller = SqueuePoller()
            poller.start()
            cmd = [C.SNAKEMAKE, "--snakefile", str(C.REPO / "Snakefile"), "--directory", str(work_s), "audit",
                   "--profile", str(PROFILE), *cluster.LOCAL_EXECUTOR_ARGS, "--group-components", f"unit={g}",
                   "--config", f"run_dir={run_dir}", f"out_dir={out_s}"]
            t0 = time.time()
            r = C.run_gnu_time(cmd, check=False)
            poller.stop.set()
            poller.join()
            if r["rc"] != 0:
                raise RuntimeError(f"SLURM audit (unit={g}) failed: exit {r['rc']}\n{r['stderr'][-4000:]}")
            wall = r["wall_s"]
            v_slurm = strip_paths(json.loads((out_s / "verdict.json").read_text()), out_s)
            same = v_slurm == v_local
            ids = sorted(int(f.stem) for f in (work_s / ".snakemake" / "slurm_logs").rglob("*.log") if f.stem.isdigit())
            jobs = [poller.jobs[str(i)] for i in ids if str(i) in poller.jobs]
            done = [j for j in jobs if j["end"] not in ("N/A", "Unknown") and j["start"] not in ("N/A", "Unknown")]
            waits = [_ts(j["start"]) - _ts(j["submit"]) for j in done]
            runs = [_ts(j["end"]) - _ts(j["start"]) for j in done]
            job_s = sum(runs)
            slurm_stage_s = stage_seconds(out_s)
            states = sorted({j["state"] for j in jobs})
            rows.append([f"SLURM, profile, `--group-components unit={g}`", len(ids), f"{wall:.0f}",
                         f"{slurm_stage_s:.0f}", f"{job_s:.0f}", f"{max(waits or [0]):.0f}",
                         f"{1000 * (wall - local_wall) / a.units:.0f}",
                         f"{1000 * (job_s - slurm_stage_s) / a.units:.0f}",
                         "yes" if same else "**NO**", f"{os.getloadavg()[0]:.1f}"])
            notes.append(f"unit={g}: {len(ids)} SLURM jobs ({', '.join(states)}); job run times "
                         f"{min(runs or [0]):.0f}–{max(runs or [0]):.0f} s; started {t0:.0f}")
            print(f"# SLURM unit={g}: {wall:.0f} s, {len(ids)} jobs, verdict equal: {same}", file=sys.stderr)

        print(f"\nMachine: {C.machine_line()}; single-node SLURM {info.node} ({info.cpus} CPUs, "
              f"{info.real_memory_mb} MiB), slurm-wlm {_slurm_version()}, "
              f"snakemake-executor-plugin-slurm {_plugin_version()}; load average at start {load0:.1f}.\n")
        print(f"Run: {a.units} units ({len(files)} files incl. sidecars, {run_mib:.1f} MiB, generated in "
              f"{gen_s:.0f} s), units_per_job auto → {n_parts} parts.\n")
        print(C.md_table(["audit", "SLURM jobs submitted", "wall s", "sum of stage s (benchmark files)",
                          "sum of SLURM job run s", "longest queue wait s",
                          "scheduler overhead ms/unit (wall − local wall)",
                          "in-job overhead ms/unit (job run s − stage s)", "verdict = local", "load avg at end"],
                         rows))
        print()
        for n in notes:
            print(f"- {n}")
    finally:
        if a.keep:
            print(f"# kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _slurm_version() -> str:
    p = subprocess.run(["sinfo", "--version"], capture_output=True, text=True)
    return p.stdout.split()[-1] if p.returncode == 0 and p.stdout.split() else "?"


def _plugin_version() -> str:
    try:
        import importlib.metadata as md

        return md.version("snakemake-executor-plugin-slurm")
    except Exception:  # noqa: BLE001 - informational
        return "?"


if __name__ == "__main__":
    raise SystemExit(main())
