"""Audits of ``s3://`` runs against a real S3 API on loopback (moto's standalone server).

Guards against an object-storage audit that disagrees with the local audit of the same
bytes, that downloads whole objects for the file layer, that misses a save whose multipart
upload never completed, or that leaks a credential into the audit's outputs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from .conftest import CASES

pytest.importorskip("s3fs")
pytest.importorskip("moto")
boto3 = pytest.importorskip("boto3")

SECRET = "ckptauditFAKEsecretKEY0123456789abcdefXYZ"  # must never reach an output
ACCESS = "AKIACKPTAUDITFAKE0001"
BUCKET = "ckpt-bucket"
S3_CASES = ["ok_full_torch", "trunc_zip_at_50pct", "ds_latest_points_to_missing_tag", "hf_index_missing_shard",
            "security_malicious_reduce_zip", "ok_dcp"]
UNFINISHED_KEY = "ckpt_000350.pt"  # a save whose multipart upload never completed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto(log_path: Path):
    """Start ``python -m moto.server`` on a free loopback port; (process, endpoint url)."""
    port = _free_port()
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).read()
            break
        except Exception:  # noqa: BLE001 - not up yet
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start; see {log_path}")
            time.sleep(0.2)
    return proc, url


def s3_env(endpoint: str) -> dict:
    return {"AWS_ACCESS_KEY_ID": ACCESS, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1"}


def upload_tree(client, local: Path, bucket: str, prefix: str) -> int:
    """Upload every file under ``local`` to ``bucket/prefix/…`` (symlinks as the file they
    name); total bytes."""
    total = 0
    for p in sorted(local.rglob("*")):
        if p.is_file():
            key = f"{prefix}/{p.relative_to(local).as_posix()}"
            client.upload_file(str(p), bucket, key)
            total += p.stat().st_size
    return total


def build_run(dest: Path, demo_dir: Path, cases=S3_CASES) -> Path:
    """A run folder: the demo run at the top, each case under ``cases/<name>/``; symlinks become files."""
    shutil.copytree(demo_dir, dest, symlinks=False)
    for c in cases:
        shutil.copytree(CASES / c, dest / "cases" / c, symlinks=False, ignore=shutil.ignore_patterns("expected.json"))
    return dest


def normalised(v, *roots: str):
    """verdict with run folder paths replaced by RUN (and timings dropped)."""
    text = json.dumps(v, sort_keys=True)
    for r in roots:
        text = text.replace(r.rstrip("/"), "RUN")
    doc = json.loads(text)
    for k in ("generated_at", "elapsed_seconds", "audit_seconds", "bytes_verified"):
        doc.pop(k, None)
    for u in doc.get("units", []):
        u.pop("last_hashed_utc", None)  # when this audit hashed the unit: never equal across two audits
        u.pop("last_verified_utc", None)  # the same time, as verify_budget.annotate names it
        u.pop("mtime_unix", None)  # a file's mtime here, the object's upload time there
    return doc


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """A moto S3 server on loopback with the AWS environment pointing at it (fake keys)."""
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc, url = start_moto(log)
    env = s3_env(url)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    client = boto3.client("s3", endpoint_url=url)
    client.create_bucket(Bucket=BUCKET)
    try:
        yield {"url": url, "client": client, "env": env}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def s3_run(moto_s3, demo_run, tmp_path_factory):
    """The demo run plus six handed cases, local and uploaded to s3://BUCKET/run, with one
    multipart upload left unfinished at run/ckpt_000350.pt."""
    local = build_run(tmp_path_factory.mktemp("s3local") / "run", Path(demo_run.run_dir))
    c = moto_s3["client"]
    total = upload_tree(c, local, BUCKET, "run")
    mp = c.create_multipart_upload(Bucket=BUCKET, Key=f"run/{UNFINISHED_KEY}")
    c.upload_part(Bucket=BUCKET, Key=f"run/{UNFINISHED_KEY}", UploadId=mp["UploadId"], PartNumber=1,
                  Body=b"\0" * (5 << 20))
    return {"local": local, "url": f"s3://{BUCKET}/run", "object_bytes": total}


@pytest.fixture(scope="session")
def audits(s3_run, tmp_path_factory):
    from ckptaudit import fs
    from ckptaudit.pipeline import audit_in_process

    out_local = tmp_path_factory.mktemp("out_local")
    out_s3 = tmp_path_factory.mktemp("out_s3")
    cfg = {"load": {"enabled": True, "timeout_seconds": 60}}
    v_local = audit_in_process(s3_run["local"], cfg, out_local)
    fs.reset_bytes_read()
    v_s3 = audit_in_process(s3_run["url"], cfg, out_s3)
    return {"local": v_local, "s3": v_s3, "out_s3": out_s3, "ranged": fs.bytes_read("ranged"),
            "streamed": fs.bytes_read("streamed")}


def _units(v) -> dict:
    return {u["unit"]: u for u in v["units"]}


def _unverified(local: dict, remote: dict) -> None:
    """Drop the unverified-files detail of both units' sidecar_missing after checking that the S3 one names the
    local one's files and the DCP data files besides."""
    fl = next(f for f in local["findings"] if f["kind"] == "sidecar_missing")
    fr = next(f for f in remote["findings"] if f["kind"] == "sidecar_missing")
    assert set(fl["detail"]["unverified_files"]) < set(fr["detail"]["unverified_files"])
    assert all(x.endswith(".distcp") for x in set(fr["detail"]["unverified_files"]) - set(fl["detail"]["unverified_files"]))
    for f in (fl, fr):
        f["detail"] = {k: v for k, v in f["detail"].items() if k not in ("unverified_files", "n_unverified")}


