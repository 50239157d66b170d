"""The static pickle walk's cost per opcode, against the standard library's opcode decoder alone.

Three pickles, built here: the ``data.pkl`` of a real ``torch.save`` of a dict of ``--tensors`` one-element
tensors (each its own storage, as bench_counts.py's), the same at ten times the count, and a list of
2,000,000 ``BININT1`` (the hostile-run shape of tests/test_hostile.py, at a tenth).  For each, ``--repeats``
interleaved pairs in one process: :func:`ckptaudit.pickle_walk.walk` of the bytes, and iterating
``pickletools.genops`` over them (decoding only, no object built: what the walk paid for decoding alone
before it decoded from the buffer).  Reported: medians, µs per opcode, and the median of the per-pair
ratios walk ÷ genops.

    python benchmarks/bench_walk.py [--tensors 10000] [--repeats 7]

Prints a Markdown section for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import io
import pickletools
import statistics
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _common as C  # noqa: E402


def _torch_data_pkl(n: int) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({f"layers.{i // 64}.w{i % 64}": torch.zeros(1) for i in range(n)}, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        return z.read(next(m for m in z.namelist() if m.endswith("data.pkl")))


def _genops_alone(data: bytes) -> int:
    n = 0
    for _ in pickletools.genops(io.BytesIO(data)):
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    from ckptaudit.pickle_walk import walk

    cases = {f"torch.save data.pkl, {a.tensors:,} tensors": _torch_data_pkl(a.tensors),
             f"torch.save data.pkl, {10 * a.tensors:,} tensors": _torch_data_pkl(10 * a.tensors),
             "2,000,000 BININT1 in one list": b"\x80\x02](" + b"K\x01" * 2_000_000 + b"e."}
    rows = []
    for name, data in cases.items():
        n_ops = _genops_alone(data)
        w, g, ratios = [], [], []
        for _ in range(a.repeats):
            t = time.perf_counter()
            r = walk(data)
            tw = time.perf_counter() - t
            t = time.perf_counter()
            _genops_alone(data)
            tg = time.perf_counter() - t
            w.append(tw)
            g.append(tg)
            ratios.append(tw / tg)
        assert r.error is None, r.error
        mw, mg = statistics.median(w), statistics.median(g)
        rows.append([name, f"{len(data) / C.MIB:.1f}", f"{n_ops:,}", f"{mw:.3f}", f"{mg:.3f}",
                     f"{1e6 * mw / n_ops:.2f}", f"{statistics.median(ratios):.2f}"])
    print("### The static walk against pickletools.genops alone\n")
    print(C.machine_line() + "\n")
    print(C.md_table(["pickle", "MiB", "opcodes", "walk s (median)", "genops alone s (median)", "walk µs/opcode",
                      "walk ÷ genops (median of pairs)"], rows))
    print(f"\n{a.repeats} interleaved pairs per pickle, one process.")


if __name__ == "__main__":
    main()
