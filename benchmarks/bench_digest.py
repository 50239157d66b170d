"""Issue 45, hash by purpose: the digests' rates per core, and the audit's cost per GiB with and without sidecars.

1. **Rates in memory** (``--rate-mib`` of random bytes, fed in 8 MiB pieces as the one pass feeds its consumers,
   ``--rate-repeats`` interleaved rounds, medians): SHA-256 (``hashlib``), BLAKE3 (``blake3``) on 1 and on 2 threads.
   GB/s per core = bytes ÷ the process's CPU seconds (a 2-thread hasher's wall rate is also given).
2. **The audit's cost per GiB**: runs of 3 ``torch.save`` units (:func:`_common.make_big_checkpoint` through
   ``bench_onepass.build_run``) of ``--run-gib`` GiB in all (default 1 and 9), built once into ``--dir``; a second
   folder of hard links to the same files without their ``.sha256`` sidecars (same inodes: same page cache).
   Each of ``--repeats`` rounds, for every size in a rotated order, back to back:

   * ``cat`` of the run's files to ``/dev/null`` (a plain read from the page cache as it is);
   * the audit of the run **without sidecars** (``ckptaudit audit RUN --out OUT --cores N``, fresh ``OUT``);
     its ``verdict.json`` must name BLAKE3 only (no SHA-256 computed);
   * the SHA-256 limit (``hashlib.file_digest`` of every file on a pool of ``--cores`` processes; limit = bytes ÷
     (cores × one process's rate), as ``bench_onepass.py``/``bench_scaling.py``);
   * the audit of the run **with sidecars**;
   * with ``--baseline-code DIR``: the audits without and with sidecars by the ckptaudit in ``DIR``
     (``PYTHONPATH``), the code before this change, for the same ratios and fixed costs; in even rounds
     before the four above, in odd rounds after them, so that neither code always runs in the same place.

Reported per round and as medians of the per-round figures: the audit's marginal cost per GiB (slope between the
smallest and the largest run) over ``cat``'s slope (target ≤ 4 × without sidecars) and over the SHA-256 limit's
slope (target ≤ 1.25 × with sidecars); the fixed cost: the smallest run's audit minus its baseline (target ≤ 2.5 s);
the load average before and after (the machine is shared: figures are indicative).

    python benchmarks/bench_digest.py [--run-gib 1 9] [--repeats 3] [--cores 2] [--dir /tmp/bench45]
                                      [--baseline-code /path/to/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import bench_onepass as O  # noqa: E402

UNITS = 3
PIECE = 8 << 20  # bytes fed at once: the one pass's buffer (ckptaudit.onepass.stream.BUFFER_BYTES)

RATE_CHILD = """
import hashlib, json, os, random, sys, time
import blake3
size, rounds, piece = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = memoryview(os.urandom(size))
def h_sha(): return hashlib.sha256()
def h_b1(): return blake3.blake3(max_threads=1)
def h_b2(): return blake3.blake3(max_threads=2)
subjects = {"SHA-256": h_sha, "BLAKE3 1 thread": h_b1, "BLAKE3 2 threads": h_b2}
out = {k: [] for k in subjects}
rng = random.Random(0)
for _ in range(rounds):
    names = list(subjects)
    rng.shuffle(names)
    for k in names:
        h = subjects[k]()
        w, c = time.perf_counter(), time.process_time()
        for i in range(0, size, piece):
            h.update(data[i:i + piece])
        h.hexdigest()
        out[k].append((time.perf_counter() - w, time.process_time() - c))
