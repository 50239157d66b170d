"""One pass per file (ckptaudit.onepass): each consumer against its reference, segments merged, the plan of a
real torch.save zip and of a safetensors file, the facts the scan and state stages read instead of bytes."""

import hashlib
import json
import os
import struct
import zlib

import blake3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptaudit import fs
from ckptaudit.onepass import facts
from ckptaudit.onepass.consumers import (ChunkDigest, RangeCrc32, RangeValues, Sha256, crc32_combine,
                                         split_points)
from ckptaudit.onepass.filepass import pass_file
from ckptaudit.onepass.plan import plan_file
from ckptaudit.onepass.stream import run
from ckptaudit.onepass.values import buffer_stats


def _feed(consumers, data: bytes, step: int, start: int = 0, end=None):
    end = len(data) if end is None else end
    for o in range(start, end, step):
        v = memoryview(data)[o:min(o + step, end)]
        for c in consumers:
            c.feed(o, v)


@pytest.mark.parametrize("n1,n2", [(0, 0), (1, 0), (0, 7), (5, 100), (4096, 99999)])
def test_crc32_combine_equals_zlib(n1, n2):
    a, b = os.urandom(n1), os.urandom(n2)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("step", [1, 3, 64, 1000, 1 << 20])
def test_sha_chunks_and_crc_for_any_buffer_size(step):
    data = os.urandom(10_007)
    sha, chunks, b3 = Sha256(), ChunkDigest(1000), ChunkDigest(1000, 0, "blake3")
    crc = RangeCrc32([("a", 0, 10_007), ("b", 13, 500), ("c", 9_000, 2_000), ("empty", 50, 0)])
    _feed([sha, chunks, b3, crc], data, step)
    assert sha.hexdigest() == hashlib.sha256(data).hexdigest()
    assert chunks.finish() == [hashlib.sha256(data[i:i + 1000]).hexdigest() for i in range(0, len(data), 1000)]
    assert b3.finish() == [blake3.blake3(data[i:i + 1000]).hexdigest() for i in range(0, len(data), 1000)]
    r = crc.results()
    assert r["a"] == (zlib.crc32(data), 10_007)
    assert r["b"] == (zlib.crc32(data[13:513]), 500)
    assert r["c"] == (zlib.crc32(data[9_000:]), 1_007)  # past the end of the file: only what is there
    assert r["empty"] == (0, 0)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("step", [1, 5, 4096])
def test_values_match_one_buffer(dtype, step):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(999).astype(np.float32)
    a[3], a[500] = np.nan, np.inf
    raw = (a.view(np.uint32) >> 16).astype(np.uint16).tobytes() if dtype == "bfloat16" else a.astype(dtype).tobytes()
    data = b"\x01" * 13 + raw + b"\x02" * 5  # starts at an odd offset: elements split across buffers
    v = RangeValues([("w", 13, len(raw), dtype)])
    _feed([v], data, step)
    bad, sq, seen = v.results()["w"]
    ref_bad, ref_sq = buffer_stats(raw, dtype)
    assert bad == ref_bad == 2 and seen == len(raw)
    assert sq == pytest.approx(ref_sq, rel=1e-5)


def test_segments_merge_to_the_whole():
    a = np.arange(20_001, dtype=np.float32)
    a[10_000] = np.nan
    data = b"\x00" * 3 + a.tobytes()
    ranges = [("m", 3, len(data) - 3)]
    vr = [("w", 3, len(data) - 3, "float32")]
    parts = []
    for s, e in split_points(len(data), 3, 1):  # boundaries fall inside elements
        c, v = RangeCrc32(ranges), RangeValues(vr)
        _feed([c, v], data, 4099, s, e)
        parts.append((c, v))
    c, v = parts[0]
    for c2, v2 in parts[1:]:
        c.merge(c2)
        v.merge(v2)
    assert c.results()["m"] == (zlib.crc32(data[3:]), len(data) - 3)
    bad, sq, seen = v.results()["w"]
    fin = np.delete(a, 10_000).astype(np.float64)
    assert (bad, seen) == (1, len(data) - 3) and sq == pytest.approx(float(fin @ fin), rel=1e-6)


