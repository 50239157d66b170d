"""Issue 43: salvage's property over ≥ 500 random cases (tests/salvage_property.py holds the strategy and check).

Each case: a random state dict (every dtype torch saves, 0-d and zero-element tensors, views sharing storages,
nested and dotted keys), saved as a torch zip, a safetensors file, or a ``ckptaudit.publish`` unit (file,
safetensors, folder), damaged once at random (cut, flip, zeroed page, rewritten header, swapped offsets) and
salvaged.  Acceptance: no case raises, no tensor labelled intact or filled differs from its original in dtype,
shape or bytes, every written file loads with ``safetensors.torch.load_file`` with exactly the keys
salvage.json lists.  Prints one line (cases, failures, tensors per status, what proved the intact ones,
seconds) and the first failure's case; exit 1 when any case failed.

    /work/main/.venv/bin/python benchmarks/bench_salvage_property.py [--n 500] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--n", type=int, default=500, help="cases (default 500)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    a = ap.parse_args(argv)
    from hypothesis import HealthCheck, given, seed, settings

    from tests.salvage_property import case, check

    stats = {"cases": 0, "status": collections.Counter(), "proof": collections.Counter(),
             "shape": collections.Counter()}
    failures = []

    @seed(a.seed)
    @settings(max_examples=a.n, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case())
    def one(c):
        tmp = Path(tempfile.mkdtemp(prefix="salvage-property-"))
        try:
            rep = check(c, tmp)
            stats["cases"] += 1
            stats["shape"][(c["format"], c["damage"])] += 1
            for r in rep["tensors"]:
                stats["status"][r["status"]] += 1
                if r["proven_by"]:
                    stats["proof"][f"{r['proven_by']['identity']}+{r['proven_by']['bytes']}"] += 1
        except BaseException as e:  # noqa: BLE001 - every failure is counted and the first one shown
            import traceback

            failures.append((c["format"], c["damage"], c["at"], c["bit"], f"{type(e).__name__}: {e}"[:400],
                             traceback.format_exc(limit=-3)))
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    t0 = time.perf_counter()
    try:
        one()
    except BaseException as e:  # noqa: BLE001 - hypothesis re-raises the shrunk failure
        print(f"FAILED: {type(e).__name__}: {str(e)[:600]}")
    dt = time.perf_counter() - t0
    print(f"salvage property: {stats['cases']} cases passed, {len(failures)} failed, {dt:.1f} s; "
          f"tensors {dict(stats['status'])}; intact proven by {dict(stats['proof'])}; "
          f"format x damage cells {len(stats['shape'])}")
    if failures:
        print("first failure:", failures[0][:5])
        print(failures[0][5])
    return 1 if failures or stats["cases"] < a.n else 0


if __name__ == "__main__":
    sys.exit(main())