print(json.dumps(out))
"""


def rates(size: int, rounds: int) -> Dict[str, Dict[str, float]]:
    """{subject: {"core_gbps", "wall_gbps"}}: medians over ``rounds`` of bytes ÷ CPU s and bytes ÷ wall s."""
    p = subprocess.run([C.PYTHON, "-c", RATE_CHILD, str(size), str(rounds), str(PIECE)], capture_output=True,
                       text=True, check=True)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    return {k: {"core_gbps": statistics.median(size / c / 1e9 for _, c in v),
                "wall_gbps": statistics.median(size / w / 1e9 for w, _ in v)} for k, v in doc.items()}


def bare_copy(paths: List[Path], folder: Path) -> Path:
    """``folder`` holding hard links to ``paths`` (no sidecars): the same inodes, so the same cached pages."""
    folder.mkdir(parents=True, exist_ok=True)
    for p in paths:
        link = folder / p.name
        if not link.exists():
            os.link(p, link)
    return folder


def cat(paths: List[Path]) -> Dict:
    return C.run_gnu_time(["sh", "-c", 'cat "$@" > /dev/null', "cat", *map(str, paths)])


def audit(run: Path, out: Path, cores: int, code: Optional[str] = None) -> Dict:
    env = None
    if code:
        env = {**os.environ, "PYTHONPATH": code}
    shutil.rmtree(out, ignore_errors=True)
    r = C.run_gnu_time([O.CKPTAUDIT, "audit", str(run), "--out", str(out), "--cores", str(cores)], env=env,
                       check=False)
    if r["rc"] not in (0, 1, 2):
        raise RuntimeError(f"audit exit {r['rc']}\n{r['stdout'][-3000:]}\n{r['stderr'][-3000:]}")
    v = json.loads((out / "verdict.json").read_text())
    r["verdict"] = v.get("recommendation")
    r["algorithms"] = (v.get("bytes_verified") or {}).get("digest_algorithms")
    return r


def _current(run: List[Path], bare: Path, base: Path, g: float, cores: int) -> Dict:
    """One round's ``cat``, audit without sidecars, SHA-256 limit and audit with sidecars of the run of ``g`` GiB."""
    c = cat(run)
    bare_audit = audit(bare, base / f"out_bare_{g:g}", cores)
    assert bare_audit["algorithms"] == {"blake3": UNITS}, bare_audit["algorithms"]
    h = O.subject_hash(run, cores)
    side_audit = audit(base / f"run_{g:g}gib_total", base / f"out_side_{g:g}", cores)
    assert side_audit["algorithms"] == {"sha256": UNITS}, side_audit["algorithms"]
    return {"cat_s": c["wall_s"], "cat_cpu_s": c["cpu_s"], "bare_s": bare_audit["wall_s"],
            "bare_cpu_s": bare_audit["cpu_s"], "limit_s": h["limit_s"], "limit_cpu_s": h["cpu_s"],
            "side_s": side_audit["wall_s"], "side_cpu_s": side_audit["cpu_s"], "sha_rate": h["rate_bps"]}


