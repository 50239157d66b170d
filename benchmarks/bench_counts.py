"""Issue 22: memory and time of the audit against the number of tensors, members and header entries.

Generates, one at a time, runs of one unit whose bytes are few but whose counts are large, and audits
each end to end (``python -m ckptaudit.cli audit RUN --out OUT --json``, the real workflow):

* ``torch``: a real ``torch.save`` of a dict of N one-element float32 tensors (each its own storage, so
  the torch zip holds N + 4 members and data.pkl N tensor rebuilds), with a ``sha256sum`` sidecar;
* ``safetensors``: a safetensors file of N one-element float32 tensors (the header written with the
  format's facts: 8-byte little-endian length, JSON ``{name: {dtype, shape, data_offsets}}`` in
  ascending offsets, space-padded to a multiple of 8, then the data area; ``safetensors.torch.save_file``
  itself is used up to :data:`REAL_ST_MAX`);
* ``zip``: the same ``torch.save`` as ``torch`` at N members (the issue's "zip of 200,000 members");
* ``hfindex``: ``model.safetensors.index.json`` with N ``weight_map`` entries over S shard files of N / S
  tensors each (written by ``safetensors.torch.save_file``).

While an audit runs, a sampler (psutil, every :data:`SAMPLE_S` s) sums RSS over the audit's whole process
tree and, per job (a ``ckptaudit.stages`` process and its children, e.g. the load test's forked child),
over that job's tree; the table reports the largest job's peak and the tree's peak, and the log line each
forked job's own peak as the stage job server recorded it (``work/stage_jobs.jsonl``: the kernel's ``ru_maxrss``
from ``wait4``, which no sampling misses or overcounts).  Time per tensor is
the slope of wall time between consecutive sizes of a kind.  The verdict is right when an intact single
unit is recommended for resume (exit 0).  Beside them, the floor: the peak RSS of the framework's own loader of
the run's largest file alone in a fresh process (:func:`loader_floor_mib`), which the load test runs and cannot
undercut.

    python benchmarks/bench_counts.py                                  # every case of the issue
    python benchmarks/bench_counts.py --cases torch --sizes 10000,100000
    python benchmarks/bench_counts.py --cases safetensors --st-sizes 100000,1000000 --keep

Targets: every job ≤ 400 MiB peak RSS, the tree ≤ 1 GiB, verdict right.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
from ckptaudit.stages.jobs.client import SERVE  # noqa: E402 - stdlib only at import
from ckptaudit.stages.jobs.server import NAME_PREFIX  # noqa: E402

JOB_LIMIT_MIB = 400
TREE_LIMIT_MIB = 1024
#: Seconds between two samples of the process tree.
SAMPLE_S = 0.05
#: Largest safetensors file written with the real library (its save builds every tensor first).
REAL_ST_MAX = 200_000


# -- generators (run in a child process, so the parent imports no torch)
def _gen_torch(path: Path, n: int) -> None:
    """A nanoGPT-style training checkpoint of ``n`` tensors: ``n // 4`` one-element parameters and AdamW's
    ``step``, ``exp_avg`` and ``exp_avg_sq`` of each after one real step, each tensor its own storage."""
    import hashlib

    import torch

    torch.manual_seed(0)
    k = max(1, n // 4)
    params = [torch.nn.Parameter(torch.randn(1)) for _ in range(k)]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward() if k < 1000 else torch.autograd.backward(
        [p.sum() for p in params])
    opt.step()
    model = {f"layers.{i // 64}.w{i % 64}": p.detach() for i, p in enumerate(params)}
    ckpt = {"model": model, "optimizer": opt.state_dict(), "iter_num": 1000, "best_val_loss": 2.5,
            "model_args": {"n_layer": -(-k // 64)}, "config": {"learning_rate": 1e-3}}
    torch.save(ckpt, path)
    h = hashlib.sha256(path.read_bytes()).hexdigest()
    path.with_name(path.name + ".sha256").write_text(f"{h}  {path.name}\n")


def _st_header_bytes(n: int, prefix: str = "t") -> bytes:
    """A safetensors header of ``n`` one-element F32 tensors (names sorted as the library writes them)."""
    names = sorted(f"{prefix}.{i}" for i in range(n))
    parts = [f'"{k}":{{"dtype":"F32","shape":[1],"data_offsets":[{4 * i},{4 * i + 4}]}}' for i, k in enumerate(names)]
    head = ("{" + ",".join(parts) + "}").encode()
    return head + b" " * (-len(head) % 8)


def _gen_safetensors(path: Path, n: int) -> None:
    import numpy as np

    if n <= REAL_ST_MAX:
        import torch
        from safetensors.torch import save_file

        torch.manual_seed(0)
        vals = torch.randn(n)
        save_file({f"t.{i}": vals[i:i + 1].clone() for i in range(n)}, str(path))
        return
    head = _st_header_bytes(n)
    data = np.random.default_rng(0).standard_normal(n).astype("<f4").tobytes()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        f.write(data)


def _gen_hfindex(folder: Path, n: int, shards: int) -> None:
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    per = -(-n // shards)
    weight_map, total = {}, 0
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        names = [f"layers.{i}.weight" for i in range(s * per, min(n, (s + 1) * per))]
        vals = torch.randn(len(names))
        save_file({k: vals[j:j + 1].clone() for j, k in enumerate(names)}, str(folder / fname),
                  metadata={"format": "pt"})
        weight_map.update({k: fname for k in names})
        total += 4 * len(names)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def _generate_child(kind: str, run_dir: str, n: int, shards: int) -> None:
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    if kind in ("torch", "zip"):
        _gen_torch(run / "ckpt_001000.pt", n)
    elif kind == "safetensors":
        _gen_safetensors(run / "model.safetensors", n)
    elif kind == "hfindex":
        _gen_hfindex(run, n, shards)
    else:
        raise SystemExit(f"unknown case {kind!r}")


# -- the floor: the framework's own loader of the run's largest file, alone in a fresh process
_FLOOR_SRC = r"""
import resource, sys
import torch
path, kind = sys.argv[1], sys.argv[2]
if kind == "safetensors":  # as the load test does (ckptaudit/stages/load/child.py): one tensor at a time
    from safetensors import safe_open
    with safe_open(path, framework="pt", device="cpu") as f:
        for k in f.keys():
            f.get_tensor(k)
