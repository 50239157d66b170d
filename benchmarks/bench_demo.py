"""Target 6: wall time and peak memory of ``snakemake --cores 2 audit`` on the bundled demo.

Copies the repository's working tree to a scratch folder (default
``/tmp/bench-repo``) without ``reports/``, ``demo_run/``, ``.snakemake/`` and
``.git/``, so the shared checkout is not touched, then, ``--repeats`` times
from a clean ``reports/`` and ``demo_run/``, runs there

    /usr/bin/time -v /work/venv/bin/snakemake --cores 2 audit

(the demo rule trains the tiny GPT and stages the incident, then every stage
runs), and once more on the finished copy (the no-op re-run).  Jobs run
``python -m ckptaudit.stages`` with the copy as working directory, so they
import the copied package.

    /work/venv/bin/python benchmarks/bench_demo.py [--repeats 3] [--dest /tmp/bench-repo]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SKIP = {"reports", "demo_run", ".snakemake", ".git", "__pycache__", ".pytest_cache", ".hypothesis"}


def copy_repo(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)

    def ignore(d, names):
        top = Path(d).resolve() == C.REPO
        return [n for n in names if n in ("__pycache__", ".pytest_cache") or (top and n in SKIP)
                or n.endswith(".egg-info")]

    shutil.copytree(C.REPO, dest, ignore=ignore, symlinks=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--dest", default="/tmp/bench-repo")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    dest = Path(a.dest)
    cmd = [C.SNAKEMAKE, "--cores", str(a.cores), "audit"]
    runs = []
    try:
        copy_repo(dest)
        for i in range(a.repeats):
            for d in ("reports", "demo_run", ".snakemake"):
                shutil.rmtree(dest / d, ignore_errors=True)
            r = C.run_gnu_time(cmd, cwd=dest)
            runs.append(r)
            print(f"# run {i + 1}: {r['wall_s']:.1f} s", file=sys.stderr)
        again = C.run_gnu_time(cmd, cwd=dest)
        nothing = "Nothing to be done" in again["stderr"] + again["stdout"]
        from ckptaudit.workflow.support import report_folder

        out = dest / "reports" / report_folder(str(dest / "demo_run"))
        bench = C.read_benchmark_tsvs(out)
        verdict = json.loads((out / "verdict.json").read_text())

        walls = [r["wall_s"] for r in runs]
        rss = [r["max_rss_mib"] for r in runs]
        cpu = [r["cpu_s"] for r in runs]
        other = [r["other_cpu_s"] for r in runs]
        print(f"\nMachine: {C.machine_line()}\n")
        print(f"Demo run (config demo: defaults), copy of the working tree at {dest}; {a.repeats} runs from a clean "
              f"reports/ and demo_run/. Verdict: {verdict.get('recommendation')} "
              f"(rollback {(verdict.get('rollback') or {}).get('unit')}).\n")
        print(C.md_table(
            ["invocation", "median wall s", "min s", "max s", "median CPU s (tree)", "median others' CPU s",
             "peak RSS MiB (largest process, median)", "max"],
            [["`snakemake --cores 2 audit` (clean)", f"{C.median(walls):.1f}", f"{min(walls):.1f}",
              f"{max(walls):.1f}", f"{C.median(cpu):.1f}", f"{C.median(other):.0f}", f"{C.median(rss):.0f}",
              f"{max(rss):.0f}"],
             ["same, re-run (no-op)", f"{again['wall_s']:.2f}", "–", "–", f"{again['cpu_s']:.1f}",
              f"{again['other_cpu_s']:.0f}", f"{again['max_rss_mib']:.0f}",
              f"'Nothing to be done': {nothing}"]]))
        stages = {}
        for b in bench:
            s = stages.setdefault(b["stage"], {"n": 0, "s": 0.0, "rss": 0.0})
            s["n"] += 1
            s["s"] += C.as_float(b.get("s"))
            v = C.as_float(b.get("max_rss"))
            if v == v:
                s["rss"] = max(s["rss"], v)
        print("\nLast clean run, per stage (Snakemake `benchmark:` files; max_rss sampled every 0.5 s):\n")
        print(C.md_table(["stage", "jobs", "sum s", "max max_rss MiB"],
                         [[k, v["n"], f"{v['s']:.1f}", f"{v['rss']:.0f}"] for k, v in stages.items()]))
    finally:
        if not a.keep:
            shutil.rmtree(dest, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
