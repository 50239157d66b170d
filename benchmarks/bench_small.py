"""Issue 15, small runs: wall time and job count of auditing the demo run and a 3-unit tiny run,
two versions of the code side by side in the same invocation.

Makes once (with the checkout's code): the demo run (``ckptaudit demo RUN``: 6 saves of the
tiny GPT, one truncated, one with a flipped byte, sha256sum sidecars) and a tiny run of 3
real ``torch.save`` checkpoints (nanoGPT-style dict: 4 float32 weights of 32x32 plus AdamW
``exp_avg``/``exp_avg_sq`` and ``step``, ``iter_num`` and ``model_args``, ~50 KB each) with
sha256sum sidecars.  Then ``--repeats`` rounds; each round audits both runs with each code
version (the order of the versions alternates between rounds):

* ``ckptaudit audit RUN --out OUT --cores N`` with a fresh ``OUT`` (whole wall, GNU time);
* the same command again on the finished ``OUT`` (the unchanged re-run).

A code version is the checkout (``after``) or a snapshot folder given with ``--before``
(``git archive <commit> | tar -x -C DIR``, optionally with a ``COMMIT`` file): the audit runs
with ``PYTHONPATH=DIR``, so its CLI, Snakefile and every job import that tree.  Jobs are
counted as the log files (one per job) under ``OUT/logs`` that the command created or rewrote.

    python benchmarks/bench_small.py --before /tmp/bench15/code-before [--repeats 3] [--cores 2]
                                     [--dir /tmp/bench15/small] [--keep]
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
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

CKPTAUDIT = str(Path(C.PYTHON).with_name("ckptaudit"))

TINY_CHILD = """
import hashlib, sys, torch
from pathlib import Path
root = Path(sys.argv[1]); root.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(0)
for k in range(1, 4):
    step = 100 * k
    model = {f"layers.{i}.weight": torch.randn(32, 32, generator=g) * 0.02 for i in range(4)}
    state = {i: {"step": torch.tensor(float(step)), "exp_avg": torch.randn(32, 32, generator=g) * 1e-3,
                 "exp_avg_sq": torch.rand(32, 32, generator=g) * 1e-6} for i in range(4)}
    ckpt = {"model": model, "optimizer": {"state": state, "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95),
            "eps": 1e-8, "weight_decay": 0.1, "params": [0, 1, 2, 3]}]}, "iter_num": step,
            "model_args": {"n_layer": 4, "n_embd": 32}}
    p = root / f"ckpt_{step:06d}.pt"
    torch.save(ckpt, p)
    digest = hashlib.sha256(p.read_bytes()).hexdigest()
    p.with_name(p.name + ".sha256").write_text(f"{digest}  {p.name}\\n")
"""


def make_runs(tmp: Path) -> Dict[str, Path]:
    runs = {"demo": tmp / "demo", "tiny": tmp / "tiny"}
    if not any(runs["demo"].glob("ckpt_*")):
        subprocess.run([CKPTAUDIT, "demo", str(runs["demo"])], check=True, capture_output=True)
    if not any(runs["tiny"].glob("ckpt_*")):
        subprocess.run([C.PYTHON, "-c", TINY_CHILD, str(runs["tiny"])], check=True)
    return runs


def _logs(out: Path) -> dict:
    return {f: f.stat().st_mtime_ns for f in (out / "logs").glob("*/*.log")}


def audit(run: Path, out: Path, cores: int, code: Optional[Path]) -> Dict:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = str(code)
    else:
        env.pop("PYTHONPATH", None)
    logs0 = _logs(out)  # a job (re)writes its log: new or changed logs are the jobs that ran
    r = C.run_gnu_time([CKPTAUDIT, "audit", str(run), "--out", str(out), "--cores", str(cores)], env=env,
                       check=False)
    if r["rc"] not in (0, 1, 2):
        raise RuntimeError(f"audit exit {r['rc']}\n{r['stdout'][-3000:]}\n{r['stderr'][-3000:]}")
    v = json.loads((out / "verdict.json").read_text())
    r.update(jobs=sum(1 for f, m in _logs(out).items() if logs0.get(f) != m), verdict=(v.get("recommendation"), (v.get("rollback") or {}).get("unit"),
                                                 tuple((u["unit"], u.get("usable_for")) for u in v["units"])))
    return r


def _label(code: Path) -> str:
    """A snapshot's ``COMMIT`` file (first line, shortened) or its folder."""
    f = code / "COMMIT"
    return f.read_text().split()[0][:7] + (f" {code.name}" if f.exists() else "") if f.exists() else str(code)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="snapshot folder of the code to compare with the checkout")
    ap.add_argument("--after", default=None, help="snapshot folder to measure instead of the checkout")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--dir", default="/tmp/bench15/small")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    tmp = Path(a.dir)
    before = Path(a.before).resolve()
    after = Path(a.after).resolve() if a.after else None
    codes = {f"before ({_label(before)})": before, f"after ({_label(after) if after else 'checkout'})": after}
    load0, t_start = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    res: Dict[tuple, List[Dict]] = {}
    try:
        runs = make_runs(tmp)
        for i in range(a.repeats):
            names = list(codes) if i % 2 == 0 else list(codes)[::-1]
            for name in names:
                for rname, run in runs.items():
                    out = tmp / "out" / f"{rname}-{i}-{name.split()[0]}"
                    shutil.rmtree(out, ignore_errors=True)
                    first = audit(run, out, a.cores, codes[name])
                    again = audit(run, out, a.cores, codes[name])
                    res.setdefault((name, rname), []).append({"first": first, "again": again})
                    print(f"# round {i + 1} {name} {rname}: {first['wall_s']:.1f} s, {first['jobs']} jobs; "
                          f"re-run {again['wall_s']:.1f} s, {again['jobs']} jobs", file=sys.stderr)
        load1 = os.getloadavg()
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nMachine: {C.machine_line()}; started {t_start} UTC; load average (1/5/15 min) "
          f"{load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f} before, {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f} after\n")
    print(f"{a.repeats} rounds; each audits the demo run and the tiny run (3 units) with each code version, "
          f"--cores {a.cores}.\n")
    rows = []
    for (name, rname), rs in res.items():
        f = [r["first"]["wall_s"] for r in rs]
        rows.append([rname, name, f"{C.median(f):.1f}", f"{min(f):.1f}–{max(f):.1f}",
                     sorted({r["first"]["jobs"] for r in rs}), f"{C.median([r['first']['cpu_s'] for r in rs]):.1f}",
                     f"{C.median([r['first']['other_cpu_s'] for r in rs]):.0f}",
                     f"{C.median([r['again']['wall_s'] for r in rs]):.2f}", sorted({r["again"]["jobs"] for r in rs})])
    print(C.md_table(["run", "code", "first audit: median wall s", "range s", "jobs", "median CPU s (tree)",
                      "median others' CPU s", "unchanged re-run: median wall s", "re-run jobs"], rows))
    for rname in ("demo", "tiny"):
        b, af = res.get((list(codes)[0], rname)), res.get((list(codes)[1], rname))
        if b and af:
            ratio = C.median([x["first"]["wall_s"] / y["first"]["wall_s"] for x, y in zip(af, b)])
            same = {r["first"]["verdict"] for r in b + af}
            print(f"\n{rname}: after / before first-audit wall {ratio:.2f}× (median of per-round ratios); "
                  f"verdicts equal across versions and rounds: {len(same) == 1}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
