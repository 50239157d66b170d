"""Bytes read by an audit of an ``s3://`` run versus the bytes stored, per stage.

Starts moto's standalone S3 server on loopback (``python -m moto.server``), uploads a
demo run (``ckptaudit.demo.make_demo_run``: steps 100…600, one flipped byte, one
truncated save, sidecars), then runs the audit's stages in process as
:func:`ckptaudit.pipeline.audit_in_process` does and reads :func:`ckptaudit.fs.bytes_read`
after each stage.  "ranged" bytes are the small reads of headers, zip directories and
pickles; "streamed" bytes are whole-object passes (hashing, the zip CRC check, the
NaN/Inf value scan, the load test's download).  Wall times include loopback HTTP only,
so they say nothing about a real bucket's latency.

    /work/venv/bin/python benchmarks/bench_s3.py [--max-steps 600] [--save-every 100] [--window-bytes N] [--no-prefetch] [--latency-ms MS]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the repository (for tests.test_s3) goes last, so a PYTHONPATH snapshot of another commit is what runs
sys.path.append(str(Path(__file__).resolve().parent.parent))
import _common as C  # noqa: E402

ACCEPT_RATIO = 1.05  # issue 15: the whole audit reads each object byte about once


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=600)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--window-bytes", type=int, default=None,
                    help="override ckptaudit.formats.torchzip.REMOTE_WINDOW_BYTES (least bytes per small GET)")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="add this many ms before every S3 request the audit sends (aiobotocore, as a real "
                         "bucket's round trip would; concurrent requests wait concurrently)")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="read zip local headers and small tensor values one GET at a time (torchzip.REMOTE_PREFETCH = False)")
    a = ap.parse_args()
    from ckptaudit.formats import torchzip

    if a.window_bytes is not None:
        torchzip.REMOTE_WINDOW_BYTES = a.window_bytes
    torchzip.REMOTE_PREFETCH = not a.no_prefetch
    if a.latency_ms > 0:
        import asyncio

        from aiobotocore import httpsession

        send = httpsession.AIOHTTPSession.send

        async def slow_send(self, request):
            await asyncio.sleep(a.latency_ms / 1000)
            return await send(self, request)

        httpsession.AIOHTTPSession.send = slow_send

    import boto3

    from ckptaudit import fs
    from ckptaudit.stages import cli as stages
    from ckptaudit.stages import report, target
    from ckptaudit.demo import make_demo_run
    from ckptaudit.pipeline import audit_in_process, default_config
    from tests.test_s3 import BUCKET, s3_env, start_moto, upload_tree

    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        tmp = Path(tmp)
        run = make_demo_run(tmp / "run", max_steps=a.max_steps, save_every=a.save_every)
        proc, url = start_moto(tmp / "moto.log")
        try:
            os.environ.update(s3_env(url))
            client = boto3.client("s3", endpoint_url=url)
            client.create_bucket(Bucket=BUCKET)
            total = upload_tree(client, Path(run.run_dir), BUCKET, "run")
            n_obj = sum(1 for p in Path(run.run_dir).rglob("*") if p.is_file())
            c = default_config()
            rows = []

            def measure(name, fn):
                fs.reset_bytes_read()
                t0 = time.perf_counter()
                out = fn()
                rows.append((name, fs.bytes_read("ranged"), fs.bytes_read("streamed"), fs.gets_issued(),
                             fs.round_trips(), time.perf_counter() - t0))
                return out

            url_run = f"s3://{BUCKET}/run"
            out = tmp / "out"
            work = out / "work"
            inv = measure("inventory (LIST + pointer files)", lambda: stages.stage_inventory(
                url_run, "auto", str(out / "tables/inventory.parquet"), str(work / "inventory.json"),
                str(work / "pointers.parquet")))
            (work / "config.json").write_text(json.dumps(c))
            target.write(c, str(work / "target.json"))
            parts = sorted(inv["parts"])
            P = {p: {s: str(out / "tables/parts" / s / f"{p}.parquet") for s in report.STAGES} for p in parts}
            # the workflow's order: hash first (a one-pass hash stage leaves facts the later stages read)
            measure("hash (SHA-256 vs sidecars)", lambda: [stages.stage_hash(inv, p, P[p]["hash"]) for p in parts])
            measure("scan: file + security layers", lambda: [stages.stage_scan(inv, p, c, P[p]["scan"],
                                                                               P[p]["tensors"], P[p]["imports"])
                                                             for p in parts])
            measure("load test (download ≤ limit, torch.load)", lambda: [
                stages.stage_load(inv, p, c, P[p]["scan"], P[p]["load"]) for p in parts])
            measure("state (NaN/Inf value scan)", lambda: [
                stages.stage_state(inv, p, c, P[p]["scan"], P[p]["tensors"], P[p]["state"]) for p in parts])
            fs.reset_bytes_read()
            t0 = time.perf_counter()
            v_s3 = audit_in_process(url_run, None, tmp / "out_s3")
            s3_s, s3_total, s3_gets, s3_rounds = (time.perf_counter() - t0, fs.bytes_read(), fs.gets_issued(),
                                                  fs.round_trips())
            t0 = time.perf_counter()
            v_local = audit_in_process(run.run_dir, None, tmp / "out_local")
            local_s = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(10)
    def facts(v):
        return (v.get("recommendation"), (v.get("rollback") or {}).get("unit"),
                [(u["unit"], u.get("usable_for"), u.get("status")) for u in v["units"]])

    same = facts(v_s3) == facts(v_local)
    print(C.machine_line() if hasattr(C, "machine_line") else "")
    print()
    from ckptaudit.formats import torchzip

    print(f"REMOTE_WINDOW_BYTES = {torchzip.REMOTE_WINDOW_BYTES:,}, REMOTE_PREFETCH = {torchzip.REMOTE_PREFETCH}, "
          f"added latency per request = {a.latency_ms:g} ms")
    print(f"Demo run: {n_obj} objects, {total} bytes ({total / C.MIB:.2f} MiB); "
          f"{len(inv['units'])} units.")
    print()
    print("| stage | ranged bytes | streamed bytes | total / object bytes | GETs | round trips | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, r, s, g, rt, dt in rows:
        print(f"| {name} | {r:,} | {s:,} | {(r + s) / total:.3f} | {g:,} | {rt:,} | {dt:.2f} |")
    print()
    print(f"Whole audit (audit_in_process): s3 {s3_total:,} bytes read = {s3_total / total:.2f}× the object bytes, "
          f"{s3_gets:,} GETs in {s3_rounds:,} round trips, {s3_s:.1f} s; local audit of the same files {local_s:.1f} s; "
          f"verdicts equal (recommendation, rollback unit, every unit's usable_for and status): {same}.")
    ratio = s3_total / total
    print(f"Issue 15 acceptance (whole-audit bytes read ≤ {ACCEPT_RATIO} × object bytes, verdicts equal the local "
          f"audit's): {ratio:.3f}× — {'MET' if ratio <= ACCEPT_RATIO and same else 'MISSED'}.  "
          f"ckptaudit imported from {Path(fs.__file__).resolve().parent.parent.parent}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
