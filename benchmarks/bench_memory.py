"""Target 4: peak RSS of every job while auditing one big checkpoint (1 GiB; issue 15: 4 GiB).

Builds (in a child process) a ``--size-gib`` GiB ``torch.save`` checkpoint: 4 large float32
weights plus an AdamW-like optimizer dict (``exp_avg``/``exp_avg_sq`` of the
same shapes), scheduler dict and step, with a sha256sum sidecar; then runs
``snakemake --cores 2 audit`` on it under ``/usr/bin/time -v`` and reads

* each job's ``max_rss`` / ``max_uss`` / ``max_pss`` (MiB) from the Snakemake
  ``benchmark:`` files under ``OUT/benchmarks/<stage>/*.tsv`` (Snakemake samples
  the job's process tree with psutil and sums RSS over its processes, so the
  load job's figure counts the fork-shared pages of parent and child twice;
  ``max_pss`` does not);
* the forked load child's own peak RSS (``ru_maxrss`` from ``wait4``) from
  ``OUT/tables/load.parquet`` (``peak_rss_bytes``);
* GNU time's "Maximum resident set size" of the whole run (the largest single
  process of the tree);
* because Snakemake samples every 0.5 s (a job shorter than that may show only
  its bash wrapper, ~3 MiB), each job's shell command (printed with ``-p``) is
  then run again on its own under ``/usr/bin/time -v``: the exact peak RSS of
  its largest process (for load: the larger of the stage process and its
  forked child).

    python benchmarks/bench_memory.py [--size-gib 1] [--keep]
    python benchmarks/bench_memory.py --size-gib 4      # issue 15's case

Target: every job ≤ 400 MiB peak RSS, whatever the checkpoint size.  With ``PYTHONPATH``
pointing at a snapshot of another commit (``git archive C | tar -x -C DIR``), that tree's
Snakefile and package are measured (:func:`_common.code_root`).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

LIMIT_MIB = 400
_HEAD = re.compile(r"^\s*(?:local)?(?:rule|checkpoint) (\w+):\s*$")
_PART = re.compile(r"^\s*wildcards: part=(p\d{4})")


def shell_commands(log: str):
    """[(rule, job name, shell command)] in execution order, from a ``snakemake -p`` log."""
    out, rule, part = [], None, None
    for line in log.splitlines():
        m = _HEAD.match(line)
        if m:
            rule, part = m.group(1), None
            continue
        m = _PART.match(line)
        if m:
            part = m.group(1)
            continue
        if line.startswith("Shell command: ") and rule:
            cmd = line[len("Shell command: "):]
            if cmd != "None":
                out.append((rule, part or rule, cmd))
            rule = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args(argv)
    C.require_gnu_time()
    if C.free_gib(a.tmp) < 3 * a.size_gib + 1:
        raise SystemExit(f"{a.tmp}: need {3 * a.size_gib + 1:.0f} GiB free, have {C.free_gib(a.tmp):.1f}")
    tmp = Path(tempfile.mkdtemp(prefix="ckptaudit-bench-memory-", dir=a.tmp))
    run_dir, out, work = tmp / "run", tmp / "out", tmp / "work"
    work.mkdir()
    try:
        ck = run_dir / "ckpt_001000.pt"
        facts = C.build_big_in_child(ck, a.size_gib)
        print(f"# built {facts['size_bytes'] / C.GIB:.3f} GiB in {facts['build_s']:.1f} s", file=sys.stderr)
        r = C.run_gnu_time(C.snakemake_cmd(run_dir, out, work, a.cores, extra=["-p"]))
        print(f"# audit {r['wall_s']:.1f} s", file=sys.stderr)
        bench = C.read_benchmark_tsvs(out)
        exact = {}
        for rule, job, cmd in shell_commands(r["stderr"] + r["stdout"]):
            e = C.run_gnu_time(["bash", "-c", cmd], cwd=work)
            exact[(rule, job)] = e

        import pyarrow.parquet as pq

        load = pq.read_table(out / "tables" / "load.parquet").to_pylist()
        state = pq.read_table(out / "tables" / "state.parquet").to_pylist()
        hashes = pq.read_table(out / "tables" / "hash.parquet").to_pylist()
        rows = []
        worst = 0.0
        seen = set()
        for b in bench:
            rss = C.as_float(b.get("max_rss"))
            worst = max(worst, rss) if rss == rss else worst
            e = exact.get((b["stage"], b["job"]))
            seen.add((b["stage"], b["job"]))
            if e:
                worst = max(worst, e["max_rss_mib"])
            rows.append([b["stage"], b["job"], f"{C.as_float(b.get('s')):.2f}", b.get("max_rss", "NA"),
                         b.get("max_pss", "NA"), f"{e['max_rss_mib']:.0f}" if e else "NA",
                         f"{e['wall_s']:.2f}" if e else "NA"])
        for (rule, job), e in exact.items():
            if (rule, job) not in seen:  # rules without a benchmark: file
                worst = max(worst, e["max_rss_mib"])
                rows.append([rule, job, "no benchmark file", "–", "–", f"{e['max_rss_mib']:.0f}",
                             f"{e['wall_s']:.2f}"])
        child = [x["peak_rss_bytes"] / C.MIB for x in load if x.get("peak_rss_bytes")]
        for x in load:
            rows.append(["load child", x["file"], f"{x['load_seconds']:.2f} (load_seconds)",
                         "–", "–", f"{x['peak_rss_bytes'] / C.MIB:.0f}" if x.get("peak_rss_bytes") else "NA",
                         f"status {x['status']}"])
        print(f"\nMachine: {C.machine_line()}\n")
        print(f"Checkpoint: {facts['size_bytes'] / C.GIB:.3f} GiB torch.save zip (4 float32 weights + exp_avg + "
              f"exp_avg_sq of the same shapes), built in {facts['build_s']:.1f} s; "
              f"audit `snakemake --cores {a.cores} audit` wall {r['wall_s']:.1f} s.\n")
        print(C.md_table(["stage", "job", "Snakemake s", "Snakemake max_rss MiB (sampled, tree sum)",
                          "Snakemake max_pss MiB", "exact peak RSS MiB (GNU time, largest process)",
                          "re-run wall s / note"], rows))
        st = state[0] if state else {}
        hs = hashes[0] if hashes else {}
        print(f"\nGNU time, whole run: max RSS (largest single process, Snakemake included) "
              f"{r['max_rss_mib']:.0f} MiB, wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s.")
        if hs:
            print(f"hash stage: {hs['size_bytes'] / C.GIB:.3f} GiB in {hs['hash_seconds']:.2f} s "
                  f"({hs['size_bytes'] / C.GIB / hs['hash_seconds']:.2f} GiB/s), verified {hs['verified']}.")
        if st.get("scan_seconds"):
            print(f"state stage value scan: {st['scanned_bytes'] / C.GIB:.3f} GiB in {st['scan_seconds']:.2f} s "
                  f"({st['scanned_bytes'] / C.GIB / st['scan_seconds']:.2f} GiB/s), "
                  f"{st['n_float_tensors']} float tensors, {st['n_nonfinite_tensors']} non-finite.")
        worst_all = max([worst, r["max_rss_mib"], *child])
        ok = worst_all <= LIMIT_MIB
        print(f"\nTarget 4 (every job ≤ {LIMIT_MIB} MiB): {'MET' if ok else 'MISSED'} — largest job "
              f"{worst:.0f} MiB, load child {max(child) if child else float('nan'):.0f} MiB, "
              f"largest process of the run {r['max_rss_mib']:.0f} MiB")
        if a.keep or not ok:
            (tmp / "snakemake.log").write_text(r["stderr"] + r["stdout"])
    finally:
        if a.keep:
            ck = run_dir / "ckpt_001000.pt"
            if ck.exists():
                ck.unlink()  # the big file goes in any case (disk is limited)
            print(f"# kept {tmp} (without the checkpoint)", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
