"""Target 5: non-finite value scan (``ckptaudit.stages.state.scan_values``) vs SHA-256.

Builds (in a child process) the same ~1 GiB checkpoint as ``bench_memory.py``,
gets its tensor table from the static scan (``ckptaudit.stages.scan_units``, no
unpickling), then, page cache warm:

* throughput: one child process alternates ``scan_values(run_dir, tensors,
  16 MiB)`` (the stage's default ``state.chunk_mib``) and
  ``hashlib.file_digest(f, "sha256")`` of the same file ``--repeats`` times
  (order shuffled per pair), timing each with ``perf_counter`` and
  ``process_time``; ratios are medians of per-pair ratios, so load from other
  processes hits both sides of a pair;
* memory: each alone in a fresh process under ``/usr/bin/time -v`` (peak RSS),
  plus "idle" (the scan child without the call: interpreter, numpy, ckptaudit,
  the tensor table).

    /work/venv/bin/python benchmarks/bench_scan.py [--size-gib 1] [--repeats 3] [--chunk-mib 16]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402


def child(mode: str, run_dir: str, tensors_json: str, chunk_mib: int, repeats: int) -> None:
    """Runs in the measured process; prints JSON."""
    import hashlib
    import random

    import numpy  # noqa: F401 - imported by scan_values itself; here so idle counts it

    from ckptaudit.stages.state import scan_values

    ts = json.loads(Path(tensors_json).read_text())
    path = Path(run_dir) / ts[0]["file"]

    def sha():
        with open(path, "rb") as fh:
            hashlib.file_digest(fh, "sha256").hexdigest()
        return path.stat().st_size

    def scan():
        vals = scan_values(Path(run_dir), ts, chunk_mib << 20)
        return sum(t["nbytes"] for t in ts if t["name"] in vals)

    fns = {"scan": scan, "sha256": sha}
    if mode == "idle":
        print("{}")
        return
    if mode in fns:
        print(json.dumps({"bytes": fns[mode]()}))
        return
    rng = random.Random(0)
    out = []
    for _ in range(repeats):
        names = list(fns)
        rng.shuffle(names)
        pair = {}
        for k in names:
            w, c = time.perf_counter(), time.process_time()
            n = fns[k]()
            pair[k] = (time.perf_counter() - w, time.process_time() - c, n)
        out.append(pair)
    print(json.dumps(out))


def tensor_table(run_dir: Path, dest: Path) -> int:
    code = ("import json, sys; from pathlib import Path; from ckptaudit import pipeline; from ckptaudit.stages import cli as stages; from ckptaudit.stages import inventory; "
            "rd = Path(sys.argv[1]); u = inventory.run_inventory(str(rd))['units'][0]; "
            "s, t, i = stages.scan_units(rd, [u], pipeline.default_config()); "
            "Path(sys.argv[2]).write_text(json.dumps(t)); print(len(t))")
    p = C.run_gnu_time([C.PYTHON, "-c", code, str(run_dir), str(dest)])
    return int(p["stdout"].split()[-1])


def run_child(mode: str, run_dir: Path, tj: Path, chunk_mib: int, repeats: int = 1):
    return C.run_gnu_time([C.PYTHON, __file__, "--child", mode, "--run-dir", str(run_dir), "--tensors", str(tj),
                           "--chunk-mib", str(chunk_mib), "--repeats", str(repeats)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-mib", type=int, default=16)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--child")
    ap.add_argument("--run-dir")
    ap.add_argument("--tensors")
    a = ap.parse_args(argv)
    if a.child:
        child(a.child, a.run_dir, a.tensors, a.chunk_mib, a.repeats)
        return 0
    C.require_gnu_time()
    tmp = Path(tempfile.mkdtemp(prefix="ckptaudit-bench-scan-", dir=a.tmp))
    run_dir = tmp / "run"
    try:
        facts = C.build_big_in_child(run_dir / "ckpt_001000.pt", a.size_gib)
        tj = tmp / "tensors.json"
        n_t = tensor_table(run_dir, tj)
        print(f"# built {facts['size_bytes'] / C.GIB:.3f} GiB in {facts['build_s']:.1f} s; {n_t} tensors",
              file=sys.stderr)
        run_child("sha256", run_dir, tj, a.chunk_mib)  # warm the page cache
        r = run_child("paired", run_dir, tj, a.chunk_mib, a.repeats)
        pairs = json.loads(r["stdout"])
        rss = {m: run_child(m, run_dir, tj, a.chunk_mib)["max_rss_mib"] for m in ("scan", "sha256", "idle")}
        ratio_w = C.median([p["sha256"][0] / p["scan"][0] for p in pairs])
        ratio_c = C.median([p["sha256"][1] / p["scan"][1] for p in pairs])
        rows = []
        for m, label in (("scan", f"`scan_values` (chunk {a.chunk_mib} MiB)"),
                         ("sha256", "`hashlib.file_digest` SHA-256")):
            secs = [p[m][0] for p in pairs]
            cpus = [p[m][1] for p in pairs]
            gib = pairs[0][m][2] / C.GIB
            med = C.median(secs)
            rows.append([label, f"{gib:.3f}", f"{med:.2f}", f"{min(secs):.2f}", f"{max(secs):.2f}",
                         f"{gib / med:.2f}", f"{gib / C.median(cpus):.2f}",
                         f"{ratio_w:.2f} (CPU {ratio_c:.2f})" if m == "scan" else "1",
                         f"{rss[m]:.0f}", f"{rss[m] - rss['idle']:+.0f}" if m == "scan" else "–"])
        print(f"\nMachine: {C.machine_line()}\n")
        print(f"Checkpoint: {facts['size_bytes'] / C.GIB:.3f} GiB, {n_t} tensors (float32); {a.repeats} shuffled "
              f"pairs in one process, page cache warm; others' CPU during the pairs {r['other_cpu_s']:.0f} s over "
              f"{r['wall_s']:.0f} s; idle scan child RSS {rss['idle']:.0f} MiB.\n")
        print(C.md_table(["what", "GiB read", "median wall s", "min s", "max s", "GiB/s (wall)", "GiB/s (CPU time)",
                          "speed × SHA-256 (median of pairs)", "peak RSS MiB", "RSS over idle MiB"], rows))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
