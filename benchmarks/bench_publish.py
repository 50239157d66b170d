"""Writer side: crash-safety of ``ckptaudit.publish`` at scale, and what it costs.

Part 1, crash: the harness of ``tests/test_crash.py`` (a forked child per publish, killed
with SIGKILL at a random byte offset, before/after a random system call, or after a random
delay; ~330 KB states; retention ``keep_last=3`` with the stale-leftover sweep) run until
``--kills`` publishes died mid-save.  After every kill: ``safe_load_checkpoint`` must load the
previous complete step or the new one with exactly the saved tensors, ``latest`` must name a
complete unit, every unit not in progress must verify; every 20th kill the whole audit runs
and no unit it calls usable may fail verification.

Part 1b, crash of the background path: the same, with ``save(..., background=True)`` then
``wait()`` in each child (``--async-kills``), so kills land in the staging or anywhere in the
thread's commit.

Part 2, overhead: one process, a ``--size-gib`` state (float32 tensors of 64 MiB), ``--repeats``
interleaved rounds of: plain ``torch.save(state, path)``; the same plus ``fsync`` of the file
and its folder; ``ckptaudit.publish.save`` as it is by default in one process (no re-read);
with ``verify=True`` (the re-read every multi-rank publish does on rank 0); and
``save(..., background=True)``, timed until it returns (what the training loop blocks for),
its commit then waited for untimed.  One untimed background save before the rounds
allocates the staging copy (its blocking time is reported apart: a loop pays it once).
``os.sync()`` runs (untimed) before each save so no save pays for the previous one's dirty
pages; files are deleted between saves.  The publish breakdown comes from
``PublishResult.seconds``.

    /work/venv/bin/python benchmarks/bench_publish.py [--kills 1000] [--async-kills 1000] [--size-gib 1] [--repeats 5]
                                                      [--dir /tmp] [--skip-crash] [--skip-overhead]

Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common as C  # noqa: E402


def crash_part(kills: int, base: Path, background: bool = False) -> str:
    from tests.test_crash import AUDIT_EVERY, CrashHarness, run_kills

    run = Path(tempfile.mkdtemp(prefix="bench-crash-", dir=base)) / "run"
    h = CrashHarness(run, seed=1000 + background, background=background)
    t0 = time.perf_counter()
    run_kills(h, kills)
    dt = time.perf_counter() - t0
    mids = {k.split(":")[0]: v for k, v in h.stats.items() if k.endswith(":mid")}
    afters = {k.split(":")[0]: v for k, v in h.stats.items() if k.endswith(":after")}
    n_mid = sum(mids.values())
    ops = {}
    for site, n in h.sites.items():
        if site.startswith(("before ", "after ")):
            ops[site.split()[1]] = ops.get(site.split()[1], 0) + n
    rows = [[m, mids.get(m, 0), afters.get(m, 0)] for m in ("byte", "syscall", "timed")]
    kind = "background publishes (`save(..., background=True)` then `wait()`)" if background else "publishes"
    out = [f"{h.stats['kills']} {kind} in child processes killed with SIGKILL, {n_mid} of them mid-save "
           f"(the rest after the save returned), {dt:.0f} s in all ({dt / h.stats['kills'] * 1000:.0f} ms per kill "
           f"including the checks), {h.audits} whole-run audits; final step {h.step}, newest complete step "
           f"{h.complete}.  Every check passed: no torn unit was ever loaded, visible or called usable.", "",
           C.md_table(["kill", "died mid-save", "died after the save returned"], rows), "",
           "Mid-save system-call kills by call: " + ", ".join(f"`{k}` {v}" for k, v in sorted(ops.items()))
           + f"; byte-offset kills: {h.sites['byte']} (offsets spread over "
           f"{min(h.byte_fracs):.3f}–{max(h.byte_fracs):.3f} of the {h.calibration['bytes']} bytes a publish "
           f"writes); timed kills: {h.sites['timed']}.  Audit every {AUDIT_EVERY} kills."]
    shutil.rmtree(run.parent, ignore_errors=True)
    return "\n".join(out)


def _fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def overhead_part(size_gib: float, repeats: int, base: Path) -> str:
    import torch

    from ckptaudit.publish import save

    torch.set_num_threads(1)
    n = max(1, int(size_gib * 16))
    state = {f"layer{i}.weight": torch.randn(16 << 20, generator=torch.Generator().manual_seed(i))
             for i in range(n)}  # n x 64 MiB float32
    size = sum(t.numel() * 4 for t in state.values())
    work = Path(tempfile.mkdtemp(prefix="bench-publish-", dir=base))
    times = {k: [] for k in ("plain", "plain_fsync", "publish", "publish_verify", "publish_async")}
    cpu = {k: [] for k in times}  # user+system seconds of this process, all threads
    parts = {k: [] for k in ("fsync_seconds", "verify_seconds", "write_seconds", "commit_seconds")}
    parts_nv = {k: [] for k in ("fsync_seconds", "write_seconds")}
    fsync_plain, commit_async = [], []
    step = 0
    t0 = time.perf_counter()
    first = save(state, work, 0, background=True)  # allocates the staging copy, once per run
    first_async = time.perf_counter() - t0
    first.wait()
    order = list(times)
    for r in range(repeats):
        for k in order[r % len(order):] + order[:r % len(order)]:
            for p in list(work.iterdir()):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            os.sync()
            step += 1
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            if k.startswith("plain"):
                path = work / f"ckpt_{step:06d}.pt"
                torch.save(state, path)
                if k == "plain_fsync":
                    t1 = time.perf_counter()
                    _fsync_path(path)
                    _fsync_path(work)
                    fsync_plain.append(time.perf_counter() - t1)
            elif k == "publish_async":
                pending = save(state, work, step, background=True)
                times[k].append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                pending.wait()
                commit_async.append(time.perf_counter() - t1)
                ru1 = resource.getrusage(resource.RUSAGE_SELF)
                cpu[k].append(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
                continue
            else:
                res = save(state, work, step, verify=(k == "publish_verify"))
                src = parts if k == "publish_verify" else parts_nv
                for key in src:
                    src[key].append(res.seconds.get(key, 0.0))
            times[k].append(time.perf_counter() - t0)
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu[k].append(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
    b = bytearray(os.urandom(1 << 20)) * 256
    t0 = time.perf_counter()
    hashlib.sha256(b).hexdigest()
    sha_s = (time.perf_counter() - t0) * (size / len(b))
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mcpu = {k: statistics.median(v) for k, v in cpu.items()}
    base_s, sync_s = med["plain"], med["plain_fsync"]
    # per-round ratios to torch.save + fsync of the same round (the rounds interleave, so a
    # burst of load on the shared machine hits both sides of a ratio)
    ratio = {k: statistics.median(a / b for a, b in zip(times[k], times["plain_fsync"])) for k in times}
    rows = [["`torch.save(state, path)`", med["plain"], 1.0, "-"],
            ["`torch.save` + fsync file and folder", med["plain_fsync"], med["plain_fsync"] / base_s,
             f"fsync {statistics.median(fsync_plain):.2f} s"],
            ["`publish.save()` (one process: verify off)", med["publish"], med["publish"] / base_s,
             f"fsync {statistics.median(parts_nv['fsync_seconds']):.2f} s"],
            ["`publish.save(verify=True)` (as rank 0 of a multi-rank save)", med["publish_verify"],
             med["publish_verify"] / base_s, f"fsync {statistics.median(parts['fsync_seconds']):.2f} s, verify "
             f"{statistics.median(parts['verify_seconds']):.2f} s"],
            ["`publish.save(background=True)`: blocking until it returns", med["publish_async"],
             med["publish_async"] / base_s, f"then commit {statistics.median(commit_async):.2f} s in the background "
             f"(CPU column: staging and commit)"]]
    spread = "; ".join(f"{k}: " + ", ".join(f"{x:.2f}" for x in v) for k, v in times.items())
    return "\n".join([
        f"State: {n} float32 tensors of 64 MiB = {size / C.GIB:.2f} GiB; file ~ {size / C.GIB:.2f} GiB. "
        f"Median of {repeats} interleaved rounds, seconds (all runs: {spread}).", "",
        C.md_table(["save", "median s", "× plain", "× torch.save + fsync (of the medians)",
                    "× torch.save + fsync (median of per-round ratios)", "CPU s (all threads)", "of which"],
                   [r[:3] + [sync_s and med[k] / sync_s, ratio[k], mcpu[k]] + r[3:] for r, k in zip(rows, times)]),
        "",
        f"The first background save of the run blocked {first_async:.2f} s (it allocates the staging copy, "
        f"{size / C.GIB:.2f} GiB of CPU memory kept for the next saves).", "",
        f"For scale: one SHA-256 pass over {size / C.GIB:.2f} GiB takes {sha_s:.2f} s on one core here "
        "(hashlib, in memory)."])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--async-kills", type=int, default=1000, help="kills of background publishes (0: skip)")
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="folder on the file system to measure")
    ap.add_argument("--skip-crash", action="store_true")
    ap.add_argument("--skip-overhead", action="store_true")
    a = ap.parse_args(argv)
    base = Path(a.dir)
    print(f"<!-- {C.machine_line()} -->")
    if not a.skip_crash:
        if a.kills:
            print(crash_part(a.kills, base))
            print()
        if a.async_kills:
            print(crash_part(a.async_kills, base, background=True))
            print()
    if not a.skip_overhead:
        load0 = os.getloadavg()[0]
        print(overhead_part(a.size_gib, a.repeats, base))
        print(f"\n1-minute load average before/after the overhead rounds: {load0:.1f} / {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores (other jobs on the machine inflate the spread).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