else:
    obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def loader_floor_mib(run_dir: Path) -> int:
    """Peak RSS (MiB) of the framework's own load of the run's largest checkpoint file (``torch.load(
    weights_only=True, mmap=True)``, or safetensors' ``safe_open`` tensor by tensor), with ``import torch``, in a
    fresh process: what the load test's child cannot go below, whatever the audit does around it."""
    files = [p for p in run_dir.iterdir() if p.suffix in (".pt", ".safetensors")]
    big = max(files, key=lambda p: p.stat().st_size)
    kind = "safetensors" if big.suffix == ".safetensors" else "torch"
    r = subprocess.run([C.PYTHON, "-c", _FLOOR_SRC, str(big), kind], capture_output=True, text=True, check=True)
    return int(r.stdout.split()[-1])


def generate(kind: str, run_dir: Path, n: int, shards: int) -> float:
    """Write the run of case ``kind`` at count ``n`` into ``run_dir``; return the seconds it took."""
    t0 = time.perf_counter()
    subprocess.run([C.PYTHON, __file__, "--_generate", kind, str(run_dir), str(n), str(shards)], check=True)
    return time.perf_counter() - t0


# -- the sampler
class TreeSampler:
    """Peak RSS (bytes) of a process tree, summed over it and over each job's own subtree, sampled with psutil.

    A job is a process whose command line runs ``ckptaudit.stages`` (its name: the stage, the word after it)
    together with its descendants; the load server (``ckptaudit.stages.load.server``, which does the load jobs' loads
    in children it forks) counts as one job with its descendants; every other process counts only to the tree."""

    def __init__(self, root_pid: int) -> None:
        import psutil

        self.psutil = psutil
        self.root = psutil.Process(root_pid)
        self.tree_peak = 0
        self.job_peak: Dict[str, int] = {}
        self.at_peak: Dict[str, int] = {}  # the tree's peak, by job ("other": the CLI and Snakemake)
        # the tree's peak of summed PSS: a page shared by n processes (torch's, in the load server and each load
        # child it forks) counts 1/n in each, where the RSS sum counts it n times
        self.tree_pss_peak = 0
        self.proc_peak = (0, "")  # the largest single process: (RSS, its job)
        self._stop = threading.Event()
        self._names: Dict[int, str] = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "TreeSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _job_of(self, p) -> str:
        if p.pid not in self._names:
            try:
                cmd = p.cmdline()
            except self.psutil.Error:
                cmd = []
            name = ""
            try:  # a job forked by the stage job server is named after its stage (ckptaudit.stages.jobs.server)
                comm = p.name()
            except self.psutil.Error:
                comm = ""
            if comm.startswith(NAME_PREFIX):  # a fork of such a job (its load children) counts to that job
                try:
                    parent = p.parent()
                    same = parent is not None and parent.name() == comm
                except self.psutil.Error:
                    same = False
                self._names[p.pid] = self._job_of(parent) if same else f"{comm[len(NAME_PREFIX):]}:{p.pid}"
                return self._names[p.pid]
            if SERVE in cmd:  # the stage job server itself counts to the tree
                self._names[p.pid] = ""
                return ""
            try:  # a fork (the load test's child) keeps its parent's command line: it counts to the parent's job
                parent = p.parent()
                if parent is not None and parent.pid != self.root.pid and parent.cmdline() == cmd:
                    self._names[p.pid] = self._job_of(parent)
                    return self._names[p.pid]
            except self.psutil.Error:
                pass
            if "ckptaudit.stages" in cmd:
                i = cmd.index("ckptaudit.stages")
                name = f"{cmd[i + 1] if i + 1 < len(cmd) else '?'}:{p.pid}"
            elif "ckptaudit.stages.report" in cmd:  # the report job (its own module, not a stage)
                name = f"report:{p.pid}"
            elif "ckptaudit.stages.load.server" in cmd:  # the audit's one torch import and the loads it forks
                name = f"load_server:{p.pid}"
            self._names[p.pid] = name
        return self._names[p.pid]

    def _sample(self) -> None:
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except self.psutil.Error:
            return
        total, jobs, pss = 0, {}, 0
        self._largest = (0, "")
        for p in procs:
            try:
                rss = p.memory_info().rss
                try:
                    pss += p.memory_full_info().pss
                except (self.psutil.Error, AttributeError):
                    pass
                job = self._job_of(p)
                if not job:  # a child of a job (the load test's fork) counts to its job
                    for a in p.parents():
                        job = self._job_of(a)
                        if job or a.pid == self.root.pid:
                            break
            except self.psutil.Error:
                continue
            total += rss
            self._largest = max(self._largest, (rss, (job or "other").split(":")[0]))
            if job:
                jobs[job] = jobs.get(job, 0) + rss
        if total > self.tree_peak:
            self.at_peak = {**{j.split(":")[0]: v for j, v in jobs.items()}, "other": total - sum(jobs.values())}
        self.tree_peak = max(self.tree_peak, total)
        self.tree_pss_peak = max(self.tree_pss_peak, pss)
        self.proc_peak = max(self.proc_peak, self._largest)
        for j, v in jobs.items():
            self.job_peak[j] = max(self.job_peak.get(j, 0), v)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(SAMPLE_S)