def test_stream_reads_every_byte_once_and_counts_it(tmp_path):
    p = tmp_path / "f.bin"
    data = os.urandom(3 * 1000 + 17)
    p.write_bytes(data)
    sha = Sha256()
    before = fs.local_bytes_read()
    assert run(p, [sha], buffer_bytes=1000) == len(data)
    assert sha.hexdigest() == hashlib.sha256(data).hexdigest()
    assert fs.local_bytes_read() - before == len(data)


def _torch_zip(tmp_path):
    torch = pytest.importorskip("torch")
    sd = {"w": torch.arange(300, dtype=torch.float32), "b": torch.ones(7, dtype=torch.bfloat16),
          "i": torch.arange(5), "view": None}
    sd["w"][4] = float("nan")
    sd["view"] = sd["w"][10:20]  # a view into w's storage: its own value range
    p = tmp_path / "ckpt.pt"
    torch.save(sd, p)
    return p, sd


def test_plan_and_pass_of_a_torch_zip(tmp_path):
    import zipfile

    p, sd = _torch_zip(tmp_path)
    plan = plan_file(p)
    with zipfile.ZipFile(p) as z:
        infos = {i.filename: i for i in z.infolist()}
    assert {m for m, _, _ in plan.crc} == set(infos)
    raw = p.read_bytes()
    for m, off, n in plan.crc:
        assert zlib.crc32(raw[off:off + n]) == infos[m].CRC
    dtypes = sorted(d for _, _, d in plan.values)
    assert dtypes == ["bfloat16", "float32", "float32"]  # w, its view, b; the int64 tensor has no values
    ff = pass_file(p)
    assert ff.sha256_hex == hashlib.sha256(raw).hexdigest() and ff.bytes_read == len(raw)
    assert all(ff.crc[k][0] == infos[k[0]].CRC for k in ff.crc)
    w = next(v for (o, n, d), v in ff.values.items() if n == 300 * 4)
    fin = np.delete(np.arange(300, dtype=np.float64), 4)
    assert w[0] == 1 and w[1] == pytest.approx(float(fin @ fin))
    view = next(v for (o, n, d), v in ff.values.items() if n == 40)
    assert view[0] == 0 and view[1] == pytest.approx(float(np.arange(10, 20.0) @ np.arange(10, 20.0)))


def test_chunked_pass_in_segments(tmp_path):
    p = tmp_path / "big.bin"
    data = os.urandom((1 << 20) * 3 + 5)
    p.write_bytes(data)
    from ckptaudit.onepass import filepass, stream

    old = stream.BUFFER_BYTES
    try:
        filepass.BUFFER_BYTES = stream.BUFFER_BYTES = 1 << 18  # small buffers so the file splits
        ff = pass_file(p, whole_sha=False, chunk_bytes=1 << 18, threads=3)
        f3 = pass_file(p, whole_sha=False, chunk_bytes=1 << 18, chunk_algorithm="blake3", threads=3)
    finally:
        filepass.BUFFER_BYTES = stream.BUFFER_BYTES = old
    assert ff.sha256_hex == ""
    assert ff.chunk_hex == [hashlib.sha256(data[i:i + (1 << 18)]).hexdigest() for i in range(0, len(data), 1 << 18)]
    assert f3.chunk_hex == [blake3.blake3(data[i:i + (1 << 18)]).hexdigest() for i in range(0, len(data), 1 << 18)]
    assert ff.bytes_read == len(data)


def test_plan_of_safetensors(tmp_path):
    a = np.array([1.0, np.inf, 3.0], dtype=np.float32)
    header = {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
              "n": {"dtype": "I64", "shape": [1], "data_offsets": [12, 20]}}
    h = json.dumps(header).encode()
    p = tmp_path / "m.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + a.tobytes() + np.int64(5).tobytes())
    plan = plan_file(p)
    assert plan.values == [(8 + len(h), 12, "float32")] and plan.crc == []
    ff = pass_file(p)
    assert ff.values[(8 + len(h), 12, "float32")] == (1, 10.0, 12)


def test_plan_of_other_bytes_is_empty(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"PK\x03\x04" + b"\x00" * 100)  # a zip head with no central directory
    assert plan_file(p).crc == [] and plan_file(p).values == []
    q = tmp_path / "t.txt"
    q.write_text("hello")
    assert plan_file(q).crc == []


