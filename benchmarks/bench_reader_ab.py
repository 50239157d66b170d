"""Reader side, A/B: ``safe_load_checkpoint`` of this checkout against another checkout, on one run (issue 23).

``bench_reader.py`` writes a fresh run for each version and measures each version's rounds apart, so on a
noisy machine (page-cache writeback after the run is written, other jobs) a change smaller than the noise
does not show.  This script measures both versions on the *same* run, alternating fresh processes: each
process imports its checkout (``sys.path``), makes one warm-up call, then ``--calls`` timed calls, each
followed by the baseline in the same process (as ``bench_reader.py``'s: SHA-256 of every unit the reader
examined byte by byte, ``ckpt.examined``, then ``torch.load(weights_only=True)`` of the one it returned).  A
process's figure is the median of its calls; the ratio is the median of its per-call reader ÷ baseline ratios.  Printed per version: the per-process medians and the median over processes.

    python benchmarks/bench_reader_ab.py --other /path/to/older/checkout [--run DIR | --units 16 --unit-mib 256
        [--published]] [--rounds 6] [--calls 3] [--dir /tmp]

Without ``--run`` a run of ``--units`` nanoGPT-style units is written first (as ``bench_reader.py`` does: plain
``torch.save`` files, or with ``--published`` units of ``ckptaudit.publish.save``) and removed afterwards.
Prints a Markdown section with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

CHILD = r"""
import sys, time, hashlib, logging, statistics, json
sys.path.insert(0, sys.argv[1])
import torch
from pathlib import Path
from ckptaudit import safe_load_checkpoint
logging.getLogger("ckptaudit").setLevel(logging.ERROR)
run, calls = Path(sys.argv[2]), int(sys.argv[3])
safe_load_checkpoint(run)
R, B = [], []
for _ in range(calls):
    t = time.perf_counter(); c = safe_load_checkpoint(run); R.append(time.perf_counter() - t)
    t = time.perf_counter()
    for u in c.examined:
        with open(run / u, "rb") as f:
            hashlib.file_digest(f, "sha256")
    torch.load(run / c.unit, weights_only=True); B.append(time.perf_counter() - t)
print(json.dumps({"reader": statistics.median(R), "baseline": statistics.median(B),
                  "ratio": statistics.median(r / b for r, b in zip(R, B)), "unit": c.unit}))
"""


def one(tree: Path, run: Path, calls: int) -> dict:
    r = subprocess.run([C.PYTHON, "-c", CHILD, str(tree), str(run), str(calls)], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--other", required=True, help="the other checkout (its folder holds ckptaudit/)")
    ap.add_argument("--run", help="an existing run folder (else one is written)")
    ap.add_argument("--units", type=int, default=16)
    ap.add_argument("--unit-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--published", action="store_true", help="units written by ckptaudit.publish.save")
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    trees = {"this checkout": C.REPO, "other": Path(a.other).resolve()}
    base = None
    if a.run:
        run = Path(a.run)
    else:
        from bench_reader import make_run

        base = Path(tempfile.mkdtemp(prefix="bench-reader-ab-", dir=a.dir))
        run = base / "run"
        make_run(run, a.units, a.unit_mib, a.published)
    load_before = os.getloadavg()
    try:
        got = {k: [] for k in trees}
        for _ in range(a.rounds):
            for k, tree in trees.items():
                got[k].append(one(tree, run, a.calls))
    finally:
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    rows = []
    for k, xs in got.items():
        rows.append([k, str(trees[k]), xs[0]["unit"], ", ".join(f"{x['reader']:.3f}" for x in xs),
                     f"{statistics.median(x['reader'] for x in xs):.3f}",
                     f"{statistics.median(x['baseline'] for x in xs):.3f}",
                     ", ".join(f"{x['ratio']:.2f}" for x in xs), f"{statistics.median(x['ratio'] for x in xs):.2f}"])
    print(f"### safe_load_checkpoint A/B on one run ({run})\n")
    print(C.machine_line() + "\n")
    print(f"load average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print(C.md_table(["version", "tree", "returned", "reader s per process", "reader s (median)",
                      "baseline s (median)", "ratio per process", "ratio (median, ≤ 1.25)"], rows))
    print(f"\n{a.rounds} rounds of one fresh process per version, alternating; {a.calls} calls each after a warm-up.")


if __name__ == "__main__":
    main()
