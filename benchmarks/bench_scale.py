"""Targets 2 and 3: a 1,000-unit run on 2 cores; re-runs on an unchanged / grown run.  Issue 22: runs of
50,000 and 200,000 files (``--shape dcp`` or ``--shape files``, see below).

1. Generates N small but real checkpoints with :func:`ckptaudit.demo.train`
   (a tiny nanoGPT GPT, 1 layer, n_embd 16: ``model`` state_dict, AdamW
   ``optimizer``, LambdaLR ``scheduler``, ``rng``, ``iter_num`` …, one real
   optimizer step per checkpoint) with ``sha256sum`` sidecars, written with
   :func:`ckptaudit.demo.serialize` (no fsync, to keep generation short).  The
   checkpoint of step N+1 is kept aside for step 3.
2. Times ``snakemake --cores 2 audit --config run_dir=RUN out_dir=OUT`` on the
   repository's Snakefile (Snakemake's ``.snakemake/`` goes to a temp workdir).
3. With ``reuse=True`` (``--reuse``): runs the same command again on the unchanged
   run (expects "Nothing to be done" and no file under OUT rewritten), then adds
   the step N+1 unit and runs it once more (expects inventory + the last part's six
   jobs + report only).  Steps 2 and 3 pass ``reuse=True`` so the first audit keys
   its parts the way the re-runs do (its cost is the same as without).
4. Runs it once more without ``reuse`` (the default, and the nightly case): every
   byte is hashed again (docs/rerun.md), so it costs about what the first audit did.

    /work/venv/bin/python benchmarks/bench_scale.py [--units 1000] [--cores 2] [--keep]

Targets: first run ≤ 120 s wall; unchanged ``--reuse`` re-run ≤ 5 % of the first, no part job; the
default re-run's cost reported (no target: it is a full audit by design).

Issue 22 (many files; :mod:`scale_runs` generates them, the newest unit damaged):

    python benchmarks/bench_scale.py --shape dcp --saves 48 --ranks 1024 --cores 2    # 49,200 files
    python benchmarks/bench_scale.py --shape files --units 50000 --cores 2            # 50,000 file units
    python benchmarks/bench_scale.py --shape dcp --saves 195 --ranks 1024 --inventory-only   # 199,875 files

times the inventory stage alone (its own process: ``python -m ckptaudit.stages inventory``; seconds per
file) and, unless ``--inventory-only``, the whole audit (``snakemake --cores N audit``), and checks that the
rollback point is the unit before the damaged newest one.  Target: 50,000 files audited in ≤ 60 s on 2 cores.

Issue 45 (units in batches: 10,000 small file units in ≤ 30 s, 50,000 in ≤ 2 min; CPU ms per unit):

    python benchmarks/bench_scale.py --shape files --units 10000 --cores 2 --run-dir /tmp/units10000 \
        --baseline-code /path/to/baseline-checkout --rounds 1 --target-s 30

``--run-dir`` generates the run there once and re-uses it afterwards; ``--baseline-code`` audits the same run
with another checkout's Snakefile and package (``PYTHONPATH``) in the same call, rounds interleaved.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

PART_STAGES = ("hash", "scan", "load", "configdiff", "structure", "state")


def generate(run_dir: Path, extra_dir: Path, n: int) -> float:
    """Train n+1 steps, saving every step; the last save goes to ``extra_dir``."""
    import hashlib

    from ckptaudit import demo

    args = dict(demo.DEFAULT_MODEL_ARGS, n_layer=1, n_head=2, n_embd=16, block_size=16)

    def save(ckpt, path: Path):
        step = ckpt["iter_num"]
        dest = (extra_dir if step > n else run_dir) / path.name
        data = demo.serialize(ckpt)
        dest.write_bytes(data)
        dest.with_name(dest.name + ".sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {dest.name}\n")

    t0 = time.perf_counter()
    run_dir.mkdir(parents=True)
    extra_dir.mkdir(parents=True)
    demo.train(run_dir, max_steps=n + 1, save_every=1, seed=1, model_args=args,
               config=dict(eval_iters=1, batch_size=2), save=save)
    return time.perf_counter() - t0


_JOB = re.compile(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):\s*$", re.M)
_WILD = re.compile(r"^\s*wildcards: part=(p\d{4})", re.M)


def jobs_run(log: str) -> Counter:
    """Counter of rule names of the jobs Snakemake started (from its log)."""
    return Counter(m.group(1) for m in _JOB.finditer(log))


def changed(before: dict, after: dict) -> list:
    return sorted(k for k in after if before.get(k) != after[k])


def many_files(a) -> int:
    """Issue 22: generate a run of many files, time its inventory alone and (unless --inventory-only) the
    whole audit, and check the rollback point.  Issue 45: ``--run-dir`` keeps the generated run for the next
    call, ``--baseline-code`` audits it with another checkout too (rounds interleaved), and the per-stage
    CPU seconds (the jobs' ``benchmark:`` files) and CPU ms per unit are reported."""
    import json

    import scale_runs

    tmp = Path(tempfile.mkdtemp(prefix=f"ckptaudit-bench-{a.shape}-", dir=a.tmp))
    run_dir, work = tmp / "run", tmp / "work"
    if a.run_dir:
        run_dir = Path(a.run_dir)
    work.mkdir()
    try:
        if run_dir.is_dir() and a.shape == "files" and not a.inventory_only:  # a kept run of --units units
            gen_s, damaged, expected = float("nan"), f"ckpt_{a.units:07d}.pt", f"ckpt_{a.units - 1:07d}.pt"
            if not (run_dir / damaged).is_file():
                raise SystemExit(f"{run_dir}: no {damaged}: not a kept run of --units {a.units}")
        elif a.shape == "dcp":
            gen_s, damaged, expected = scale_runs.dcp_run(run_dir, a.saves, a.ranks)
        elif a.inventory_only:  # the inventory reads names, sizes and first bytes: one small blob each
            gen_s, damaged, expected = scale_runs.file_names(run_dir, a.units)
        else:
            gen_s, damaged, expected = scale_runs.file_units(run_dir, a.units)
        n_files = sum(len(fs) for _, _, fs in os.walk(run_dir))
        print(f"# generated {n_files} files in {gen_s:.1f} s", file=sys.stderr)
        inv = C.run_gnu_time([C.PYTHON, "-m", "ckptaudit.stages", "inventory", "--run-dir", str(run_dir),
                              "--out", str(tmp / "inv.parquet"), "--out-json", str(tmp / "inv.json"),
                              "--out-pointers", str(tmp / "pointers.parquet")])
        n_units = len(json.loads((tmp / "inv.json").read_text())["units"])
        rows = [["inventory alone (`python -m ckptaudit.stages inventory`)", "–", f"{inv['wall_s']:.2f}",
                 f"{inv['cpu_s']:.1f}", "–", f"{inv['other_cpu_s']:.0f}", f"{inv['max_rss_mib']:.0f}",
                 f"{1e6 * inv['wall_s'] / n_files:.0f} µs/file", "–"]]
        codes = [("this checkout", str(C.code_root()))] + ([("baseline", a.baseline_code)] if a.baseline_code else [])
        stage_rows, oks = [], []
        if not a.inventory_only:
            for rnd in range(a.rounds):
                for label, code in codes:
                    out = tmp / f"out-{label.replace(' ', '_')}-{rnd}"
                    r, v, bench = _audit_once(run_dir, out, work, a.cores, code)
                    got = (v.get("rollback") or {}).get("unit")
                    dmg = next((u for u in v["units"] if u["unit"] == damaged), {})
                    ok = got == expected and dmg.get("usable_for") == "none"
                    oks.append((label, ok, r["wall_s"]))
                    rows.append([f"whole audit (`snakemake --cores {a.cores} audit`)", f"{label}, round {rnd + 1}",
                                 f"{r['wall_s']:.1f}", f"{r['cpu_s']:.0f}", f"{1e3 * r['cpu_s'] / n_units:.1f}",
                                 f"{r['other_cpu_s']:.0f}", f"{r['max_rss_mib']:.0f}",
                                 f"{1e3 * r['wall_s'] / n_files:.2f} ms/file",
                                 f"{v['recommendation']} from {got} (expected {expected}; newest {damaged}: "
                                 f"{dmg.get('usable_for')}): {'right' if ok else 'WRONG'}"])
                    print(f"# {label}, round {rnd + 1}: {r['wall_s']:.1f} s, {r['cpu_s']:.0f} CPU-s, "
                          f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
                    for st in ("inventory",) + PART_STAGES + ("report",):
                        bs = [b for b in bench if b["stage"] == st]
                        if bs:
                            secs = [C.as_float(b.get("s")) for b in bs]
                            cpus = [C.as_float(b.get("cpu_time")) for b in bs]
                            rss = [x for x in (C.as_float(b.get("max_rss")) for b in bs) if x == x]
                            stage_rows.append([f"{label}, round {rnd + 1}", st, len(bs), f"{sum(secs):.1f}",
                                               f"{sum(cpus):.1f}", f"{1e3 * sum(cpus) / n_units:.2f}",
                                               f"{max(rss):.0f}" if rss else "NA"])
                    if not a.keep:
                        shutil.rmtree(out, ignore_errors=True)
        shape = (f"DCP-like: {a.saves} saves × {a.ranks} rank files + .metadata" if a.shape == "dcp"
                 else f"{a.units} small torch.save file units, no sidecars"
                 + (" (one 1.5 KB blob each)" if a.inventory_only else ""))
        print(f"\nMachine: {C.machine_line()}\n")
        if a.baseline_code:
            print(f"Baseline: {a.baseline_code} (PYTHONPATH and its Snakefile), rounds interleaved.\n")
        print(f"Run: {shape}: {n_files} files, {n_units} units (generated in {gen_s:.0f} s); newest unit "
              f"{damaged} damaged.  'CPU s': user+sys of the process tree; 'others': other processes' CPU "
              "meanwhile (load).\n")
        print(C.md_table(["what", "code", "wall s", "CPU s", "CPU ms/unit", "others' CPU s", "peak RSS MiB",
                          "per file", "verdict"], rows))
        if not a.inventory_only:
            print("\nPer stage (Snakemake `benchmark:` files: job wall seconds and CPU seconds, summed over jobs):\n")
            print(C.md_table(["code", "stage", "jobs", "wall sum s", "CPU sum s", "CPU ms/unit", "max RSS MiB"],
                             stage_rows))
            mine = [(ok, w) for label, ok, w in oks if label == "this checkout"]
            met = all(ok for ok, _ in mine) and C.median([w for _, w in mine]) <= a.target_s
            print(f"\nTarget (≤ {a.target_s:.0f} s on {a.cores} cores, right rollback point): "
                  f"{'MET' if met else 'MISSED'}")
    finally:
        if a.keep:
            print(f"# kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _audit_once(run_dir: Path, out: Path, work: Path, cores: int, code: str):
    """One ``snakemake --cores N audit`` of ``run_dir`` by the checkout ``code`` (its Snakefile, and
    ``PYTHONPATH`` for the jobs), Snakemake's state in a fresh ``work``; returns (time facts, verdict,
    benchmark rows)."""
    import json

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    cmd = C.snakemake_cmd(run_dir, out, work, cores)
    cmd[cmd.index("--snakefile") + 1] = str(Path(code) / "Snakefile")
    r = C.run_gnu_time(cmd, env={**os.environ, "PYTHONPATH": code}, check=False)
    if r["rc"] not in (0, 1, 2):  # ckptaudit's exit codes: 1 = roll back (the damaged newest unit), 2 = retrain
        raise RuntimeError(f"{' '.join(cmd)}: exit {r['rc']}\n{r['stdout'][-3000:]}\n{r['stderr'][-3000:]}")
    return r, json.loads((out / "verdict.json").read_text()), C.read_benchmark_tsvs(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=("train", "dcp", "files"), default="train",
                    help="train: N trained units with sidecars and the re-run checks (targets 2, 3); dcp: "
                         "--saves × --ranks rank files; files: --units small file units (issue 22)")
    ap.add_argument("--saves", type=int, default=48, help="--shape dcp: saves (folders)")
    ap.add_argument("--ranks", type=int, default=1024, help="--shape dcp: rank files per save")
    ap.add_argument("--inventory-only", action="store_true", help="--shape dcp/files: time the inventory only")
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--units-per-job", default="auto", help="config units_per_job (default: auto)")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (printed)")
    ap.add_argument("--run-dir", default="", help="--shape files: the run folder, generated there when missing "
                                                  "and re-used as it is when present (a kept run of --units)")
    ap.add_argument("--baseline-code", default="", help="--shape dcp/files: a checkout whose audit is timed too "
                                                        "(its Snakefile, PYTHONPATH), rounds interleaved")
    ap.add_argument("--rounds", type=int, default=1, help="--shape dcp/files: audits per checkout")
    ap.add_argument("--target-s", type=float, default=60.0, help="--shape dcp/files: the wall target (s)")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    if a.shape != "train":
        return many_files(a)
    tmp = Path(tempfile.mkdtemp(prefix="ckptaudit-bench-scale-", dir=a.tmp))
    run_dir, extra, out, work = tmp / "run", tmp / "extra", tmp / "out", tmp / "work"
    work.mkdir()
    try:
        gen_s = generate(run_dir, extra, a.units)
        files = sorted(run_dir.iterdir())
        run_bytes = sum(p.stat().st_size for p in files)
        print(f"# generated {a.units} units ({len(files)} files, {run_bytes / C.MIB:.1f} MiB) in {gen_s:.1f} s",
              file=sys.stderr)
        cmd = C.snakemake_cmd(run_dir, out, work, a.cores)
        if a.units_per_job != "auto":
            cmd.append(f"units_per_job={a.units_per_job}")
        default_cmd = list(cmd)  # every byte hashed again (the default re-run)
        cmd.append("reuse=True")

        r1 = C.run_gnu_time(cmd)
        log1 = r1["stderr"] + r1["stdout"]
        j1 = jobs_run(log1)
        m1 = C.mtimes(out)
        bench = C.read_benchmark_tsvs(out)
        print(f"# first run {r1['wall_s']:.1f} s", file=sys.stderr)

        r2 = C.run_gnu_time(cmd)
        log2 = r2["stderr"] + r2["stdout"]
        j2 = jobs_run(log2)
        m2 = C.mtimes(out)
        nothing = "Nothing to be done" in log2
        ch2 = changed(m1, m2)
        print(f"# unchanged re-run {r2['wall_s']:.1f} s", file=sys.stderr)

        new = sorted(extra.iterdir())
        for p in new:
            shutil.move(str(p), run_dir / p.name)
        r3 = C.run_gnu_time(cmd)
        log3 = r3["stderr"] + r3["stdout"]
        j3 = jobs_run(log3)
        parts3 = sorted(set(_WILD.findall(log3)))
        m3 = C.mtimes(out)
        ch3 = changed(m2, m3)
        print(f"# grown re-run {r3['wall_s']:.1f} s", file=sys.stderr)

        r4 = C.run_gnu_time(default_cmd)
        log4 = r4["stderr"] + r4["stdout"]
        j4 = jobs_run(log4)
        print(f"# default re-run (every byte again) {r4['wall_s']:.1f} s", file=sys.stderr)

        n_parts1 = len({b["job"] for b in bench if b["stage"] == "hash"})
        stage_rows = []
        for st in ("inventory",) + PART_STAGES:
            bs = [b for b in bench if b["stage"] == st]
            if not bs:
                continue
            secs = [C.as_float(b.get("s")) for b in bs]
            rss = [C.as_float(b.get("max_rss")) for b in bs]
            rss_ok = [x for x in rss if x == x]
            stage_rows.append([st, len(bs), f"{sum(secs):.1f}", f"{C.median(secs):.2f}", f"{max(secs):.2f}",
                               f"{max(rss_ok):.0f}" if rss_ok else "NA"])

        print(f"\nMachine: {C.machine_line()}\n")
        print(f"Run: {a.units} units ({len(files)} files incl. sidecars, {run_bytes / C.MIB:.1f} MiB, "
              f"generated in {gen_s:.1f} s), units_per_job {a.units_per_job} → {n_parts1} parts, "
              f"--cores {a.cores}.  'CPU s' is user+sys of the whole Snakemake process tree; 'others' is "
              "CPU time other processes used on the machine meanwhile (noise).\n")
        first = r1["wall_s"]
        rows = [
            ["first audit", f"{first:.1f}", f"{r1['cpu_s']:.0f}", f"{r1['other_cpu_s']:.0f}",
             f"{r1['max_rss_mib']:.0f}", sum(j1.values()),
             f"{1000 * first / a.units:.0f} ms/unit", "100 %", "–"],
            ["re-run, unchanged, --reuse", f"{r2['wall_s']:.2f}", f"{r2['cpu_s']:.1f}", f"{r2['other_cpu_s']:.0f}",
             f"{r2['max_rss_mib']:.0f}", sum(j2.values()),
             "–", f"{100 * r2['wall_s'] / first:.1f} %",
             f"{len(ch2)} files rewritten; 'Nothing to be done': {nothing}"],
            [f"re-run, +1 unit (step {a.units + 1}), --reuse", f"{r3['wall_s']:.1f}", f"{r3['cpu_s']:.1f}",
             f"{r3['other_cpu_s']:.0f}", f"{r3['max_rss_mib']:.0f}",
             sum(j3.values()), "–", f"{100 * r3['wall_s'] / first:.1f} %",
             "jobs: " + ", ".join(f"{k}×{v}" for k, v in sorted(j3.items())) + f"; parts: {', '.join(parts3)}"],
            ["re-run, unchanged, default (every byte hashed again)", f"{r4['wall_s']:.1f}", f"{r4['cpu_s']:.1f}",
             f"{r4['other_cpu_s']:.0f}", f"{r4['max_rss_mib']:.0f}", sum(j4.values()), "–",
             f"{100 * r4['wall_s'] / first:.1f} %", "jobs: " + ", ".join(f"{k}×{v}" for k, v in sorted(j4.items()))],
        ]
        print(C.md_table(["invocation", "wall s", "CPU s", "others' CPU s", "peak RSS MiB (largest process)", "jobs run", "per unit",
                          "vs first", "what ran"], rows))
        print("\nFirst run, per stage (Snakemake `benchmark:` files; s = job wall seconds):\n")
        print(C.md_table(["stage", "jobs", "sum s", "median s/job", "max s/job", "max max_rss MiB"], stage_rows))
        print("\nFirst run jobs: " + ", ".join(f"{k}×{v}" for k, v in sorted(j1.items())))
        parts_changed3 = sorted({c.split("/")[-1] for c in ch3 if c.startswith("tables/parts/")})
        print(f"Grown re-run rewrote part files: {', '.join(parts_changed3) or 'none'}")
        ok2 = first <= 120
        ok3 = r2["wall_s"] <= 0.05 * first and nothing and not ch2 and not j2
        ok3b = set(parts3) <= {max(parts3)} if parts3 else False
        ok3b = ok3b and set(j3) <= {"inventory", "report", "audit", *PART_STAGES} and \
            all(j3.get(s, 0) == 1 for s in PART_STAGES)
        scope = "" if a.units == 1000 else f" [only meaningful at --units 1000; this was {a.units}]"
        print(f"\nTarget 2 (first run ≤ 120 s){scope}: {'MET' if ok2 else 'MISSED'} ({first:.1f} s)")
        print(f"Target 3 (unchanged --reuse re-run ≤ 5 % and no job): {'MET' if ok3 else 'MISSED'} "
              f"({100 * r2['wall_s'] / first:.1f} %, jobs {sum(j2.values())}, files rewritten {len(ch2)})")
        print(f"Target 3b (+1 unit re-runs only inventory, the last part, report): {'MET' if ok3b else 'MISSED'}")
        if not (ok2 and ok3 and ok3b) or a.keep:
            keep = tmp / "logs"
            keep.mkdir(exist_ok=True)
            for i, lg in enumerate((log1, log2, log3, log4), 1):
                (keep / f"snakemake_{i}.log").write_text(lg)
    finally:
        if a.keep:
            print(f"# kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
