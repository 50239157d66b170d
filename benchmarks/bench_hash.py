"""Target 1: SHA-256 throughput and memory of ``ckptaudit.stages.hash.sha256_file``.

Compares, on the same random file (page cache warm):
``ckptaudit.stages.hash.sha256_file`` vs ``hashlib.file_digest`` vs coreutils
``sha256sum``.

* Throughput: one child process alternates the two Python calls ``--repeats``
  times (order shuffled per pair) and times each with ``perf_counter`` (wall)
  and ``process_time`` (CPU); the ratio is the median of per-pair ratios, so a
  burst of load from other processes hits both sides of a pair.  ``sha256sum``
  runs as its own process (wall clock, includes its ~1 ms exec).
* Memory: each Python call also runs alone in a fresh process under
  ``/usr/bin/time -v`` (peak RSS), on the big file and on a 16x smaller one
  (constant memory: no growth with file size); "idle" is the same child
  without the hash call (interpreter + imports).

    /work/venv/bin/python benchmarks/bench_hash.py [--size-gib 1] [--repeats 7]

Target: ckptaudit ≥ 0.95× hashlib.file_digest throughput, constant memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

RSS_CHILD = {
    "ckptaudit.stages.hash.sha256_file": (
        "import sys; from ckptaudit.stages.hash import sha256_file; print(sha256_file(sys.argv[1]))"),
    "hashlib.file_digest": (
        "import sys, hashlib; fh = open(sys.argv[1], 'rb'); print(hashlib.file_digest(fh, 'sha256').hexdigest())"),
}
IDLE = {
    "ckptaudit.stages.hash.sha256_file": "import sys; from ckptaudit.stages.hash import sha256_file; print('')",
    "hashlib.file_digest": "import sys, hashlib; fh = open(sys.argv[1], 'rb'); print('')",
}
PAIRED = """
import hashlib, json, random, sys, time
from ckptaudit.stages.hash import sha256_file
path, n = sys.argv[1], int(sys.argv[2])
def fd(p):
    with open(p, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
fns = {"ckptaudit.stages.hash.sha256_file": sha256_file, "hashlib.file_digest": fd}
rng = random.Random(0)
out = []
for _ in range(n):
    pair, digests = {}, set()
    names = list(fns)
    rng.shuffle(names)
    for k in names:
        w, c = time.perf_counter(), time.process_time()
        digests.add(fns[k](path))
        pair[k] = (time.perf_counter() - w, time.process_time() - c)
    assert len(digests) == 1, digests
    out.append(pair)
print(json.dumps(out))
"""


def make_file(path: Path, size: int) -> None:
    block = 64 << 20
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(block, left)
            f.write(os.urandom(n))
            left -= n


def rss_of(method: str, path: Path, idle: bool = False) -> float:
    if method == "sha256sum":
        return C.run_gnu_time(["sha256sum", str(path)])["max_rss_mib"]
    return C.run_gnu_time([C.PYTHON, "-c", (IDLE if idle else RSS_CHILD)[method], str(path)])["max_rss_mib"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tmp", default="/tmp")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    size = int(a.size_gib * C.GIB)
    small = size // 16
    big_p = Path(a.tmp) / f"ckptaudit-bench-hash-{os.getpid()}.bin"
    small_p = Path(a.tmp) / f"ckptaudit-bench-hash-{os.getpid()}-small.bin"
    methods = ["ckptaudit.stages.hash.sha256_file", "hashlib.file_digest", "sha256sum"]
    try:
        t0 = time.perf_counter()
        make_file(big_p, size)
        make_file(small_p, small)
        print(f"# made {size / C.GIB:.3g} GiB + {small / C.MIB:.0f} MiB random files in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        C.run_gnu_time(["sha256sum", str(big_p)])  # warm the page cache
        r = C.run_gnu_time([C.PYTHON, "-c", PAIRED, str(big_p), str(a.repeats)])
        pairs = json.loads(r["stdout"])
        ck, fdg = "ckptaudit.stages.hash.sha256_file", "hashlib.file_digest"
        sums = [C.run_gnu_time(["sha256sum", str(big_p)])["wall_s"] for _ in range(max(3, a.repeats // 2))]
        rss = {m: rss_of(m, big_p) for m in methods}
        small_rss = {m: rss_of(m, small_p) for m in methods}
        idle_rss = {m: rss_of(m, small_p, idle=True) for m in methods[:2]}
        wall = {m: [p[m][0] for p in pairs] for m in (ck, fdg)}
        cpu = {m: [p[m][1] for p in pairs] for m in (ck, fdg)}
        wall["sha256sum"] = sums
        ratio_w = C.median([p[fdg][0] / p[ck][0] for p in pairs])
        ratio_c = C.median([p[fdg][1] / p[ck][1] for p in pairs])
        gib = size / C.GIB
        rows = []
        for m in methods:
            med = C.median(wall[m])
            rows.append([f"`{m}`", f"{med:.3f}", f"{min(wall[m]):.3f}", f"{max(wall[m]):.3f}", f"{gib / med:.2f}",
                         f"{gib / C.median(cpu[m]):.2f}" if m in cpu else "–",
                         f"{ratio_w:.3f} (CPU {ratio_c:.3f})" if m == ck else
                         ("1" if m == fdg else f"{C.median(wall[fdg]) / med:.3f}"),
                         f"{rss[m]:.1f}", f"{small_rss[m]:.1f}", f"{idle_rss[m]:.1f}" if m in idle_rss else "–"])
        print(f"\nMachine: {C.machine_line()}\n")
        print(f"File: {gib:.3g} GiB of os.urandom bytes (page cache warm); {a.repeats} shuffled pairs in one "
              f"process; others' CPU during the pairs: {r['other_cpu_s']:.0f} s over {r['wall_s']:.0f} s "
              "(load from other processes).\n")
        print(C.md_table(["method", "median wall s", "min s", "max s", "GiB/s (wall)", "GiB/s (CPU time)",
                          "× file_digest (median of pairs)", f"peak RSS MiB ({gib:.3g} GiB)",
                          f"peak RSS MiB ({small / C.MIB:.0f} MiB)", "idle RSS MiB"], rows))
        grow = rss[ck] - small_rss[ck]
        ok = ratio_w >= 0.95 and grow < 8
        print(f"\nckptaudit / file_digest throughput ratio {ratio_w:.3f} wall, {ratio_c:.3f} CPU time (target "
              f"≥ 0.95); peak RSS {gib:.3g} GiB vs {small / C.MIB:.0f} MiB file differs by {grow:+.1f} MiB "
              f"(constant memory: < 8 MiB growth) → target {'MET' if ok else 'MISSED'}")
    finally:
        for p in (big_p, small_p):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