def test_facts_answer_only_their_exact_ranges_and_file_size(tmp_path):
    p, _ = _torch_zip(tmp_path)
    ff = pass_file(p)
    rows = facts.rows_of("u", "ckpt.pt", ff)
    bf = facts.load(rows, tmp_path)
    assert len(bf) == len(rows)
    (m, off, n), (crc, seen) = next(iter(ff.crc.items()))
    assert bf.crc_of(fs.fspath(p), off, n) == (crc, seen)
    assert bf.crc_of(fs.fspath(p), off + 1, n) is None
    (o, nb, dt), v = next(iter(ff.values.items()))
    assert bf.values_of(fs.fspath(p), o, nb, dt) == v
    assert facts.ByteFacts().crc_of(fs.fspath(p), off, n) is None  # facts are a value: nothing is ambient
    with open(p, "ab") as f:  # the file changed since the pass: its facts are not used
        f.write(b"\x00")
    bf = facts.load(rows, tmp_path)
    assert len(bf) == 0 and bf.crc_of(fs.fspath(p), off, n) is None


def _run(tmp_path, n=3, numel=200_000):
    torch = pytest.importorskip("torch")
    run = tmp_path / "run"
    run.mkdir()
    for step in range(1, n + 1):
        w = torch.randn(numel)
        if step == 2:
            w[7] = float("nan")
        sd = {"model": {"w": w, "b": torch.ones(3)}, "step": step * 100,
              "optimizer": {"state": {0: {"exp_avg": torch.zeros(numel), "exp_avg_sq": torch.zeros(numel)}},
                            "param_groups": [{"lr": 1e-3, "params": [0]}]}}
        p = run / f"ckpt_{step * 100:06d}.pt"
        torch.save(sd, p)
        (run / (p.name + ".sha256")).write_text(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n")
    return run


def _stage_bytes(out, stage):
    docs = [json.loads(p.read_text()) for p in (out / "work" / "bytes" / stage).glob("*.json")]
    assert docs, stage
    return {k: sum(d.get(k, 0) for d in docs) for k in ("total", "local", "loadtest_bytes")}


def test_local_audit_reads_each_byte_once(tmp_path):
    """Per-stage bytes from the counters: the hash stage reads every byte (plus what it plans from: the last
    64 KiB where the end-of-central-directory record is looked for, the local headers and data.pkl); scan reads headers and data.pkl only; state reads nothing; the
    load children (mmap) read a fraction."""
    from ckptaudit.pipeline import audit_in_process

    run = _run(tmp_path)
    data = sum(p.stat().st_size for p in run.glob("*.pt"))
    out = tmp_path / "out"
    audit_in_process(run, {"load": {"enabled": True}}, out)
    h, s, st, ld = (_stage_bytes(out, x) for x in ("hash", "scan", "state", "load"))
    assert data <= h["local"] <= data + 3 * (72 << 10), h["local"] - data
    assert 0 < s["total"] <= 3 * (128 << 10), s["total"]  # a fixed ~90 KiB a file, whatever its size
    assert st["total"] == 0
    assert 0 < ld["loadtest_bytes"] <= data * 0.05
    assert (out / "work" / "bytefacts").is_dir()


def test_verdicts_are_the_same_without_the_facts(tmp_path, monkeypatch):
    """The facts are only a shortcut: an audit whose scan and state stages read the bytes themselves reaches
    the same verdict (units, findings, NaN tensors)."""
    import pyarrow.parquet as pq

    from ckptaudit.pipeline import audit_in_process

    run = _run(tmp_path)
    audit_in_process(run, {"load": {"enabled": False}}, tmp_path / "with")
    monkeypatch.setattr(facts, "load", lambda rows, run_dir, tensor_bytes=True, kinds=None: facts.ByteFacts(tensor_bytes))
    audit_in_process(run, {"load": {"enabled": False}}, tmp_path / "without")
    cols = ["unit", "usable_for", "kinds", "n_errors", "n_warnings"]
    a = pq.read_table(tmp_path / "with" / "tables" / "units.parquet", columns=cols).to_pylist()
    b = pq.read_table(tmp_path / "without" / "tables" / "units.parquet", columns=cols).to_pylist()
    assert a == b and any("nan_in_weights" in r["kinds"] for r in a)
    sa = pq.read_table(tmp_path / "with" / "tables" / "state.parquet", columns=["nonfinite_tensors"]).to_pylist()
    sb = pq.read_table(tmp_path / "without" / "tables" / "state.parquet", columns=["nonfinite_tensors"]).to_pylist()
    assert sa == sb


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.tuples(st.integers(0, 299), st.integers(1, 90)), max_size=5))
def test_nul_runs_are_the_maximal_runs_of_nul_bytes(noise, holes):
    """Every NUL run of >= 15 bytes and every run at an edge is found, each exactly (start, length); nothing else
    but true maximal runs is listed (the word-at-a-time kernel against a regex over the bytes)."""
    import re

    from ckptaudit.onepass.nulruns import nul_runs

    b = bytearray(x | 1 for x in noise)
    for s, n in holes:
        b[s:s + n] = bytes(len(b[s:s + n]))
    b = bytes(b)
    truth = [(m.start(), m.end() - m.start()) for m in re.finditer(rb"\x00+", b)]
    must = [(s, n) for s, n in truth if n >= 15 or s == 0 or s + n == len(b)]
    got = nul_runs(b)
    assert set(must) <= set(got) <= set(truth) and got == sorted(got)


