"""Issue 15 acceptance: the whole audit against one SHA-256 pass over the run's bytes.

Builds (one child process per checkpoint) a run of ``--units`` real ``torch.save``
checkpoints of ``--size-gib / --units`` GiB each: a nanoGPT-style dict (model
state_dict of float32 weights, AdamW optimizer state_dict with ``exp_avg`` /
``exp_avg_sq`` moments and ``step``, ``iter_num``, ``model_args``) with a
``sha256sum``-format ``.sha256`` sidecar (what the audit's hash stage verifies;
see :func:`_common.make_big_checkpoint`).  Then, page cache warm, ``--repeats``
rounds, each running these subjects in a rotated order (interleaved, so a burst
of load from the shared machine hits every subject of a round):

* **hashing limit**: ``hashlib.file_digest(fh, "sha256")`` of every file in a
  pool of ``--cores`` processes (fresh child).  Each worker times its own files,
  so the per-process SHA-256 rate is ``bytes / sum(worker seconds)`` and the
  limit is ``bytes / (cores x rate)`` (the pool's own wall is shown too: with
  3 files on 2 cores one core hashes two of them);
* **audit**: ``ckptaudit audit RUN --out OUT --cores N`` with a fresh ``OUT``;
* **torch.load**: ``torch.load(path, weights_only=True, map_location="cpu")``
  of every file, one after another, in a fresh child (import torch included);
* **picklescan**: ``picklescan --path RUN`` (fresh process).

Reported: medians, each subject's ratio to the hashing limit (median of the
per-round ratios), the acceptance bound ``1.25 x limit + 10 s``, and per stage
the bytes read as counted by the code (``OUT/work/bytes/``, when the code writes
it) or else each stage's summed wall seconds from ``OUT/benchmarks/<stage>/*.tsv``
and the job count (one log file per job under ``OUT/logs``).

    python benchmarks/bench_onepass.py [--size-gib 3] [--units 3] [--repeats 3] [--cores 2]
                                       [--dir /tmp/bench15] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

CKPTAUDIT = str(Path(C.PYTHON).with_name("ckptaudit"))
PICKLESCAN = str(Path(C.PYTHON).with_name("picklescan"))

HASH_CHILD = """
import hashlib, json, sys, time
from multiprocessing import Pool
def one(p):
    t = time.perf_counter()
    with open(p, "rb") as fh:
        d = hashlib.file_digest(fh, "sha256").hexdigest()
    return p, d, time.perf_counter() - t
if __name__ == "__main__":
    cores, paths = int(sys.argv[1]), sys.argv[2:]
    t0 = time.perf_counter()
    with Pool(cores) as pool:
        res = pool.map(one, paths, chunksize=1)
    print(json.dumps({"wall_s": time.perf_counter() - t0, "worker_s": [r[2] for r in res],
                      "digests": {r[0]: r[1] for r in res}}))
"""

LOAD_CHILD = """
import json, sys, time
import torch
t = time.perf_counter()
n = 0
for p in sys.argv[1:]:
    obj = torch.load(p, weights_only=True, map_location="cpu")
    n += len(obj)
    del obj
print(json.dumps({"load_s": time.perf_counter() - t, "keys": n}))
"""


def code_under_test() -> str:
    """Where the audit's ``ckptaudit`` comes from (``PYTHONPATH`` may point at a snapshot of another commit)."""
    r = subprocess.run([C.PYTHON, "-c", "import ckptaudit, pathlib; print(pathlib.Path(ckptaudit.__file__).parent.parent)"],
                       capture_output=True, text=True, cwd="/")  # as the jobs: no checkout on sys.path[0]
    root = Path(r.stdout.strip() or ".")
    commit = (root / "COMMIT").read_text().strip()[:7] if (root / "COMMIT").exists() else ""
    return f"ckptaudit imported from {'the checkout' if root == C.REPO else root}" + (f" (commit {commit})" if commit else "")


def build_run(run_dir: Path, size_gib: float, units: int) -> List[Path]:
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(units):
        p = run_dir / f"ckpt_{(i + 1) * 1000:06d}.pt"
        if not (p.exists() and p.with_name(p.name + ".sha256").exists()):
            f = C.build_big_in_child(p, size_gib / units, step=(i + 1) * 1000)
            print(f"# built {p.name}: {f['size_bytes'] / C.GIB:.3f} GiB in {f['build_s']:.1f} s", file=sys.stderr)
        paths.append(p)
    return paths


def timed(cmd: List[str], **kw) -> Dict:
    """Wall, CPU of the tree and others' CPU (:func:`_common.run_gnu_time`) of ``cmd``."""
    return C.run_gnu_time(cmd, **kw)


def subject_hash(paths: List[Path], cores: int) -> Dict:
    r = timed([C.PYTHON, "-c", HASH_CHILD, str(cores), *map(str, paths)])
    doc = json.loads(r["stdout"].strip().splitlines()[-1])
    nbytes = sum(p.stat().st_size for p in paths)
    rate = nbytes / sum(doc["worker_s"])  # bytes per second of one process
    r.update(pool_wall_s=doc["wall_s"], rate_bps=rate, limit_s=nbytes / (cores * rate), digests=doc["digests"])
    return r


