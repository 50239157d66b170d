"""Reader side: what ``safe_load_checkpoint`` costs at a resume, against what it has to read (issue 23).

Runs of ``--units`` (default 4 and 16) nanoGPT-style ``torch.save`` files of ``--unit-mib`` (default 256; 1024
for 1 GiB units): ``{"model": 64 float32 tensors, "iter_num": step}``.  Plain units are bare ``torch.save``
files; with ``--published`` each unit is written as training code writes it with ``ckptaudit.publish.save(state,
run, step=step)`` (the file, its ``.sha256`` sidecar, its ``ckptaudit.manifest/2`` manifest with BLAKE3 chunk
digests, ``latest``).  Three states of each run, measured in ``--repeats`` interleaved rounds after one
warm-up call (imports):

* ``newest good``: nothing damaged;
* ``newest damaged``: one bit flipped in the middle of the newest unit's largest tensor record (size and
  mtime kept: only that record's CRC32 shows it; flipped back after the round);
* ``two newest damaged``: the same in the two newest units.

Per call: ``safe_load_checkpoint(run)`` wall time, and the baseline — SHA-256 of each unit the reader had to
examine (``ckpt.examined``), then ``torch.load(weights_only=True)`` of the unit it returned: what a careful
hand-written resume pays for the same answer (on a published unit too: the sidecar's digest is a SHA-256).
The ratio is of medians; the issue 45 target is ≤ 1.25.  ``bytes read`` is the reader's own
count (``ckpt.bytes_read``: the package's byte counters and the load-test children's reads, before the final
load).  Files stay in the page cache (the machine has the memory for them); a cold cache costs reader and
baseline the same reads.

    python benchmarks/bench_reader.py [--units 4 16] [--unit-mib 256] [--published] [--repeats 3] [--dir /tmp]

Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common as C  # noqa: E402


def make_run(d: Path, n_units: int, unit_mib: int, published: bool = False) -> list:
    """Write the run (names of its unit files, oldest first): ``torch.save`` files, or with ``published`` units
    of ``ckptaudit.publish.save`` (file, sidecar, manifest, ``latest``)."""
    import torch

    d.mkdir(parents=True)
    numel = (unit_mib << 20) // 64 // 4
    names = []
    for i in range(n_units):
        step = 100 * (i + 1)
        g = torch.Generator().manual_seed(step)
        state = {"model": {f"layer{k}.weight": torch.randn(numel, generator=g) for k in range(64)}, "iter_num": step}
        name = f"ckpt_{step:06d}.pt"
        if published:
            from ckptaudit.publish import save

            save(state, d, step=step)
            assert (d / name).is_file() and (d / f"{name}.sha256").is_file(), sorted(os.listdir(d))
        else:
            torch.save(state, d / name)
        names.append(name)
        del state
    return names


def _flip_offset(path: Path) -> int:
    with zipfile.ZipFile(path) as z:
        big = max(z.infolist(), key=lambda i: i.compress_size)
    with open(path, "rb") as f:
        f.seek(big.header_offset + 26)
        n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
    return big.header_offset + 30 + n + m + big.compress_size // 2


def flip(path: Path, at: int) -> None:
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def reader_call(run: Path) -> tuple:
    from ckptaudit import safe_load_checkpoint

    t0 = time.perf_counter()
    ckpt = safe_load_checkpoint(run)
    dt = time.perf_counter() - t0
    return dt, ckpt.unit, list(ckpt.examined), ckpt.bytes_read


def baseline_call(run: Path, examined: list, unit: str) -> float:
    import torch

    t0 = time.perf_counter()
    for name in examined:
        h = hashlib.sha256()
        with open(run / name, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
        h.hexdigest()
    obj = torch.load(run / unit, map_location="cpu", weights_only=True)
    del obj
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--unit-mib", type=int, default=256)
    ap.add_argument("--published", action="store_true", help="units written by ckptaudit.publish.save")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    load_before = os.getloadavg()
    import logging

    logging.getLogger("ckptaudit").setLevel(logging.ERROR)  # the skipped units' warnings, once per call
    rows = []
    for n in a.units:
        base = Path(tempfile.mkdtemp(prefix="bench-reader-", dir=a.dir))
        try:
            run = base / "run"
            names = make_run(run, n, a.unit_mib, a.published)
            at = {x: _flip_offset(run / x) for x in names[-2:]}
            reader_call(run)  # warm-up: the package's imports
            states = {"newest good": [], "newest damaged": names[-1:], "two newest damaged": names[-2:]}
            got = {s: {"reader": [], "baseline": [], "examined": None, "unit": None, "bytes": []} for s in states}
            for _ in range(a.repeats):
                for s, hurt in states.items():
                    for x in hurt:
                        flip(run / x, at[x])
                    try:
                        dt, unit, examined, nbytes = reader_call(run)
                        bt = baseline_call(run, examined, unit)
                    finally:
                        for x in hurt:
                            flip(run / x, at[x])
                    g = got[s]
                    g["reader"].append(dt)
                    g["baseline"].append(bt)
                    g["bytes"].append(nbytes)
                    g["examined"], g["unit"] = examined, unit
            total = sum((run / x).stat().st_size for x in names)
            for s, g in got.items():
                r, b = statistics.median(g["reader"]), statistics.median(g["baseline"])
                rows.append([n, s, g["unit"], len(g["examined"]), f"{r:.2f}", f"{b:.2f}", f"{r / b:.2f}",
                             f"{statistics.median(g['bytes']) / C.MIB:,.0f} of {total / C.MIB:,.0f}",
                             "met" if r / b <= 1.25 else "missed"])
        finally:
            shutil.rmtree(base, ignore_errors=True)
    kind = "published (ckptaudit.publish)" if a.published else "plain torch.save"
    print(f"### safe_load_checkpoint against SHA-256 + torch.load of what it examined ({a.unit_mib} MiB {kind} "
          "units)\n")
    print(C.machine_line() + "\n")
    print(f"load average (1, 5, 15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}\n")
    print(C.md_table(["units", "state", "returned", "examined", "reader s (median)", "baseline s (median)",
                      "ratio (≤ 1.25)", "MiB read by the checks", "target"], rows))
    print(f"\n{a.repeats} interleaved rounds per state after a warm-up call; medians.  Load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}.")


if __name__ == "__main__":
    main()