@pytest.mark.parametrize("step", [7, 100, 4096, 1 << 20])
def test_longest_nul_run_per_record_equals_the_zero_run_search(tmp_path, step):
    """The longest-NUL-run consumer (fed in any buffer size) gives each zip record the run the scan's own search
    over that record gives, for a zeroed tensor, a zeroed span written over random data and none."""
    torch = pytest.importorskip("torch")
    from ckptaudit.formats.zeros import zero_runs
    from ckptaudit.onepass.consumers import RangeNulRuns

    a = torch.randn(30_000)
    a[100:5_000] = 0
    p = tmp_path / "z.pt"
    torch.save({"a": a, "zeros": torch.zeros(1000), "r": torch.randn(5000)}, p)
    data = bytearray(p.read_bytes())
    plan = plan_file(p)
    r_off, r_len = next((o, n) for m, o, n in plan.crc if m.endswith("data/2"))
    data[r_off + 1000:r_off + 1300] = bytes(300)  # a lost block inside the random tensor
    data[r_off + 999] = data[r_off + 1300] = 0x5A  # its neighbours are not NUL (random bytes can be)
    p.write_bytes(bytes(data))
    c = RangeNulRuns([((m, o, n), o, n) for m, o, n in plan.crc])
    _feed([c], bytes(data), step)
    got = c.results()
    for (m, o, n), longest in got.items():
        runs = zero_runs(p, min_run=64, start=o, end=o + n)
        assert longest == (tuple(max(runs, key=lambda r: r[1])) if runs else None), m
    assert got[next(k for k in got if k[0].endswith("data/2"))] == (r_off + 1000, 300)


