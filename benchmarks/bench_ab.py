"""The whole audit of one run by two checkouts, back to back: is the code after a change no slower than before?

Issue 44 asks that the house move leaves the audit's wall time on the 1,000-unit benchmark and the 3 GiB run no
slower, "before and after measured back to back".  Each of ``--rounds`` rounds runs, in a rotated order, one audit
per ``--code`` checkout (``python -m ckptaudit.cli audit RUN --out OUT --cores N --json`` with ``PYTHONPATH`` set to
the checkout, so its package and its Snakefile are the ones used; a fresh ``OUT`` each time).  Reported per checkout:
each round's wall time and the CPU seconds of the audit's process tree (``RUSAGE_CHILDREN`` after the wait), their
medians, the median of the per-round ratios against the first checkout, and whether every audit gave the same
recommendation and rollback point.  Each checkout's package is byte-compiled first, as an install is.  The load average is printed before and after (the machine may be shared).

    python benchmarks/bench_ab.py --run RUN --code BEFORE_CHECKOUT --code AFTER_CHECKOUT [--rounds 3] [--cores 2]

A run: ``bench_onepass.build_run`` (3 ``torch.save`` units, ``--size-gib`` in all) or ``bench_scale.py --keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def audit_once(code: Path, run: Path, cores: int, out: Path) -> dict:
    """One audit of ``run`` by the checkout ``code``: wall s, CPU s of the process tree, exit code, verdict."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "audit", str(run), "--out", str(out),
                        "--cores", str(cores), "--json"], env=env, cwd=str(code), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    verdict = {}
    vj = out / "verdict.json"
    if vj.is_file():
        v = json.loads(vj.read_text())
        verdict = {"recommendation": v.get("recommendation"), "rollback": v.get("rollback")}
    return {"wall_s": wall, "cpu_s": cpu, "rc": p.returncode, "verdict": verdict,
            "err": p.stderr[-500:] if p.returncode not in (0, 1, 2) else ""}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--code", action="append", required=True, type=Path, help="a checkout (give two or more)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    a = ap.parse_args(argv)
    codes = [c.resolve() for c in a.code]
    for c in codes:  # as a regular install is: where PYTHONDONTWRITEBYTECODE is set, an uncompiled checkout
        # compiles every module in every job (~0.7 s of wall on a 1 GiB audit here), which is no property of the code
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(c / "ckptaudit")], check=True)
    print(f"load before: {os.getloadavg()}", flush=True)
    got = {str(c): [] for c in codes}
    scratch = Path(tempfile.mkdtemp(prefix="ckptaudit-ab-"))
    try:
        for r in range(a.rounds):
            order = codes[r % len(codes):] + codes[:r % len(codes)]
            for c in order:
                out = scratch / f"out-{r}-{codes.index(c)}"
                res = audit_once(c, a.run, a.cores, out)
                shutil.rmtree(out, ignore_errors=True)
                got[str(c)].append(res)
                print(f"round {r} {c.name}: wall {res['wall_s']:.2f} s, cpu {res['cpu_s']:.2f} s, rc {res['rc']}, "
                      f"{res['verdict']}{(' ERR ' + res['err']) if res['err'] else ''}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"load after: {os.getloadavg()}")
    base = got[str(codes[0])]
    verdicts = {json.dumps(x["verdict"], sort_keys=True) for rs in got.values() for x in rs}
    for c in codes:
        rs = got[str(c)]
        ratio = statistics.median(x["wall_s"] / b["wall_s"] for x, b in zip(rs, base))
        cratio = statistics.median(x["cpu_s"] / b["cpu_s"] for x, b in zip(rs, base))
        print(f"| {c.name} | wall median {statistics.median(x['wall_s'] for x in rs):.2f} s | "
              f"cpu median {statistics.median(x['cpu_s'] for x in rs):.2f} s | wall ratio {ratio:.3f} | "
              f"cpu ratio {cratio:.3f} |")
    print(f"verdicts equal: {len(verdicts) == 1} ({sorted(verdicts)})")
    return 0 if len(verdicts) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