def _before(run: List[Path], bare: Path, base: Path, g: float, cores: int, code: str) -> Dict:
    """The audits without and with sidecars by the checkout ``code`` (the code before)."""
    before = audit(bare, base / f"out_before_{g:g}", cores, code)
    side = audit(run[0].parent, base / f"out_before_side_{g:g}", cores, code)
    assert side["algorithms"] == {"sha256": UNITS}, side["algorithms"]
    return {"before_s": before["wall_s"], "before_cpu_s": before["cpu_s"], "before_side_s": side["wall_s"],
            "before_side_cpu_s": side["cpu_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-gib", type=float, nargs="+", default=[1.0, 9.0], help="GiB of each run (3 units)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/bench45", help="scratch folder (runs are kept and re-used)")
    ap.add_argument("--rate-mib", type=int, default=256)
    ap.add_argument("--rate-repeats", type=int, default=7)
    ap.add_argument("--baseline-code", default="", help="a checkout whose audit (without sidecars) is measured too")
    ap.add_argument("--skip-rates", action="store_true")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    load0 = os.getloadavg()
    t_start = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    rate = {} if a.skip_rates else rates(a.rate_mib << 20, a.rate_repeats)
    for k, v in rate.items():
        print(f"# {k}: {v['core_gbps']:.2f} GB/s per core, {v['wall_gbps']:.2f} GB/s wall", file=sys.stderr)
    sizes = sorted(a.run_gib)
    base = Path(a.dir)
    runs = {g: O.build_run(base / f"run_{g:g}gib_total", g, UNITS) for g in sizes}
    bare = {g: bare_copy(runs[g], base / f"bare_{g:g}gib_total") for g in sizes}
    gib = {g: sum(p.stat().st_size for p in runs[g]) / C.GIB for g in sizes}
    print(f"# {O.code_under_test()}; {C.machine_line()}; load {load0}", file=sys.stderr)
    rounds = []
    for r in range(a.repeats):
        order = sizes[r % len(sizes):] + sizes[:r % len(sizes)]
        row = {}
        for g in order:
            row[g] = {}
            # each audit right after its baseline (cat, the SHA-256 limit); the code before first in odd rounds
            for who in (("before", "now") if a.baseline_code and r % 2 else ("now", "before")):
                if who == "now":
                    row[g].update(_current(runs[g], bare[g], base, g, a.cores))
                elif a.baseline_code:
                    row[g].update(_before(runs[g], bare[g], base, g, a.cores, a.baseline_code))
            row[g]["load"] = os.getloadavg()[0]
            print(f"# round {r + 1} {g:g} GiB: " + ", ".join(f"{k} {v:.3g}" for k, v in row[g].items()),
                  file=sys.stderr)
        rounds.append(row)
    report(a, rounds, sizes, gib, rate, load0, os.getloadavg(), t_start)
    return 0


def report(a, rounds, sizes, gib, rate, load0, load1, t_start) -> None:
    lo, hi = sizes[0], sizes[-1]

    def slope(row, key):
        return (row[hi][key] - row[lo][key]) / (gib[hi] - gib[lo])

    table, per = [], {"bare/cat": [], "side/limit": [], "before/cat": [], "fixed_bare": [], "fixed_side": [],
                      "before side/limit": [], "fixed_before_bare": [], "fixed_before_side": []}
    for i, row in enumerate(rounds, 1):
        bc, sl = slope(row, "bare_s") / slope(row, "cat_s"), slope(row, "side_s") / slope(row, "limit_s")
        fb, fs = row[lo]["bare_s"] - row[lo]["cat_s"], row[lo]["side_s"] - row[lo]["limit_s"]
        per["bare/cat"].append(bc)
        per["side/limit"].append(sl)
        per["fixed_bare"].append(fb)
        per["fixed_side"].append(fs)
        cells = [str(i)] + [f"{row[g]['bare_s']:.2f} / {row[g]['cat_s']:.2f}; {row[g]['side_s']:.2f} / "
                            f"{row[g]['limit_s']:.2f}" for g in sizes]
        cells += [f"{bc:.2f}×", f"{sl:.2f}×", f"{fb:.2f}", f"{fs:.2f}"]
        if a.baseline_code:
            per["before/cat"].append(slope(row, "before_s") / slope(row, "cat_s"))
            per["before side/limit"].append(slope(row, "before_side_s") / slope(row, "limit_s"))
            per["fixed_before_bare"].append(row[lo]["before_s"] - row[lo]["cat_s"])
            per["fixed_before_side"].append(row[lo]["before_side_s"] - row[lo]["limit_s"])
            cells += [f"{per['before/cat'][-1]:.2f}×", f"{per['before side/limit'][-1]:.2f}×",
                      f"{per['fixed_before_bare'][-1]:.2f}", f"{per['fixed_before_side'][-1]:.2f}"]
        cells.append(" ".join(f"{row[g]['load']:.1f}" for g in sizes))
        table.append(cells)
    cpu = {"no sidecars CPU-s/GiB": [slope(row, "bare_cpu_s") for row in rounds],
           "sidecars CPU-s/GiB": [slope(row, "side_cpu_s") for row in rounds],
           "SHA-256 pool CPU-s/GiB": [slope(row, "limit_cpu_s") for row in rounds],
           "cat CPU-s/GiB": [slope(row, "cat_cpu_s") for row in rounds]}
    if a.baseline_code:
        cpu["code before, no sidecars CPU-s/GiB"] = [slope(row, "before_cpu_s") for row in rounds]
        cpu["code before, sidecars CPU-s/GiB"] = [slope(row, "before_side_cpu_s") for row in rounds]
    med = {k: statistics.median(v) for k, v in per.items() if v}
    print(f"\nMachine: {C.machine_line()}; {O.code_under_test()}; started {t_start} UTC; load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after\n")
    if rate:
        print(C.md_table(["digest (8 MiB pieces, in memory)", "GB/s per core (bytes ÷ CPU s)", "GB/s wall"],
                         [[k, f"{v['core_gbps']:.2f}", f"{v['wall_gbps']:.2f}"] for k, v in rate.items()]))
        print()
    print(f"Runs of {UNITS} torch.save units: " + ", ".join(f"{gib[g]:.2f} GiB" for g in sizes)
          + f"; --cores {a.cores}; cells: audit without sidecars s / cat s; audit with sidecars s / SHA-256 limit s.\n")
    heads = ["round"] + [f"{g:g} GiB run" for g in sizes] + [
        f"per GiB: no sidecars ÷ cat ({lo:g}→{hi:g})", "per GiB: sidecars ÷ SHA-256 limit",
        f"fixed, no sidecars − cat at {lo:g} GiB (s)", "fixed, sidecars − limit (s)"]
    if a.baseline_code:
        heads += ["per GiB: code before ÷ cat", "per GiB: code before, sidecars ÷ SHA-256 limit",
                  "fixed, code before, no sidecars (s)", "fixed, code before, sidecars (s)"]
    heads.append("load (1 min) per size")
    print(C.md_table(heads, table))
    print("\nMedians of the rounds: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    print("CPU seconds per GiB (slope of the process tree's user+sys; load-independent): "
          + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in cpu.items()))
    print(f"CPU-s of the {lo:g} GiB run (fixed part): " + ", ".join(
        f"{k} {statistics.median(row[lo][k] for row in rounds):.2f}"
        for k in ("bare_cpu_s", "side_cpu_s", "limit_cpu_s", "cat_cpu_s") + (
            ("before_cpu_s", "before_side_cpu_s") if a.baseline_code else ())))
    print(f"SHA-256 rate of one pool process (the limit's): "
          f"{statistics.median(row[g]['sha_rate'] for row in rounds for g in sizes) / 1e9:.2f} GB/s")


if __name__ == "__main__":
    raise SystemExit(main())