def test_a_record_failing_its_crc_is_read_again_for_its_nul_run(tmp_path):
    """The pass leaves each record's CRC but looks for no record's NUL runs (issue 45: 0.05 CPU-s per GiB for a fact
    only a damaged record needs); the scan, given the pass's facts, still tells a failing record's longest run,
    read from that record, and reads nothing of the records whose CRC the facts show intact."""
    torch = pytest.importorskip("torch")
    from ckptaudit.formats.torchzip import check_zip

    p = tmp_path / "bad.pt"
    g = torch.Generator().manual_seed(1)  # over 1 MiB: the zip check reads record by record, not the file at once
    torch.save({"w": torch.randn(1024, 512, generator=g), "b": torch.randn(65536, generator=g)}, p)
    plan = plan_file(p)
    w_off, w_len = next((o, n) for m, o, n in plan.crc if m.endswith("data/0"))
    data = bytearray(p.read_bytes())
    data[w_off + 1000:w_off + 1000 + 8192] = bytes(8192)
    p.write_bytes(bytes(data))
    ff = pass_file(p)
    rows = facts.rows_of("u", "bad.pt", ff)
    assert {r["kind"] for r in rows} == {"crc", "values", "tensor_data"}
    assert ff.crc_value is not None and ff.nul_run is None  # a local file: the record is read again
    before = fs.local_bytes_read()
    got = check_zip(p, facts=facts.load(rows, tmp_path))
    read = fs.local_bytes_read() - before
    assert w_len <= read < w_len + (64 << 10)  # the failing record again, not the other record's 256 KiB
    assert [f.kind for f in got.findings] == ["zip_crc_mismatch"]
    assert got.findings[0].detail["longest_nul_run"] == [w_off + 1000, 8192]
    assert got.findings[0].detail == check_zip(p).findings[0].detail  # the same as without any facts
    reader = facts.load(rows, tmp_path)
    reader.damage_detail = False  # the reader's depth (CHECKED_DIGESTS_ONLY): the mismatch, the record not read again
    before = fs.local_bytes_read()
    got = check_zip(p, facts=reader)
    assert fs.local_bytes_read() - before < (64 << 10)
    assert [f.kind for f in got.findings] == ["zip_crc_mismatch"] and "longest_nul_run" not in got.findings[0].detail
    assert "NUL" not in got.findings[0].message


def test_keep_ranges_leave_out_long_tensor_data_only():
    from ckptaudit.onepass.filepass import KEEP_REMOTE_BYTES, KEEP_TENSOR_DATA_UNDER, keep_ranges

    big, small = KEEP_TENSOR_DATA_UNDER, KEEP_TENSOR_DATA_UNDER - 1
    assert keep_ranges(1000 + big + 500, [(1000, big)]) == [(None, 0, 1000), (None, 1000 + big, 500)]
    assert keep_ranges(100 + small + 10, [(100, small)]) == [(None, 0, 100 + small + 10)]  # small tensors kept
    assert keep_ranges(5000, []) == [(None, 0, 5000)]  # nothing planned: the whole (small) object
    assert keep_ranges(KEEP_REMOTE_BYTES + 1, []) == []  # nothing planned, too big: nothing
    assert sum(n for _, _, n in keep_ranges(3 * KEEP_REMOTE_BYTES, [(10, big)])) == KEEP_REMOTE_BYTES  # the cap


def test_kept_bytes_serve_reads_and_only_gaps_are_fetched():
    from ckptaudit.fs import kept

    k = kept.KeptBytes()
    url = "s3://b/k"
    k.put(url, 0, b"abcd", 20)
    k.put(url, 10, b"klmn", 20)
    k.put(url, 2, b"XX", 20)  # overlaps what is kept: ignored
    assert k.pieces(url, 1, 12) == [(1, 3, b"bcd"), (4, 6, None), (10, 2, b"kl")]
    assert k.pieces(url, 12, 99) == [(12, 2, b"mn"), (14, 6, None)]  # clipped at the object's 20 bytes
    assert k.pieces("s3://b/other", 0, 5) == [(0, 5, None)]
    calls = []
    f = kept.KeptFetcher(url, lambda s, e: calls.append((s, e)) or bytes(range(s, e)), k)
    before = kept.served_bytes()
    assert f(2, 12) == b"cd" + bytes(range(4, 10)) + b"kl" and calls == [(4, 10)]
    assert kept.served_bytes() - before == 4
    nothing = kept.KeptFetcher(url, lambda s, e: bytes(e - s), None)  # a file opened with no kept bytes
    assert nothing(0, 4) == bytes(4)


def test_facts_of_a_file_rewritten_with_the_same_size_are_dropped(tmp_path):
    """A local file rewritten after the pass (same size, new mtime or inode) keeps none of its facts: the scan
    reads its bytes again instead of trusting CRCs of bytes that are no longer there."""
    p, _ = _torch_zip(tmp_path)
    rows = facts.rows_of("u", "ckpt.pt", pass_file(p))
    assert len(facts.load(rows, tmp_path)) == len(rows)
    data = p.read_bytes()
    tmp = tmp_path / "new"
    tmp.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    os.replace(tmp, p)  # a writer's atomic publish: a new inode, the same size
    assert len(facts.load(rows, tmp_path)) == 0


