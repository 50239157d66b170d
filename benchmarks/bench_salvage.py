"""Salvage of a damaged 1 GiB unit against one SHA-256 pass over it (issue 27: ≤ 1.5×).

Builds a ``torch.save`` file of ``--size-gib`` (default 1) holding ``{"model": --tensors float32 tensors,
"iter_num"}``, cuts it at ``--cut`` (default 0.9) of its bytes, as a full disk leaves it, and measures in
``--repeats`` interleaved rounds: ``hashlib.file_digest(f, "sha256")`` of the damaged file (the baseline: one
read and one SHA-256 of every byte) and ``ckptaudit.salvage.salvage(unit, out)`` into a fresh folder (the
CRC-32 pass over every record, the static walk, the copy of every intact tensor into a published safetensors
file: hashed while written, fsynced, sidecar and manifest).  The file stays in the page cache for both; the
output folder is removed after each round.  Ratio: median of per-round ratios.  A third column, the write
floor, copies the bytes salvage writes into a new file with fsync and nothing else: what this disk and page
cache charge for the output alone.

    python benchmarks/bench_salvage.py [--size-gib 1] [--tensors 64] [--cut 0.9] [--repeats 5] [--dir /tmp]

Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common as C  # noqa: E402


def build(path: Path, size_gib: float, n: int, cut: float) -> int:
    import torch

    numel = int(size_gib * C.GIB) // n // 4
    g = torch.Generator().manual_seed(0)
    torch.save({"model": {f"layer{i}.weight": torch.randn(numel, generator=g) for i in range(n)}, "iter_num": 900},
               path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(int(size * cut))
    return size


def sha256_pass(path: Path) -> float:
    t = time.perf_counter()
    with open(path, "rb") as f:
        hashlib.file_digest(f, "sha256")
    return time.perf_counter() - t


def write_floor(path: Path, out: Path, nbytes: int) -> float:
    """A plain copy of ``nbytes`` of ``path`` into a new file with fsync (4 MiB pieces, nothing hashed): what
    writing the salvaged bytes costs on this disk and page cache at best."""
    import os

    t = time.perf_counter()
    src = os.open(path, os.O_RDONLY)
    dst = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        done = 0
        while done < nbytes:
            b = os.pread(src, min(4 << 20, nbytes - done), done)
            if not b:
                break
            os.write(dst, b)
            done += len(b)
        os.fsync(dst)
    finally:
        os.close(src)
        os.close(dst)
    secs = time.perf_counter() - t
    os.unlink(out)
    return secs


def salvage_once(path: Path, out: Path) -> tuple:
    from ckptaudit.salvage import salvage

    t = time.perf_counter()
    report = salvage(path, out)
    secs = time.perf_counter() - t
    shutil.rmtree(out)
    return secs, report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--cut", type=float, default=0.9)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-salvage-", dir=a.dir))
    try:
        run = work / "run"
        run.mkdir()
        unit = run / "ckpt_000900.pt"
        full = build(unit, a.size_gib, a.tensors, a.cut)
        have = unit.stat().st_size
        sha256_pass(unit)  # into the page cache
        rows, ratios, floors = [], [], []
        _, report = salvage_once(unit, work / "warm")  # the first salvage imports what it needs
        written = report["bytes"]["written"]
        for r in range(a.repeats):
            base = sha256_pass(unit)
            floor = write_floor(unit, work / f"floor{r}", written)
            secs, report = salvage_once(unit, work / f"out{r}")
            ratios.append(secs / base)
            floors.append(secs / floor)
            rows.append([r + 1, f"{base:.2f}", f"{floor:.2f}", f"{secs:.2f}", f"{secs / base:.2f}×",
                         f"{secs / floor:.2f}×"])
        print(f"## salvage of a {a.size_gib:g} GiB unit cut at {a.cut:.0%} ({have:,} of {full:,} bytes)\n")
        print(C.machine_line())
        print(C.code_state() + "\n")
        print(C.md_table(["round", "SHA-256 pass (s)", "write floor (s)", "salvage (s)", "÷ SHA-256", "÷ floor"],
                         rows))
        c = report.get("counts", {})
        print(f"\nmedian ratio to the SHA-256 pass **{statistics.median(ratios):.2f}×** (target ≤ 1.5×), to the write "
              f"floor {statistics.median(floors):.2f}×; tensors intact {c.get('intact')}, lost {c.get('lost')}; "
              f"bytes written {written:,}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