def audit(run_dir: Path, out_dir: Path, timeout_s: float) -> Dict:
    """Audit ``run_dir`` end to end while sampling its process tree; {wall_s, rc, verdict, tree, job, worst}."""
    env = dict(os.environ)
    cmd = [C.PYTHON, "-m", "ckptaudit.cli", "audit", str(run_dir), "--out", str(out_dir), "--json"]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    s = TreeSampler(p.pid).start()
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    wall = time.perf_counter() - t0
    s.stop()
    try:
        verdict = json.loads(out)
    except ValueError:
        verdict = {}
    worst = max(s.job_peak.items(), key=lambda kv: kv[1], default=("-", 0))
    from ckptaudit.stages.jobs.costs import job_costs

    own: Dict[str, float] = {}  # the kernel's peak RSS of each forked job (wait4's ru_maxrss), not sampled
    for (stage, _part), d in job_costs(out_dir / "work").items():
        own[stage] = max(own.get(stage, 0.0), float(d.get("max_rss_mib") or 0))
    return {"own_max_rss_mib": own, "wall_s": wall, "rc": p.returncode, "verdict": verdict, "tree_mib": s.tree_peak / C.MIB,
            "job_mib": worst[1] / C.MIB, "worst_job": worst[0].split(":")[0], "stderr": err,
            "stages": {k.split(":")[0]: max(v / C.MIB, 0) for k, v in sorted(s.job_peak.items(), key=lambda kv: kv[1])},
            "at_tree_peak": {k: round(v / C.MIB) for k, v in s.at_peak.items()}, "tree_pss_mib": s.tree_pss_peak / C.MIB,
            "largest_process": f"{s.proc_peak[0] / C.MIB:.0f} MiB ({s.proc_peak[1]})"}


#: The verdict of each case's intact single unit: a full training checkpoint resumes (exit 0); weights alone
#: (safetensors, an HF index) warm-start (exit 1).
EXPECTED = {"torch": ("resume", 0), "zip": ("resume", 0), "safetensors": ("warm-start", 1),
            "hfindex": ("warm-start", 1)}


