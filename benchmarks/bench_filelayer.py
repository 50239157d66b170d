"""File-layer throughput: ``check_zip(verify_crc=True)`` vs ``hashlib.file_digest(f, 'sha256')``.

Builds a ~1 GiB torch.save zip (4 float32 tensors of 256 MiB, random values)
in a child process (torch is not imported here), then times, interleaved on the
same file with a warm page cache, ``ckptaudit.formats.torchzip.check_zip`` (zip
structure + streamed CRC32 of every record) and ``hashlib.file_digest`` (SHA-256
of the whole file).  Reports the median of ``--repeats`` runs each in MB/s
(10^6 bytes per second) and the ratio, plus this process's peak RSS.  The file
is deleted at the end (also on failure).

    /work/venv/bin/python benchmarks/bench_filelayer.py [--size-mib 1024] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ckptaudit.formats.torchzip import check_zip  # noqa: E402

MAKE = (
    "import sys, torch\n"
    "n = int(sys.argv[2]) // 4 // 4\n"
    "g = torch.Generator().manual_seed(0)\n"
    "torch.save({f't{i}': torch.randn(n, generator=g) for i in range(4)}, sys.argv[1])\n"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    a = ap.parse_args()
    fd, name = tempfile.mkstemp(suffix=".pt", dir=a.dir)
    os.close(fd)
    path = Path(name)
    try:
        subprocess.run([sys.executable, "-c", MAKE, str(path), str(a.size_mib << 20)], check=True)
        size = path.stat().st_size
        with open(path, "rb") as f:  # warm the page cache once for both contenders
            hashlib.file_digest(f, "sha256")
        t_zip, t_sha = [], []
        for _ in range(a.repeats):
            t = time.perf_counter()
            rep = check_zip(path, verify_crc=True)
            t_zip.append(time.perf_counter() - t)
            assert rep.findings == [] and all(m.crc_ok for m in rep.members), rep.findings
            t = time.perf_counter()
            with open(path, "rb") as f:
                hashlib.file_digest(f, "sha256").hexdigest()
            t_sha.append(time.perf_counter() - t)
        mz, ms = statistics.median(t_zip), statistics.median(t_sha)
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"file: {size} bytes ({size / (1 << 30):.2f} GiB), {len(rep.members)} records; "
              f"nproc={os.cpu_count()}; repeats={a.repeats} (interleaved, page cache warm)")
        print("| what | median s | MB/s | runs (s) |")
        print("|---|---|---|---|")
        print(f"| check_zip(verify_crc=True) | {mz:.3f} | {size / 1e6 / mz:.0f} | "
              f"{', '.join(f'{x:.3f}' for x in t_zip)} |")
        print(f"| hashlib.file_digest sha256 | {ms:.3f} | {size / 1e6 / ms:.0f} | "
              f"{', '.join(f'{x:.3f}' for x in t_sha)} |")
        print(f"ratio check_zip / sha256 throughput: {ms / mz:.2f}x; peak RSS of this process: {rss_mib:.0f} MiB")
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