@pytest.mark.parametrize("step", [4096, 1 << 20])
def test_safetensors_nul_runs_come_from_the_pass_and_match_the_scans_own_search(tmp_path, step):
    """A safetensors data area's NUL runs of >= 4096 bytes (a lost block across two tensors, and an all-zero
    tensor) are listed by the pass, equal what the file layer's own search finds, and give the same findings
    with the facts loaded as without (so the scan no longer reads the tensor data again)."""
    from safetensors.numpy import save_file

    from ckptaudit.formats.safetensors_check import MIN_ZERO_RUN_BYTES, check_safetensors
    from ckptaudit.formats.zeros import zero_runs
    from ckptaudit.onepass.consumers import RangeAllNulRuns

    rng = np.random.default_rng(1)
    p = tmp_path / "model.safetensors"
    save_file({"a": rng.standard_normal(5000).astype(np.float32), "b": rng.standard_normal(5000).astype(np.float32),
               "z": np.zeros(3000, np.float32)}, str(p))
    data = bytearray(p.read_bytes())
    hlen = struct.unpack("<Q", data[:8])[0]
    start = 8 + hlen + 4 * 5000 - 3000  # 3000 bytes before a's end into b: a lost block across the boundary
    data[start:start + 6000] = bytes(6000)
    p.write_bytes(bytes(data))
    plan = plan_file(p)
    (o, n, m), = plan.nul_scans
    assert (o, n, m) == (8 + hlen, len(data) - 8 - hlen, MIN_ZERO_RUN_BYTES)
    c = RangeAllNulRuns([((o, n, m), o, n)], m)
    _feed([c], bytes(data), step)
    want = [tuple(r) for r in zero_runs(p, min_run=m, start=o, end=o + n)]
    assert c.results()[(o, n, m)] == want == pass_file(p).nul_scans[(o, n, m)] and len(want) == 2
    before = fs.local_bytes_read()
    _, without = check_safetensors(str(p), display="model.safetensors")
    read_without = fs.local_bytes_read() - before
    bf = facts.load(facts.rows_of("u", "model.safetensors", pass_file(p)), tmp_path)
    before = fs.local_bytes_read()
    _, with_facts = check_safetensors(str(p), display="model.safetensors", facts=bf)
    read = fs.local_bytes_read() - before
    assert [f.to_dict() for f in with_facts] == [f.to_dict() for f in without]
    assert any(f.kind == "zero_filled_span" for f in with_facts)
    assert read_without - read >= n - 16384, (read, read_without)  # the sniff's first 16 KiB, not the data area


def test_a_small_float32_range_sums_as_the_block_path(monkeypatch):
    """A whole float32 range of one block takes its dot product directly; the sums, non-finite counts and bytes
    seen are those of the block path, with NaN/Inf (counted by the block path), a range over one block, a
    range split between two buffers and other dtypes beside it."""
    import numpy as np

    from ckptaudit.onepass import consumers as C

    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(n).astype(np.float32) for n in (1, 7, 4096, 70_000)]
    parts[1][3] = np.nan
    parts.append(np.array([np.inf, 1.0], np.float32))
    parts.append(rng.standard_normal(33).astype(np.float16))
    buf = b"".join(p.tobytes() for p in parts)
    starts = np.cumsum([0] + [p.nbytes for p in parts[:-1]])
    lengths = np.array([p.nbytes for p in parts])
    names = ["float16", "float32"]
    dtypes = np.array([1, 1, 1, 1, 1, 0])

    def fed(split: int):
        r = C.RangeValues(starts=starts, lengths=lengths, dtypes=dtypes, dtype_names=names)
        r.feed(0, memoryview(buf)[:split])
        r.feed(split, memoryview(buf)[split:])
        return r.arrays()

    got = [fed(len(buf)), fed(int(starts[2]) + 100)]
    monkeypatch.setattr(C, "_ONE_BLOCK_F32", -1)
    want = [fed(len(buf)), fed(int(starts[2]) + 100)]
    for g, w in zip(got, want):
        assert all(np.array_equal(a, b) for a, b in zip(g, w))
    assert got[0][0].tolist() == [0, 1, 0, 0, 1, 0]  # the NaN and the Inf counted