def subject_audit(run_dir: Path, out: Path, cores: int) -> Dict:
    shutil.rmtree(out, ignore_errors=True)
    r = timed([CKPTAUDIT, "audit", str(run_dir), "--out", str(out), "--cores", str(cores)], check=False)
    if r["rc"] not in (0, 1, 2):  # the verdict's exit code (0 newest ok, 1 roll back, 2 retrain); 3: failed
        raise RuntimeError(f"audit exit {r['rc']}\n{r['stdout'][-3000:]}\n{r['stderr'][-3000:]}")
    r["verdict"] = json.loads((out / "verdict.json").read_text()).get("recommendation")
    r["jobs"] = sum(1 for _ in (out / "logs").glob("*/*.log"))
    r["stages"] = stage_figures(out)
    r["bytes"] = code_bytes_read(out)
    return r


def subject_load(paths: List[Path]) -> Dict:
    r = timed([C.PYTHON, "-c", LOAD_CHILD, *map(str, paths)])
    r.update(json.loads(r["stdout"].strip().splitlines()[-1]))
    return r


def subject_picklescan(run_dir: Path) -> Dict:
    r = timed([PICKLESCAN, "--path", str(run_dir)], check=False)  # exit 1: something dangerous found
    if r["rc"] not in (0, 1):
        raise RuntimeError(f"picklescan exit {r['rc']}\n{r['stdout'][-2000:]}\n{r['stderr'][-2000:]}")
    r["summary"] = " ".join(line.strip() for line in r["stdout"].splitlines() if "files" in line.lower())[:200]
    return r


def stage_figures(out: Path) -> Dict[str, Dict]:
    """{stage: {jobs, s, max_rss}} from the Snakemake ``benchmark:`` files of one audit."""
    st: Dict[str, Dict] = {}
    for b in C.read_benchmark_tsvs(out):
        s = st.setdefault(b["stage"], {"jobs": 0, "s": 0.0, "max_rss": 0.0})
        s["jobs"] += 1
        s["s"] += C.as_float(b.get("s"))
        v = C.as_float(b.get("max_rss"))
        if v == v:
            s["max_rss"] = max(s["max_rss"], v)
    return st


def code_bytes_read(out: Path) -> Dict[str, Dict[str, float]]:
    """{stage: {counter: bytes}} as the code counted them, summed over the stage's jobs: the JSON files
    ``OUT/work/bytes/<stage>/<part>.json`` (``local``, ``remote_ranged``, ``remote_streamed``, ``total`` and
    any other number a stage adds, e.g. the load test's own reads); {} while the code writes none."""
    tot: Dict[str, Dict[str, float]] = {}
    for f in sorted((out / "work" / "bytes").glob("*/*.json")):
        try:
            doc = json.loads(f.read_text())
        except ValueError:
            continue
        st = tot.setdefault(str(doc.get("stage") or f.parent.name), {})
        for k, v in doc.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                st[k] = st.get(k, 0.0) + float(v)
    return tot