def test_s3_verdict_equals_local_apart_from_paths(audits, s3_run):
    """Same bytes, same verdict: the S3 audit of a mixed run equals the local one."""
    vl = normalised(audits["local"], str(s3_run["local"]))
    vs = normalised(audits["s3"], s3_run["url"])
    vs["units"] = [u for u in vs["units"] if u["unit"] != UNFINISHED_KEY]
    vs_rest = {k: v for k, v in vs.items() if k not in ("units",)}
    vl_rest = {k: v for k, v in vl.items() if k not in ("units",)}
    assert [u["unit"] for u in vs["units"]] == [u["unit"] for u in vl["units"]]
    for a, b in zip(vl["units"], vs["units"]):
        if a["unit"].endswith("step-6"):  # a remote .distcp's records get no CRC-32 yet (BENCHMARKS, issue 28): the
            _unverified(a, b)           # S3 audit rightly names it among the files no checksum covered
        assert a == b, a["unit"]
    assert set(vs_rest) == set(vl_rest)


def test_unfinished_multipart_upload_is_a_finding_on_its_unit(audits):
    u = _units(audits["s3"]).get(UNFINISHED_KEY)
    assert u is not None, sorted(_units(audits["s3"]))
    text = json.dumps(u)
    assert "incomplete_multipart_upload" in text
    assert UNFINISHED_KEY not in _units(audits["local"])


def test_credentials_never_reach_the_outputs(audits):
    for p in Path(audits["out_s3"]).rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert SECRET.encode() not in data, p
            assert ACCESS.encode() not in data, p


def test_file_layer_reads_a_fraction_of_the_objects(audits, s3_run):
    """The small reads (headers, zip directories, pickles) of the whole S3 audit are ranged GETs
    that fetch a fraction of the object bytes; whole-object passes (hashing, the zip CRC check,
    the value scan, the load test's download) are counted apart as "streamed"."""
    total = s3_run["object_bytes"]
    assert 0 < audits["ranged"] < total // 4, (audits["ranged"], total)
    assert audits["streamed"] >= total // 2, (audits["streamed"], total)  # hashing reads every byte