def verdict_right(kind: str, r: Dict) -> bool:
    """Whether the audit gave the intact unit of case ``kind`` its :data:`EXPECTED` recommendation and exit."""
    return (r["verdict"].get("recommendation"), r["rc"]) == EXPECTED[kind]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--cases", default="torch,safetensors,zip,hfindex",
                    help="comma list of torch, safetensors, zip, hfindex")
    ap.add_argument("--sizes", default="10000,100000,300000", help="tensors of the torch case")
    ap.add_argument("--st-sizes", default="100000,1000000", help="header entries of the safetensors case")
    ap.add_argument("--zip-members", default="200000", help="members of the zip case")
    ap.add_argument("--hf-entries", default="100000", help="weight_map entries of the hfindex case")
    ap.add_argument("--hf-shards", type=int, default=1000, help="shard files of the hfindex case")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one audit may take")
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (printed)")
    a = ap.parse_args(argv)
    sizes = {"torch": a.sizes, "safetensors": a.st_sizes, "zip": a.zip_members, "hfindex": a.hf_entries}
    rows, slopes_rows = [], []
    ok_all = True
    for kind in [c.strip() for c in a.cases.split(",") if c.strip()]:
        prev = None
        for n in [int(x) for x in sizes[kind].split(",") if x]:
            tmp = Path(tempfile.mkdtemp(prefix=f"ckptaudit-bench-counts-{kind}-", dir=a.tmp))
            try:
                run_dir, out = tmp / "run", tmp / "out"
                gen_s = generate(kind, run_dir, n, a.hf_shards)
                run_bytes = sum(p.stat().st_size for p in run_dir.iterdir())
                print(f"# {kind} n={n}: generated {run_bytes / C.MIB:.1f} MiB in {gen_s:.1f} s", file=sys.stderr)
                r = audit(run_dir, out, a.timeout)
                floor = loader_floor_mib(run_dir)
                right = verdict_right(kind, r)
                ok = right and r["job_mib"] <= JOB_LIMIT_MIB and r["tree_mib"] <= TREE_LIMIT_MIB
                ok_all &= ok
                slope = "–"
                if prev is not None:
                    slope = f"{1e6 * (r['wall_s'] - prev[1]) / (n - prev[0]):.1f}"
                prev = (n, r["wall_s"])
                print(f"# {kind} n={n}: the framework's loader alone {floor} MiB", file=sys.stderr)
                print(f"# {kind} n={n}: rc {r['rc']}, {r['wall_s']:.1f} s, job {r['job_mib']:.0f} MiB "
                      f"({r['worst_job']}), each forked job's own peak (ru_maxrss, MiB) {r['own_max_rss_mib']}, tree {r['tree_mib']:.0f} MiB (PSS {r['tree_pss_mib']:.0f}); largest process {r['largest_process']}; per stage {r['stages']}; at the tree's peak {r['at_tree_peak']}", file=sys.stderr)
                if not right:
                    print(r["stderr"][-2000:], file=sys.stderr)
                rows.append([kind, f"{n:,}", f"{run_bytes / C.MIB:.1f}", f"{r['job_mib']:.0f} ({r['worst_job']})",
                             f"{r['tree_mib']:.0f}", f"{floor}", f"{r['wall_s']:.1f}", slope,
                             f"{r['verdict'].get('recommendation', '?')} (rc {r['rc']}), {'right' if right else 'WRONG'}", "MET" if ok else "MISSED"])
            finally:
                if a.keep:
                    print(f"# kept {tmp}", file=sys.stderr)
                else:
                    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nMachine: {C.machine_line()}\n")
    print(f"Peak RSS sampled with psutil every {SAMPLE_S} s: 'job' is the largest `ckptaudit.stages` job's own "
          "process tree (with the load test's child), 'tree' the whole audit's (Snakemake included).  "
          "'loader alone': the framework's own load of the largest file in a fresh process (torch included), "
          "below which the load test cannot go.  µs/tensor: slope of wall time from the size above.\n")
    print(C.md_table(["case", "count", "MiB", "peak RSS per job MiB (stage)", "tree MiB", "loader alone MiB",
                      "wall s", "µs/tensor",
                      "verdict", f"≤ {JOB_LIMIT_MIB} / {TREE_LIMIT_MIB} MiB"], rows))
    return 0 if ok_all else 1


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--_generate":
        _generate_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        raise SystemExit(0)
    raise SystemExit(main())
