"""The walker's opcode decoder alone: ``ckptaudit.pickle_walk.opcodes.genops`` over a torch.save data.pkl.

Builds the data.pkl of a ``torch.save`` of ``--tensors`` small tensors (in memory), then times ``--repeats``
full passes of ``genops`` over it in this process and prints the opcode count, the median and every pass.
For an A/B of two versions, run it alternately from two checkouts (``--repo`` puts that checkout first on
``sys.path``)::

    python benchmarks/bench_genops.py [--tensors 100000] [--repeats 7] [--repo <checkout>]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
import zipfile
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parent.parent))
    a = ap.parse_args(argv)
    sys.path.insert(0, a.repo)
    import torch

    from ckptaudit.pickle_walk import opcodes

    b = io.BytesIO()
    torch.save({f"t{i}": torch.zeros(2) for i in range(a.tensors)}, b)
    with zipfile.ZipFile(io.BytesIO(b.getvalue())) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    times, n = [], 0
    for _ in range(a.repeats):
        f = io.BytesIO(data)
        t0 = time.perf_counter()
        n = sum(1 for _ in opcodes.genops(data, f))
        times.append(time.perf_counter() - t0)
    print(f"{opcodes.__file__}: {n} opcodes, median {statistics.median(times):.3f} s "
          f"({', '.join(f'{t:.3f}' for t in times)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