def test_cli_audit_of_s3_through_snakemake(moto_s3, tmp_path, demo_run):
    """`ckptaudit audit s3://…` runs the real workflow against the moto endpoint."""
    local = tmp_path / "small"
    local.mkdir()
    for c in ("ok_full_torch", "trunc_zip_at_50pct"):
        shutil.copytree(CASES / c, local / c, ignore=shutil.ignore_patterns("expected.json"))
    upload_tree(moto_s3["client"], local, BUCKET, "small")
    out = tmp_path / "out"
    env = {**os.environ, **moto_s3["env"]}
    exe = Path(sys.executable).parent / "ckptaudit"
    r = subprocess.run([str(exe), "audit", f"s3://{BUCKET}/small", "--out", str(out),
                        "--cores", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert (out / "verdict.json").exists(), r.stdout + r.stderr
    v = json.loads((out / "verdict.json").read_text())
    units = _units(v)
    assert set(units) == {"ok_full_torch/ckpt.pt", "trunc_zip_at_50pct/ckpt.pt"}, sorted(units)
    assert SECRET not in r.stdout + r.stderr
    for p in out.rglob("*"):
        if p.is_file():
            assert SECRET.encode() not in p.read_bytes(), p


def test_readme_documents_s3_runs():
    """The S3 document names the commands a user runs against their own bucket."""
    from .conftest import REPO

    text = (REPO / "docs" / "s3.md").read_text()
    sec = text[text.index("## Runs in object storage (S3)"):]
    for cmd in ("ckptaudit audit s3://", "snakemake --cores 8 audit --config run_dir=s3://", "AWS_ENDPOINT_URL=",
                "AWS_PROFILE", "python -m pytest tests/test_s3.py", "incomplete_multipart_upload"):
        assert cmd in sec, cmd


@pytest.mark.parametrize("prefetch", [True, False], ids=["batched", "one-by-one"])
def test_zip_walk_on_s3_batches_its_header_reads(moto_s3, tmp_path, monkeypatch, prefetch):
    """The local header and data descriptor of every member of a remote torch zip come in one
    concurrent batch of ranged GETs: round trips (what a bucket's latency multiplies) do not
    grow with the number of tensors, and the walk finds the same members and CRCs."""
    import torch

    from ckptaudit import fs
    from ckptaudit.formats import torchzip

    monkeypatch.setattr(torchzip, "REMOTE_PREFETCH", prefetch)
    state = {f"layer{i}.weight": torch.full((3000 + i,), float(i)) for i in range(300)}  # ~12 KB each
    local = tmp_path / "ckpt_000001.pt"
    torch.save(state, local)
    moto_s3["client"].upload_file(str(local), BUCKET, "batch/ckpt_000001.pt")
    fs.reset_bytes_read()
    rep = torchzip.check_zip(f"s3://{BUCKET}/batch/ckpt_000001.pt")
    ref = torchzip.check_zip(str(local))
    assert [(m.name, m.data_offset, m.crc_ok) for m in rep.members] == \
        [(m.name, m.data_offset, m.crc_ok) for m in ref.members]
    assert len(rep.members) == 306 and all(m.crc_ok for m in rep.members if m.name.split("/")[-2] == "data")
    assert rep.findings == [] == ref.findings
    if prefetch:  # EOCD, central directory, one header batch, data.pkl, a few CRC stream blocks
        assert fs.round_trips() <= 15, (fs.round_trips(), fs.gets_issued())
        assert fs.gets_issued() >= 306
    else:  # a header GET per member whose header the 64 KiB window of the previous one missed
        assert fs.round_trips() >= 50, fs.round_trips()



def test_hash_pass_reads_each_object_byte_once_and_state_reads_none(audits, s3_run):
    """Per-stage bytes from the code's counters (<out>/work/bytes/<stage>/<part>.json): the hash stage's one
    ranged pass fetches every object byte of the units once (small objects are planned from the bytes it fetched, so no
    header reads of its own beyond the sidecars); the state stage reads nothing (its value statistics come from
    that pass)."""
    def stage(name):
        docs = [json.loads(p.read_text()) for p in (Path(audits["out_s3"]) / "work" / "bytes" / name).glob("*.json")]
        assert docs, name
        return sum(d["total"] for d in docs)

    total = s3_run["object_bytes"]
    assert 0.99 * total <= stage("hash") <= total + 4096, (stage("hash"), total)  # pointer files are not hashed
    assert stage("state") == 0


def test_whole_s3_audit_reads_each_object_byte_about_once(audits, s3_run):
    """Issue 15: the whole audit of an s3:// run reads at most 1.05 × the object bytes.  The hash stage's pass
    keeps what later stages read again (headers, data.pkl, small tensors, damaged archives whole), so the scan
    and the load test's sparse copy fetch only a few header windows that reach into long tensor data."""
    total = s3_run["object_bytes"]
    whole = audits["ranged"] + audits["streamed"]
    assert whole <= 1.05 * total, (whole, total)
    later = [json.loads(p.read_text())["total"] for name in ("scan", "load", "state")
             for p in (Path(audits["out_s3"]) / "work" / "bytes" / name).glob("*.json")]
    assert sum(later) <= 0.02 * total, (later, total)


def test_object_rewritten_with_the_same_size_drops_its_facts_and_changes_its_unit(moto_s3, tmp_path):
    """A writer beside the audit replaces an object with other bytes of the same size after the hash stage's
    pass: the later stages drop that object's facts and kept bytes (its ETag differs), so they read it again,
    and the report's liveness check (a fresh listing) names the unit as changed during the audit."""
    torch = pytest.importorskip("torch")
    from ckptaudit import fs
    from ckptaudit.stages import liveness
    from ckptaudit.onepass import facts
    from ckptaudit.onepass.filepass import pass_file

    c = moto_s3["client"]
    p = tmp_path / "ckpt.pt"
    torch.save({"w": torch.randn(100_000), "step": 7}, p)
    key = "rewrite/ckpt_000007.pt"
    c.put_object(Bucket=BUCKET, Key=key, Body=p.read_bytes())
    root = fs.path(f"s3://{BUCKET}/rewrite")
    fs.refresh(root)
    snap = liveness.snapshot(root, ["ckpt_000007.pt"])
    ff = pass_file(root / "ckpt_000007.pt")
    rows = facts.rows_of("ckpt_000007.pt", "ckpt_000007.pt", ff)
    loaded = facts.load(rows, root)
    assert ff.kept and len(loaded) == len(rows)  # unchanged: every fact answers, bytes kept
    assert loaded.kept.has(fs.fspath(root / "ckpt_000007.pt"))
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size, other bytes
    c.put_object(Bucket=BUCKET, Key=key, Body=bytes(data))
    assert liveness.changed_files(root, snap) == ["ckpt_000007.pt"]  # listed again: a new ETag
    again = facts.load(rows, root)
    assert len(again) == 0 and not again.kept.has(fs.fspath(root / "ckpt_000007.pt"))


def test_a_remote_record_failing_its_crc_is_told_from_the_pass_with_no_read_again(moto_s3, tmp_path):
    """Of a remote object the pass looks for each zip record's longest NUL run (a local file's failing record is
    read again instead): the scan tells a failing record's run from the pass's facts, as the local check tells
    it, and fetches no byte of that record again."""
    torch = pytest.importorskip("torch")
    from ckptaudit import fs
    from ckptaudit.formats.torchzip import check_zip
    from ckptaudit.onepass import facts
    from ckptaudit.onepass.filepass import pass_file
    from ckptaudit.onepass.plan import plan_file

    p = tmp_path / "bad.pt"
    g = torch.Generator().manual_seed(1)
    torch.save({"w": torch.randn(1024, 512, generator=g), "b": torch.randn(65536, generator=g)}, p)
    w_off, w_len = next((o, n) for m, o, n in plan_file(p).crc if m.endswith("data/0"))
    data = bytearray(p.read_bytes())
    data[w_off + 1000:w_off + 1000 + 8192] = bytes(8192)
    p.write_bytes(bytes(data))
    moto_s3["client"].upload_file(str(p), BUCKET, "nulrun/ckpt_000007.pt")
    root = fs.path(f"s3://{BUCKET}/nulrun")
    fs.refresh(root)
    ff = pass_file(root / "ckpt_000007.pt")
    assert ff.nul_run is not None and len(ff.nul_run) == len(ff.crc_value)
    rows = facts.rows_of("ckpt_000007.pt", "ckpt_000007.pt", ff)
    assert "nul_run" in {r["kind"] for r in rows}
    fs.reset_bytes_read()
    got = check_zip(root / "ckpt_000007.pt", facts=facts.load(rows, root))
    assert fs.bytes_read() < (64 << 10), fs.bytes_read()  # not the failing record's 2 MiB again
    assert [f.kind for f in got.findings] == ["zip_crc_mismatch"]
    assert got.findings[0].detail["longest_nul_run"] == [w_off + 1000, 8192]
    assert got.findings[0].detail == check_zip(p).findings[0].detail  # as the local check tells it


def test_thread_pool_tasks_read_from_the_kept_bytes_they_are_passed(moto_s3, tmp_path):
    """The kept bytes are a parameter of the reads (``kept=``), not a context: tasks of a thread pool, started with
    no copy of the caller's context, are served from the kept bytes they are handed (a range inside them costs no
    GET; one reaching into the tensor data fetches only that gap), and a file opened with them keeps them in any
    thread.  The same reads handed nothing fetch every byte."""
    torch = pytest.importorskip("torch")
    from concurrent.futures import ThreadPoolExecutor

    from ckptaudit import fs
    from ckptaudit.onepass import facts
    from ckptaudit.onepass.filepass import pass_file

    p = tmp_path / "ckpt.pt"
    torch.save({"w": torch.randn(100_000), "step": 7}, p)
    moto_s3["client"].upload_file(str(p), BUCKET, "pool/ckpt_000007.pt")
    root = fs.path(f"s3://{BUCKET}/pool")
    fs.refresh(root)
    obj = root / "ckpt_000007.pt"
    loaded = facts.load(facts.rows_of("ckpt_000007.pt", "ckpt_000007.pt", pass_file(obj)), root)
    kept, data = loaded.kept, p.read_bytes()
    runs = loaded.tensor_data_of(fs.fspath(obj))
    assert [n for _, n in runs] == [400_000]  # w's float32 storage: the one run of bytes the pass did not keep
    t0 = runs[0][0]
    ranges = [(0, 256), (len(data) - 200, 200), (t0 - 100, 300)]  # kept, kept, 100 kept + 200 of tensor data

    def reads(k):
        """(bytes served, GETs, bytes fetched, what each task read) of three pool tasks handed ``k``."""
        fs.reset_bytes_read()
        served = fs.kept.served_bytes()
        opened = fs.open_binary(obj, exact=True, kept=k)  # opened here, read in a task of the pool

        def from_opened():
            opened.seek(0)
            return opened.read(256)

        def opened_there():
            with fs.open_binary(obj, exact=True, kept=k) as fh:
                fh.seek(len(data) - 200)
                return fh.read(200)

        with opened, ThreadPoolExecutor(max_workers=3) as pool:
            got = [f.result() for f in (pool.submit(fs.read_ranges, obj, ranges, kept=k),
                                        pool.submit(from_opened), pool.submit(opened_there))]
        return fs.kept.served_bytes() - served, fs.gets_issued(), fs.bytes_read(), got

    expected = [[data[o:o + n] for o, n in ranges], data[:256], data[-200:]]
    assert reads(kept) == (256 + 200 + 100 + 256 + 200, 1, 200, expected)  # only the 200-byte gap is fetched
    assert reads(None) == (0, 3 + 1 + 1, 756 + 256 + 200, expected)  # handed nothing: every byte is a GET


def test_no_credentials_and_an_unreachable_endpoint_are_one_line_each(tmp_path):
    """Both stopped in the first job with a 27-line chained traceback of botocore frames (issue 28)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"), AWS_CONFIG_FILE=str(tmp_path / "none"),
               AWS_EC2_METADATA_DISABLED="true")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "s3.yaml"
    cfg.write_text(f"s3:\n  endpoint_url: http://127.0.0.1:{port}\n")
    cmd = [sys.executable, "-m", "ckptaudit.cli", "audit", "s3://bucket/run", "--config", str(cfg)]
    p = subprocess.run(cmd + ["--out", str(tmp_path / "a")], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("ckptaudit: error: no AWS credentials for s3://bucket/run: set AWS_ACCESS_KEY_ID")
    env.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s")
    p = subprocess.run(cmd + ["--out", str(tmp_path / "b")], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"ckptaudit: error: cannot reach the S3 endpoint at http://127.0.0.1:{port} for "
                               "s3://bucket/run: EndpointConnectionError"), p.stderr
