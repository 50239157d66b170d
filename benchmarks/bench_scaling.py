"""Issue 22 acceptance: the audit's cost follows bytes, not parts.

Runs of 3 real ``torch.save`` checkpoints (with ``.sha256`` sidecars; :func:`_common.make_big_checkpoint`)
of ``--run-gib`` GiB in all (default 1, 3, 9: units of 1/3, 1 and 3 GiB; the largest run fits the page cache
of a 24 GiB machine, so every subject reads warm pages), built once into ``--dir``.
Then ``--repeats`` rounds; each round, for every size in a rotated order, the hashing limit
(``hashlib.file_digest`` of every file in a pool of ``--cores`` processes; limit = bytes ÷ (cores × one
process's SHA-256 rate), as in ``bench_onepass.py``) and the audit (``ckptaudit audit RUN --out OUT --cores N``,
fresh ``OUT``), back to back, so a burst of load from the shared machine hits both.

Reported per round and as medians:

* **marginal cost per GiB**: the audit's wall slope between the smallest and the largest run, over the limit's
  slope between the same runs (target ≤ 1.25×), and the same between neighbouring sizes;
* **fixed cost**: the audit of the smallest run minus its limit (target ≤ 2.5 s on a quiet machine);
* jobs per audit and the verdict; others' CPU seconds meanwhile (the machine's load).

    python benchmarks/bench_scaling.py [--run-gib 1 3 9] [--repeats 3] [--cores 2] [--dir /tmp/bench22]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import bench_onepass as O  # noqa: E402

UNITS = 3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-gib", type=float, nargs="+", default=[1.0, 3.0, 9.0], help="GiB of each run (3 units)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/bench22", help="scratch folder (runs are kept and re-used)")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    sizes = sorted(a.run_gib)
    base = Path(a.dir)
    runs = {g: O.build_run(base / f"run_{g:g}gib_total", g, UNITS) for g in sizes}
    nbytes = {g: sum(p.stat().st_size for p in runs[g]) for g in sizes}
    print(f"# {O.code_under_test()}; {C.machine_line()}", file=sys.stderr)
    rounds = []
    for r in range(a.repeats):
        order = sizes[r % len(sizes):] + sizes[:r % len(sizes)]
        row = {}
        for g in order:
            h = O.subject_hash(runs[g], a.cores)
            au = O.subject_audit(base / f"run_{g:g}gib_total", base / f"out_{g:g}gib", a.cores)
            row[g] = {"limit_s": h["limit_s"], "audit_s": au["wall_s"], "jobs": au["jobs"], "verdict": au["verdict"],
                      "others": h["other_cpu_s"] + au["other_cpu_s"]}
            print(f"# round {r + 1} {g:g} GiB run: limit {h['limit_s']:.2f} s, audit {au['wall_s']:.2f} s, "
                  f"{au['jobs']} jobs, {au['verdict']}, others {row[g]['others']:.0f} CPU-s", file=sys.stderr)
        rounds.append(row)
    gib = {g: nbytes[g] / C.GIB for g in sizes}

    def slope(row, lo, hi, key):
        return (row[hi][key] - row[lo][key]) / (gib[hi] - gib[lo])

    lo, hi = sizes[0], sizes[-1]
    table = []
    for i, row in enumerate(rounds, 1):
        cells = [str(i)]
        for g in sizes:
            cells.append(f"{row[g]['audit_s']:.2f} / {row[g]['limit_s']:.2f} ({row[g]['jobs']} jobs)")
        cells.append(f"{slope(row, lo, hi, 'audit_s'):.3f} / {slope(row, lo, hi, 'limit_s'):.3f} = "
                     f"{slope(row, lo, hi, 'audit_s') / slope(row, lo, hi, 'limit_s'):.2f}×")
        cells.append(f"{row[lo]['audit_s'] - row[lo]['limit_s']:.2f}")
        cells.append(f"{sum(row[g]['others'] for g in sizes):.0f}")
        table.append(cells)
    print(f"\nMachine: {C.machine_line()}; {O.code_under_test()}\n")
    print(f"Runs of {UNITS} units: " + ", ".join(f"{gib[g]:.2f} GiB" for g in sizes)
          + f"; --cores {a.cores}; cells: audit wall s / hashing limit s (jobs).\n")
    print(C.md_table(["round"] + [f"{g:g} GiB run" for g in sizes]
                     + [f"s/GiB audit / limit ({lo:g}→{hi:g} GiB)", f"fixed: audit − limit at {lo:g} GiB (s)",
                        "others' CPU s"], table))
    ratio = C.median([slope(r, lo, hi, "audit_s") / slope(r, lo, hi, "limit_s") for r in rounds])
    fixed = C.median([r[lo]["audit_s"] - r[lo]["limit_s"] for r in rounds])
    steps = []
    for s0, s1 in zip(sizes, sizes[1:]):
        steps.append(f"{s0:g}→{s1:g} GiB "
                     f"{C.median([slope(r, s0, s1, 'audit_s') / slope(r, s0, s1, 'limit_s') for r in rounds]):.2f}×")
    verdicts = sorted({r[g]["verdict"] for r in rounds for g in sizes})
    print(f"\nMarginal cost per GiB (median of per-round ratios): {ratio:.2f}× the limit's "
          f"({'MET' if ratio <= 1.25 else 'MISSED'} ≤ 1.25×); between neighbours: {', '.join(steps)}.")
    print(f"Fixed cost at {lo:g} GiB (median of audit − limit): {fixed:.2f} s "
          f"({'MET' if fixed <= 2.5 else 'MISSED'} ≤ 2.5 s; the target is for a quiet machine).")
    print(f"Verdicts: {verdicts}")
    for g in sizes:
        shutil.rmtree(base / f"out_{g:g}gib", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