def _bytes_cell(b: Dict[str, float], nbytes: int) -> str:
    if not b:
        return "not counted"
    total = b.get("total", b.get("local", 0.0) + b.get("remote_ranged", 0.0) + b.get("remote_streamed", 0.0))
    extra = ", ".join(f"{k} {v:,.0f}" for k, v in b.items() if k not in ("total", "local", "remote_ranged",
                                                                          "remote_streamed", "part") and v)
    return f"{total:,.0f} ({total / nbytes:.3f}× the run's bytes)" + (f"; {extra}" if extra else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=3.0, help="total checkpoint bytes of the run")
    ap.add_argument("--units", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/bench15/onepass", help="scratch folder (run/ and out*/)")
    ap.add_argument("--keep", action="store_true", help="keep the run (re-used by the next invocation) and outs")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    tmp = Path(a.dir)
    run_dir = tmp / "run"
    need = a.size_gib * 1.1 + 1 - sum(p.stat().st_size for p in run_dir.glob("*.pt")) / C.GIB
    if C.free_gib(str(tmp.parent if tmp.parent.exists() else "/tmp")) < need:
        raise SystemExit(f"need {need:.1f} GiB free under {tmp}")
    load0 = os.getloadavg()
    t_start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    try:
        paths = build_run(run_dir, a.size_gib, a.units)
        nbytes = sum(p.stat().st_size for p in paths)
        subject_hash(paths, a.cores)  # warm the page cache (not timed)
        names = ["hash", "audit", "torch.load", "picklescan"]
        rounds: List[Dict[str, Dict]] = []
        for i in range(a.repeats):
            order = names[i % 4:] + names[:i % 4]
            rd: Dict[str, Dict] = {}
            for n in order:
                if n == "hash":
                    rd[n] = subject_hash(paths, a.cores)
                elif n == "audit":
                    rd[n] = subject_audit(run_dir, tmp / f"out{i}", a.cores)
                elif n == "torch.load":
                    rd[n] = subject_load(paths)
                else:
                    rd[n] = subject_picklescan(run_dir)
                print(f"# round {i + 1} {n}: {rd[n]['wall_s']:.2f} s", file=sys.stderr)
            rounds.append(rd)
        load1 = os.getloadavg()
        report(a, rounds, nbytes, paths, load0, load1, t_start)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(a, rounds, nbytes, paths, load0, load1, t_start) -> None:
    med = C.median
    lim = [r["hash"]["limit_s"] for r in rounds]
    limit = med(lim)
    walls = {n: [r[n]["wall_s"] for r in rounds] for n in rounds[0]}
    ratio = {n: med([r[n]["wall_s"] / r["hash"]["limit_s"] for r in rounds]) for n in rounds[0]}
    audit = med(walls["audit"])
    bound = 1.25 * limit + 10
    print(f"\nMachine: {C.machine_line()}; started {t_start} UTC; load average (1/5/15 min) "
          f"{load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} before, {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f} after; "
          f"{code_under_test()}\n")
    print(f"Run: {len(paths)} torch.save checkpoints, {nbytes / C.GIB:.3f} GiB in all ({nbytes:,} bytes), "
          f"nanoGPT-style dict (model + AdamW exp_avg/exp_avg_sq + step, iter_num, model_args), sha256sum "
          f"sidecars; {a.repeats} interleaved rounds (rotated order), page cache warm, --cores {a.cores}.\n")
    rows = []
    for n in rounds[0]:
        rows.append([n, f"{med(walls[n]):.2f}", f"{min(walls[n]):.2f}–{max(walls[n]):.2f}",
                     f"{ratio[n]:.2f}×", f"{med([r[n]['cpu_s'] for r in rounds]):.1f}",
                     f"{med([r[n]['other_cpu_s'] for r in rounds]):.0f}", f"{med([r[n]['max_rss_mib'] for r in rounds]):.0f}"])
    print(C.md_table(["subject", "median wall s", "range s", "× hashing limit (median of per-round ratios)",
                      "median CPU s (tree)", "median others' CPU s", "peak RSS MiB (largest process)"], rows))
    h = rounds[0]["hash"]
    print(f"\nHashing limit: bytes / ({a.cores} × SHA-256 rate); rate per process median "
          f"{med([r['hash']['rate_bps'] for r in rounds]) / C.GIB:.3f} GiB/s; limit median {limit:.2f} s "
          f"(pool wall median {med([r['hash']['pool_wall_s'] for r in rounds]):.2f} s).")
    print(f"Acceptance: audit median {audit:.1f} s vs bound 1.25 × {limit:.2f} + 10 = {bound:.1f} s: "
          f"{'MET' if audit <= bound else 'MISSED'}; audit / limit {ratio['audit']:.2f}×, "
          f"torch.load / limit {ratio['torch.load']:.2f}×, picklescan / limit {ratio['picklescan']:.2f}×; "
          f"audit / torch.load {med([r['audit']['wall_s'] / r['torch.load']['wall_s'] for r in rounds]):.2f}×.")
    verdicts = sorted({r["audit"]["verdict"] for r in rounds})
    print(f"Audit verdicts: {verdicts}; jobs per audit {sorted({r['audit']['jobs'] for r in rounds})}; "
          f"picklescan: {rounds[-1]['picklescan']['summary']!r}; digests equal the sidecars: "
          f"{all(h['digests'][str(p)] in p.with_name(p.name + '.sha256').read_text() for p in paths)}")
    # per stage: the audit round with the median wall
    mid = sorted(rounds, key=lambda r: r["audit"]["wall_s"])[len(rounds) // 2]["audit"]
    srows = []
    for stage, s in mid["stages"].items():
        srows.append([stage, s["jobs"], f"{s['s']:.2f}", f"{s['max_rss']:.0f}",
                      _bytes_cell(mid["bytes"].get(stage, {}), nbytes)])
    for stage, b in mid["bytes"].items():
        if stage not in mid["stages"]:
            srows.append([stage, "–", "–", "–", _bytes_cell(b, nbytes)])
    if mid["bytes"]:
        whole = sum(b.get("total", 0.0) for b in mid["bytes"].values())
        srows.append(["whole audit", "", f"{mid['wall_s']:.1f} (wall)", "", _bytes_cell({"total": whole}, nbytes)])
    print(f"\nPer stage, the median audit ({mid['wall_s']:.1f} s; Snakemake `benchmark:` files, bytes from "
          f"OUT/work/bytes/ {'(counted by the code)' if mid['bytes'] else '(absent: the code counts none yet)'}):\n")
    print(C.md_table(["stage", "jobs", "sum wall s", "max max_rss MiB (sampled)", "bytes read"], srows))


if __name__ == "__main__":
    raise SystemExit(main())
