"""CPU milliseconds per unit of each per-part stage, in process and without its imports, for two checkouts.

Issue 45 asks for the CPU per small unit summed over the stages (≤ 2 ms).  A Snakemake job's ``benchmark:`` CPU
includes its Python start and imports (~0.35 CPU-s a job here, most of a 128-unit part's light stages), so it hides
what a unit itself costs.  This runs the stage functions the rules' CLI runs (``ckptaudit.stages.cli.stage_hash``,
``stage_scan``, ``stage_structure``, ``stage_configdiff``, ``stage_state``, tables written as the jobs write them)
on parts of an audit already made (its ``work/inventory.json``, ``config.json``, ``target.json``), in one process per
checkout and round (``PYTHONPATH`` set to the checkout), imports done first; the first part warms up lazy imports and
is not counted.  The load stage (a ``torch.load`` child per file) is left out.  Rounds interleave the checkouts;
each round prints one JSON line per checkout, then the medians and whether the two checkouts' tables are equal but
for their timing columns (bytefacts rows compared as sets: the hash job writes each unit's as it ends).

    python benchmarks/bench_stage_cpu.py --audit-out OUT --code BEFORE --code AFTER --parts p0002 p0003 p0004 p0005
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STAGES = ("hash", "scan", "structure", "configdiff", "state")
#: columns that hold timings (or when), not findings: left out of the comparison
TIMING = {"hash_seconds", "scan_seconds", "load_seconds", "hashed_at_utc", "walk_seconds"}


def _child(audit_out: str, out: str, parts: list) -> None:
    """One checkout's round (run with its PYTHONPATH): prints {"units": n, stage: CPU ms per unit, …}."""
    import time

    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from ckptaudit.stages import cli
    import ckptaudit.layouts  # noqa: F401 - imports before the clock
    import ckptaudit.stages.configdiff  # noqa: F401
    import ckptaudit.stages.hash  # noqa: F401
    import ckptaudit.stages.state  # noqa: F401
    import ckptaudit.stages.structure  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    w = f"{audit_out}/work"
    inv, cfg = cli.read_inventory(f"{w}/inventory.json"), cli._config(f"{w}/config.json")
    cpu = dict.fromkeys(STAGES, 0.0)
    n = 0
    for k, part in enumerate(parts):
        n += len(cli.part_units(inv, part)) if k else 0

        def p(t: str) -> str:
            return f"{out}/{t}-{part}.parquet"

        steps = {"hash": lambda: cli.stage_hash(inv, part, p("hash"), p("bytefacts")),
                 "scan": lambda: cli.stage_scan(inv, part, cfg, p("scan"), p("tensors"), p("imports"), p("bytefacts")),
                 "structure": lambda: cli.stage_structure(inv, part, cfg, p("scan"), p("tensors"), p("structure"),
                                                          f"{w}/target.json"),
                 "configdiff": lambda: cli.stage_configdiff(inv, part, cfg, p("scan"), p("configdiff")),
                 "state": lambda: cli.stage_state(inv, part, cfg, p("scan"), p("tensors"), p("state"), p("bytefacts"))}
        for name in STAGES:
            t0 = time.process_time()
            steps[name]()
            cpu[name] += (time.process_time() - t0) if k else 0.0
    print(json.dumps({"units": n, **{s: round(1e3 * v / max(n, 1), 3) for s, v in cpu.items()}}))


def _same_tables(a: Path, b: Path) -> list:
    """Names of the tables that differ between two checkouts' outputs (timing columns aside)."""
    import pyarrow.parquet as pq

    differ = []
    for fa in sorted(a.glob("*.parquet")):
        ta, tb = pq.read_table(fa), pq.read_table(b / fa.name)
        cols = [c for c in ta.column_names if c not in TIMING]
        ra, rb = ta.select(cols).to_pylist(), tb.select(cols).to_pylist()
        if fa.name.startswith("bytefacts"):
            ra, rb = sorted(ra, key=repr), sorted(rb, key=repr)
        if ra != rb or ta.schema.names != tb.schema.names:
            differ.append(fa.name)
    return differ


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--audit-out", required=True, help="an audit's output folder (bench_scale.py --keep)")
    ap.add_argument("--code", action="append", required=True, help="a checkout (twice: before, after)")
    ap.add_argument("--parts", nargs="+", required=True, help="parts to run; the first warms up, not counted")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        _child(a.audit_out, a.child, a.parts)
        return 0
    print(f"# load before: {os.getloadavg()}")
    got = {c: [] for c in a.code}
    with tempfile.TemporaryDirectory(prefix="bench-stage-cpu-") as tmp:
        outs = {c: Path(tmp) / str(i) for i, c in enumerate(a.code)}
        for rnd in range(a.rounds):
            for c in a.code:
                outs[c].mkdir(exist_ok=True)
                r = subprocess.run([sys.executable, __file__, "--audit-out", a.audit_out, "--parts", *a.parts,
                                    "--code", c, "--child", str(outs[c])], env={**os.environ, "PYTHONPATH": c},
                                   capture_output=True, text=True, check=True)
                got[c].append(json.loads(r.stdout.strip().splitlines()[-1]))
                print(f"round {rnd + 1} {c}: {got[c][-1]}", flush=True)
        differ = _same_tables(outs[a.code[0]], outs[a.code[-1]]) if len(a.code) > 1 else []
    for c in a.code:
        med = {s: statistics.median(r[s] for r in got[c]) for s in STAGES}
        print(f"median {c}: {json.dumps(med)}, sum {sum(med.values()):.2f} ms/unit")
    print("tables equal but for timings" if not differ else f"tables differ: {', '.join(differ)}")
    print(f"# load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
