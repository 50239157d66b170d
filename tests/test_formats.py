"""Tests of the file layer: ckptaudit.formats.{sniff, torchzip, safetensors_check, legacy}.

These checks read bytes only.  torch and safetensors are used here to *build*
fixtures, never by the code under test (see test_no_heavy_imports and
test_verdicts_without_any_unpickling).
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ckptaudit.formats import legacy, sniff, torchzip
from ckptaudit.formats.legacy import check_legacy
from ckptaudit.formats.safetensors_check import check_safetensors
from ckptaudit.formats.sniff import generic_findings, zero_runs
from ckptaudit.formats.torchzip import check_storages, check_zip
from ckptaudit.pickle_walk import walk

CASES = Path(os.environ.get("CKPTAUDIT_CASES", "/work/shared/cases"))
ROOT = Path(__file__).resolve().parents[1]

#: Kinds this layer can emit (the rest of the file layer - DCP, index, pointers - belongs to layouts).
FILE_LAYER_KINDS = {
    "empty_file", "all_zero_file", "zero_filled_tail", "zero_filled_head", "zero_filled_span",
    "git_lfs_pointer", "html_error_page", "text_error_page", "not_a_torch_save_file",
    "numpy_archive_not_checkpoint", "unknown_format", "truncated_zip_no_central_directory",
    "zip_member_header_corrupted", "zip_missing_record", "zip_crc_mismatch", "zip_storage_missing",
    "zip_storage_size_mismatch", "truncated_legacy_pickle", "legacy_magic_mismatch", "header_too_small",
    "header_too_large", "invalid_header_json", "safetensors_offsets_invalid", "truncated_in_data",
    "safetensors_trailing_bytes", "zip_central_directory_corrupted", "legacy_storage_size_mismatch",
    "pickle_unreadable",
}


def audit_file(path) -> list:
    """The file-layer audit of one file: sniff, then the checker for its format."""
    s = sniff.sniff(path)
    out = generic_findings(s)
    if s.kind in ("torch_zip", "zip"):
        rep = check_zip(path)
        out += rep.findings
        if rep.data_pkl is not None:
            res = walk(rep.data_pkl)
            storages = {k: (r.nbytes, r.dtype, r.numel) for k, r in res.storages.items()}
            out += check_storages(rep, storages, str(path))
    elif s.kind == "torch_legacy":
        out += check_legacy(path)[1]
    elif s.kind == "safetensors":
        out += check_safetensors(path)[1]
    return out


def errors(fs) -> list:
    return [f for f in fs if f.severity == "error"]


def _case_dirs():
    return sorted(p for p in CASES.iterdir() if (p / "expected.json").is_file()) if CASES.is_dir() else []


def _single_file_cases():
    out = []
    for d in _case_dirs():
        exp = json.loads((d / "expected.json").read_text())
        if exp.get("layer") == "file" and len(exp.get("files", [])) == 1:
            out.append(pytest.param(d, exp, id=d.name))
    return out


def _verdict_kinds():
    """(case, expected kind, kinds found) for every single-file file-layer case of this layer."""
    got = []
    for p in _single_file_cases():
        d, exp = p.values
        if exp["expected_error_kind"] not in FILE_LAYER_KINDS:
            continue
        path = d / exp["files"][0]["path"]
        got.append((d.name, exp["expected_error_kind"], [f.kind for f in audit_file(path)]))
    return got


# ------------------------------------------------------------------ the cases


@pytest.mark.parametrize("case_dir, expected", [
    p for p in _single_file_cases() if p.values[1]["expected_error_kind"] in FILE_LAYER_KINDS])
def test_case_gives_expected_kind(case_dir, expected):
    """Every single-file, file-layer case yields its expected kind from these checkers.

    (DCP cases need the whole folder; tests/test_cases.py covers them through the DCP layout.)"""
    kind = expected["expected_error_kind"]
    path = case_dir / expected["files"][0]["path"]
    assert path.stat().st_size == expected["files"][0]["bytes"]
    fs = audit_file(path)
    assert kind in [f.kind for f in fs], [(f.kind, f.message) for f in fs]
    assert all(f.caps == "none" for f in errors(fs))


def test_zero_tail_is_the_primary_finding():
    """A zero-filled tail also destroys the central directory: the zero fill is named first."""
    rep = check_zip(CASES / "zero_tail_zip" / "ckpt.pt")
    assert rep.findings[0].kind == "zero_filled_tail"
    assert rep.findings[0].detail["offset"] == 186108
    assert rep.findings[0].detail["zero_bytes"] == 186108
    assert rep.findings[0].detail["evidence"] == "definite"
    assert [f.kind for f in rep.findings] == ["zero_filled_tail"]
    assert rep.cut_offset == 186108


def test_zero_tail_without_data_pkl_sizes_is_heuristic(monkeypatch):
    """Without storage sizes from data.pkl a long NUL tail is still reported first, with the truncation."""
    monkeypatch.setattr(torchzip, "_storages_from_pkl", lambda data: None)
    rep = check_zip(CASES / "zero_tail_zip" / "ckpt.pt")
    kinds = [f.kind for f in rep.findings]
    assert kinds[0] == "zero_filled_tail"
    assert rep.findings[0].detail["evidence"] == "heuristic"
    assert "truncated_zip_no_central_directory" in kinds


@pytest.mark.parametrize("case, path", [
    ("ok_full_torch", "ckpt.pt"),
    ("ok_safetensors", "model.safetensors"),
    ("ok_hf_sharded", "model-00001-of-00002.safetensors"),
    ("ok_hf_sharded", "model-00002-of-00002.safetensors"),
])
def test_baselines_have_no_error(case, path):
    fs = audit_file(CASES / case / path)
    assert errors(fs) == [], [f.message for f in fs]


def test_every_intact_torch_zip_of_other_layers_is_clean():
    """Structure/state/security cases have intact bytes: the file layer must not flag them."""
    n = 0
    for d in _case_dirs():
        exp = json.loads((d / "expected.json").read_text())
        if exp.get("layer") == "file":
            continue
        for f in exp["files"]:
            p = d / f["path"]
            if p.suffix in (".pt", ".safetensors"):
                fs = audit_file(p)
                assert errors(fs) == [], (p, [x.message for x in fs])
                n += 1
    assert n >= 20


def test_verdicts_without_any_unpickling(monkeypatch):
    """The checks never unpickle: with every loader booby-trapped, every verdict is unchanged."""
    before = _verdict_kinds()

    def boom(*a, **k):
        raise AssertionError("the file layer must not unpickle or torch.load")

    class Trap:
        def __init__(self, *a, **k):
            raise AssertionError("the file layer must not build an Unpickler")

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "Unpickler", Trap)
    after = _verdict_kinds()
    assert after == before
    for name, kind, got in after:
        assert kind in got, (name, got)


def test_no_heavy_imports():
    """Library code of this layer imports neither torch nor safetensors nor numpy."""
    code = (
        "import sys, glob, os\n"
        "from ckptaudit.formats import sniff, torchzip, safetensors_check, legacy\n"
        f"for p in glob.glob({str(CASES)!r} + '/**/*', recursive=True):\n"
        "    if not os.path.isfile(p): continue\n"
        "    s = sniff.sniff(p); sniff.generic_findings(s)\n"
        "    if s.kind in ('torch_zip', 'zip'): torchzip.check_zip(p)\n"
        "    if s.kind == 'safetensors': safetensors_check.check_safetensors(p)\n"
        "    if s.kind == 'torch_legacy': legacy.check_legacy(p)\n"
        "bad = [m for m in ('torch', 'safetensors', 'numpy') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ------------------------------------------------------------------ exact messages


def test_truncated_zip_message():
    """The cut position and the intact records are spelled out."""
    p = CASES / "trunc_zip_at_50pct" / "ckpt.pt"
    rep = check_zip(p)
    (f,) = rep.findings
    assert f.kind == "truncated_zip_no_central_directory"
    assert f.message == (
        f"{p} is a torch.save zip cut short: it is 186108 bytes and has no end-of-central-directory record "
        "(at least 174216 bytes of tensor data are missing, and the central directory). The first 61 "
        "records (data.pkl, .format_version, .storage_alignment, byteorder, data/0..data/56) are complete; "
        "the cut falls inside the local header of data/57 at byte 186108. 57 of the 113 storages named in "
        "data.pkl are intact."
    )
    assert rep.cut_offset == 186108
    assert rep.prefix == "ckpt"
    assert len(rep.intact_members) == 61
    assert rep.data_pkl is not None and rep.data_pkl.endswith(b".")


def test_truncated_zip_minus_one_byte():
    p = CASES / "trunc_zip_minus_1_byte" / "ckpt.pt"
    (f,) = check_zip(p).findings
    assert f.kind == "truncated_zip_no_central_directory"
    assert "(only the last 1 of that record's 22 bytes is missing; every record and the central directory " \
           "are complete)" in f.message
    assert "The first 119 of 119 records" in f.message


def test_truncated_small_zip():
    p = CASES / "trunc_zip_small_file_5kb" / "mlp.pt"
    (f,) = check_zip(p).findings
    assert f.detail["intact_text"] == (
        "The first 4 records (data.pkl, .format_version, .storage_alignment, byteorder) are complete; "
        "the cut falls inside the data of data/0 (which starts at byte 1024) at byte 5000. 0 of the 4 "
        "storages named in data.pkl are intact."
    )


def test_local_header_corrupted_message():
    p = CASES / "zip_local_header_corrupted" / "ckpt.pt"
    rep = check_zip(p)
    (f,) = rep.findings
    assert f.kind == "zip_member_header_corrupted"
    assert f.detail == {"member": "ckpt/data/0", "offset": 14422,
                        "why": "signature is 00 00 00 00, not 50 4b 03 04; 30 of its 30 fixed bytes are NUL"}
    assert "ckpt/data/0" not in rep.intact_members and len(rep.intact_members) == 118


def test_missing_data_pkl_message():
    p = CASES / "zip_missing_data_pkl" / "ckpt.pt"
    rep = check_zip(p)
    (f,) = rep.findings
    assert f.message == (
        f"{p}: the zip archive has no ckpt/data.pkl record (none of its 118 records is named ckpt/data.pkl "
        "(records: ckpt/.format_version, ckpt/.storage_alignment, ckpt/byteorder, ckpt/data/0, ...))."
    )
    assert rep.data_pkl is None


def test_lfs_pointer_message():
    p = CASES / "st_lfs_pointer" / "model.safetensors"
    h, (f,) = check_safetensors(p)
    assert h is None
    assert f.message == (
        f"{p} is a 131-byte Git LFS pointer, not the checkpoint: the real object is 122552 bytes with oid "
        "sha256:9bf2b877f3ea4d20d098deb4aca3142fb30c9663d874f9d21b9446d22537dd99."
    )
    assert f.next_step == f'Fetch the real object: `git lfs install && git lfs pull --include "{p}"` in the ' \
                          "repository it came from."


def test_safetensors_truncated_message():
    p = CASES / "st_truncated_in_data" / "model.safetensors"
    h, (f,) = check_safetensors(p)
    assert h is not None and h["__metadata__"] == {"format": "pt", "step": "6"}
    assert f.message == (
        f"{p}: the safetensors header is intact but the tensor data is cut short: 61276 of 120320 data bytes "
        "are missing. 13 of 29 tensors lie wholly inside the file; the cut falls inside 'h.1.fc.weight' after "
        "7716 of its 16384 bytes (data byte 59044)."
    )


def test_safetensors_invalid_json_message():
    p = CASES / "st_invalid_json_header" / "model.safetensors"
    _, (f,) = check_safetensors(p)
    assert f.message == (f"{p}: the safetensors JSON header (77 bytes) does not parse: Unterminated string "
                         "starting at (header byte 70).")


def test_legacy_truncated_message():
    p = CASES / "legacy_format_truncated" / "model_legacy.pt"
    res, (f,) = check_legacy(p)
    assert len(res.storages) == 28
    assert f.message == (
        f"{p} is a pre-1.6 (legacy, non-zip) torch.save file cut short at 58086 bytes: the cut falls inside "
        "storage '94384762578448' (13 of 28, float32 x 4096: 9618 of its 16384 bytes present); 12 of 28 "
        "storages are intact and 58086 bytes are missing."
    )


def test_plain_pickle_and_html_and_empty():
    assert [f.kind for f in audit_file(CASES / "plain_pickle_not_torch_save" / "features.pkl")] == \
        ["not_a_torch_save_file"]
    assert [f.kind for f in audit_file(CASES / "html_page_instead_of_pt" / "model.pth")] == ["html_error_page"]
    assert [f.kind for f in audit_file(CASES / "empty_file" / "ckpt.pt")] == ["empty_file"]


# ------------------------------------------------------------------ sniff


@pytest.fixture(scope="session")
def small_zip(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    p = tmp_path_factory.mktemp("zip") / "small.pt"
    torch.save({"w": torch.randn(48, 32, generator=g), "b": torch.randn(32, generator=g),
                "e": torch.randint(0, 100, (40,), generator=g), "step": 3}, p)
    return p


@pytest.fixture(scope="session")
def small_st(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    p = tmp_path_factory.mktemp("st") / "small.safetensors"
    save_file({"a.weight": torch.randn(16, 8, generator=g), "a.bias": torch.randn(16, generator=g),
               "b.weight": torch.randn(4, 16, generator=g).to(torch.bfloat16),
               "c.idx": torch.arange(10)}, p, metadata={"format": "pt"})
    return p


@pytest.fixture(scope="session")
def small_legacy(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    p = tmp_path_factory.mktemp("legacy") / "old.pt"
    torch.save({"w": torch.randn(8, 4, generator=g), "i": torch.arange(5), "h": torch.ones(3).half()}, p,
               _use_new_zipfile_serialization=False)
    return p


def test_sniff_kinds(tmp_path, small_zip, small_st, small_legacy):
    def kind(data: bytes, name="x.pt") -> str:
        p = tmp_path / name
        p.write_bytes(data)
        return sniff.sniff(p).kind

    assert sniff.sniff(small_zip).kind == "torch_zip"
    assert sniff.sniff(small_st).kind == "safetensors"
    assert sniff.sniff(small_legacy).kind == "torch_legacy"
    assert kind(b"") == "empty"
    assert kind(bytes(5000)) == "all_zero"
    assert kind(b"<!DOCTYPE html><html><body>quota</body></html>") == "html"
    assert kind(b"403 Forbidden\n") == "text"
    assert kind(b'{"error": "not found"}') == "json"
    assert kind(pickle.dumps({"a": 1}, protocol=4)) == "pickle"
    assert kind(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4'") == "npy"
    assert kind(b"\x01\x02\x03\x04garbage\xff\xfe") == "unknown"
    assert kind(bytes(100) + b"\x01" * 100) == "unknown"
    zp = tmp_path / "a.npz"
    with zipfile.ZipFile(zp, "w") as z:
        z.writestr("arr_0.npy", b"\x93NUMPY")
    assert sniff.sniff(zp).kind == "npz"
    with zipfile.ZipFile(tmp_path / "b.zip", "w") as z:
        z.writestr("readme.txt", b"hi")
    assert sniff.sniff(tmp_path / "b.zip").kind == "zip"
    # header length 0x480 starts with 80 04 like a protocol-4 pickle: still safetensors
    hdr = b"{" + b" " * (0x480 - 2) + b"}"
    assert kind(struct.pack("<Q", 0x480) + hdr, "m.safetensors") == "safetensors"
    # a legacy layout whose magic pickle holds another number
    assert kind(pickle.dumps(12345678901234567890, protocol=2) + pickle.dumps(1001, protocol=2)) == "pickle"


def test_generic_findings_messages(tmp_path):
    p = tmp_path / "model.bin"
    p.write_bytes(b"Access Denied\n")
    (f,) = generic_findings(sniff.sniff(p))
    assert f.kind == "text_error_page"
    assert f.message == (f"{p} is text (14 bytes, starts with 'Access Denied\\n'), not a checkpoint: an error "
                         "response or log was saved under the checkpoint's name.")
    latest = tmp_path / "latest"
    latest.write_bytes(b"global_step6")
    assert generic_findings(sniff.sniff(latest)) == []  # a legitimate text file in a run folder
    meta = tmp_path / ".metadata"
    meta.write_bytes(pickle.dumps({"x": 1}))
    assert generic_findings(sniff.sniff(meta)) == []  # DCP metadata is a plain pickle by design
    u = tmp_path / "u.pt"
    u.write_bytes(b"\x01\x02\x03\x04garbage\xff\xfe")
    (f,) = generic_findings(sniff.sniff(u))
    assert f.message == f"{u} (13 bytes) is no checkpoint format the audit knows: it starts with bytes " \
                        "01 02 03 04 67 61 72 62 61 67 65 ff fe."
    zh = tmp_path / "zh.pt"
    zh.write_bytes(bytes(4096 + 100) + b"PK\x03\x04rest")
    (f,) = generic_findings(sniff.sniff(zh))
    assert (f.kind, f.detail["zero_bytes"]) == ("zero_filled_head", 4196)
    lm = tmp_path / "lm.pt"
    lm.write_bytes(pickle.dumps(12345678901234567890, protocol=2) + pickle.dumps(1001, protocol=2))
    (f,) = generic_findings(sniff.sniff(lm))
    assert (f.kind, f.detail) == ("legacy_magic_mismatch",
                                  {"found": "0xab54a98ceb1f0ad2", "expected": "0x1950a86a20f9469cfc6c"})


def test_all_zero_is_streamed(tmp_path):
    """A 1 GiB all-NUL file is classified without reading it into memory at once (sparse file)."""
    p = tmp_path / "big.pt"
    with open(p, "wb") as f:
        f.truncate(1 << 30)
    tracemalloc.start()
    try:
        s = sniff.sniff(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.kind == "all_zero" and s.size_bytes == 1 << 30
    assert peak < 8 << 20, peak
    (f,) = generic_findings(s)
    assert f.kind == "all_zero_file" and f.detail["size_bytes"] == 1 << 30


def test_zero_runs(tmp_path):
    p = tmp_path / "z.bin"
    data = bytearray(os.urandom(10_000).replace(b"\0", b"\1"))
    data[100:164] = bytes(64)       # exactly min_run
    data[1000:1063] = bytes(63)     # one short
    data[4090:4300] = bytes(210)    # crosses the 4096-byte chunk border below
    data[9900:] = bytes(100)        # runs to EOF
    p.write_bytes(bytes(data))
    want = [(100, 64), (4090, 210), (9900, 100)]
    assert zero_runs(p) == want
    assert zero_runs(p, chunk=4096) == want
    assert zero_runs(p, chunk=7) == want
    assert zero_runs(p, min_run=63, chunk=50) == [(100, 64), (1000, 63), (4090, 210), (9900, 100)]
    assert zero_runs(p, start=4100, end=4200) == [(4100, 100)]
    all0 = tmp_path / "a.bin"
    all0.write_bytes(bytes(3000))
    assert zero_runs(all0, chunk=1000) == [(0, 3000)]


def _naive_runs(data: bytes, min_run: int):
    out, i = [], 0
    while i < len(data):
        if data[i] == 0:
            j = i
            while j < len(data) and data[j] == 0:
                j += 1
            if j - i >= min_run:
                out.append((i, j - i))
            i = j
        else:
            i += 1
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.tuples(st.booleans(), st.integers(1, 300)), min_size=1, max_size=30),
       chunk=st.integers(1, 700), min_run=st.integers(1, 200))
def test_zero_runs_matches_naive(tmp_path, pieces, chunk, min_run):
    """Streaming with any chunk size finds exactly the runs a byte-by-byte scan finds."""
    data = b"".join(bytes(n) if z else b"\x07" * n for z, n in pieces)
    p = _write(tmp_path, data, "r.bin")
    assert zero_runs(p, min_run=min_run, chunk=chunk) == _naive_runs(data, min_run)


# ------------------------------------------------------------------ torch zip


def test_small_zip_is_clean_and_matches_zipfile(small_zip):
    rep = check_zip(small_zip)
    assert rep.findings == [] and rep.has_central_directory and rep.cut_offset is None
    with zipfile.ZipFile(small_zip) as z:
        infos = z.infolist()
    assert [m.name for m in rep.members] == [i.filename for i in infos]
    assert [m.size_bytes for m in rep.members] == [i.file_size for i in infos]
    assert [m.crc32 for m in rep.members] == [i.CRC for i in infos]
    assert all(m.crc_ok for m in rep.members)
    for m in rep.members:
        if "/data/" in m.name:
            assert m.data_offset % 64 == 0  # torch's storage alignment
    with open(small_zip, "rb") as f:
        pkl = rep.members[0]
        f.seek(pkl.data_offset)
        assert f.read(pkl.size_bytes) == rep.data_pkl


def test_check_storages(small_zip):
    rep = check_zip(small_zip)
    res = walk(rep.data_pkl)
    storages = {k: (r.nbytes, r.dtype, r.numel) for k, r in res.storages.items()}
    assert check_storages(rep, storages, str(small_zip)) == []
    bad = dict(storages)
    bad["0"] = (storages["0"][0] + 4, storages["0"][1], storages["0"][2] + 1)
    bad["9"] = (16, "float32", 4)
    fs = check_storages(rep, bad, str(small_zip))
    assert [f.kind for f in fs] == ["zip_storage_size_mismatch", "zip_storage_missing"]
    assert fs[0].message == (f"{small_zip}: storage 0 needs {storages['0'][0] + 4} bytes (float32 x "
                             f"{storages['0'][2] + 1}) but its record holds {storages['0'][0]}.")
    assert fs[1].message == f"{small_zip}: data.pkl references storage 9 but the archive has no small/data/9 record."


def test_crc_mismatch_and_zero_span(tmp_path):
    """A zeroed 8 KiB block inside one big tensor: the CRC mismatch is the finding; the zero run is told with it as
    a fact to compare, never as the cause (genuine zeros, such as AdamW moments of untouched rows, look the
    same: issue 43)."""
    torch = pytest.importorskip("torch")
    p = tmp_path / "big.pt"
    torch.save({"w": torch.randn(256, 256, generator=torch.Generator().manual_seed(1))}, p)
    rep = check_zip(p)
    m = next(m for m in rep.members if m.name.endswith("data/0"))
    data = bytearray(p.read_bytes())
    data[m.data_offset + 1000: m.data_offset + 1000 + 8192] = bytes(8192)
    q = tmp_path / "bad.pt"
    q.write_bytes(bytes(data))
    rep2 = check_zip(q)
    assert [f.kind for f in rep2.findings] == ["zip_crc_mismatch"]
    assert rep2.findings[0].detail["longest_nul_run"] == [m.data_offset + 1000, 8192]
    assert f"8192 at offset {m.data_offset + 1000}" in rep2.findings[0].message
    assert "lost" not in rep2.findings[0].message
    crc = zlib.crc32(bytes(data[m.data_offset: m.data_offset + m.size_bytes]))
    assert rep2.findings[0].detail["expected"] == f"{m.crc32:08x}"
    assert rep2.findings[0].detail["actual"] == f"{crc:08x}"
    assert m.name not in rep2.intact_members
    # verify_crc=False reads no data: the damage is then invisible
    assert check_zip(q, verify_crc=False).findings == []


def test_not_a_zip_gives_a_finding(tmp_path, small_legacy):
    rep = check_zip(small_legacy)
    assert [f.kind for f in rep.findings] == ["zip_missing_record"]


def _write(tmp_path: Path, data: bytes, name: str) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


_PROP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_PROP
@given(data=st.data())
def test_zip_any_truncation_is_an_error(tmp_path, small_zip, data):
    raw = small_zip.read_bytes()
    cut = data.draw(st.integers(0, len(raw) - 1))
    p = _write(tmp_path, raw[:cut], "t.pt")
    assert errors(check_zip(p).findings)
    assert errors(audit_file(p))


@_PROP
@given(data=st.data())
def test_zip_any_flipped_data_byte_is_an_error(tmp_path, small_zip, data):
    raw = bytearray(small_zip.read_bytes())
    members = [m for m in check_zip(small_zip).members if m.size_bytes > 0]
    m = data.draw(st.sampled_from(members))
    off = m.data_offset + data.draw(st.integers(0, m.size_bytes - 1))
    raw[off] ^= data.draw(st.integers(1, 255))
    p = _write(tmp_path, bytes(raw), "f.pt")
    fs = check_zip(p).findings
    assert any(f.kind == "zip_crc_mismatch" and f.detail["member"] == m.name for f in fs)


@_PROP
@given(data=st.data())
def test_zip_any_zeroed_span_is_an_error(tmp_path, small_zip, data):
    raw = bytearray(small_zip.read_bytes())
    start = data.draw(st.integers(0, len(raw) - 64))
    length = data.draw(st.integers(64, min(4096, len(raw) - start)))
    assume(any(raw[start: start + length]))  # zeroing bytes that were already NUL changes nothing
    raw[start: start + length] = bytes(length)
    p = _write(tmp_path, bytes(raw), "z.pt")
    assert errors(check_zip(p).findings)


@_PROP
@given(data=st.data())
def test_safetensors_any_truncation_is_an_error(tmp_path, small_st, data):
    raw = small_st.read_bytes()
    cut = data.draw(st.integers(0, len(raw) - 1))
    p = _write(tmp_path, raw[:cut], "t.safetensors")
    h, fs = check_safetensors(p)
    assert errors(fs)


def _structural_positions(raw: bytes):
    """Header byte positions outside JSON string contents (prefix, punctuation, numbers, padding)."""
    n = struct.unpack("<Q", raw[:8])[0]
    out = list(range(8))
    in_str = False
    esc = False
    for i, c in enumerate(raw[8: 8 + n]):
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:
                esc = True
            elif c == 0x22:
                in_str = False
                out.append(8 + i)
            continue
        if c == 0x22:
            in_str = True
        out.append(8 + i)
    return out


@_PROP
@given(data=st.data())
def test_safetensors_flipped_header_byte_is_an_error(tmp_path, small_st, data):
    """A flipped byte in the header's structure or numbers is always caught.

    Limits (documented, not bugs): safetensors has no checksum, so a flip in
    tensor *data* cannot be seen from bytes alone; neither can a flip inside a
    JSON string (a tensor name, a metadata value, or a dtype turned into
    another dtype of the same width such as F32 -> I32), nor a padding space
    turned into another JSON whitespace (tab, LF, CR).  Those bytes are
    excluded here; only a sidecar SHA-256 catches them.
    """
    raw = bytearray(small_st.read_bytes())
    pos = data.draw(st.sampled_from(_structural_positions(bytes(raw))))
    new = raw[pos] ^ data.draw(st.integers(1, 255))
    assume(not (raw[pos] in b" \t\r\n" and new in b" \t\r\n"))
    raw[pos] = new
    p = _write(tmp_path, bytes(raw), "f.safetensors")
    h, fs = check_safetensors(p)
    assert errors(fs), (pos, raw[pos - 5: pos + 5])


@_PROP
@given(data=st.data())
def test_safetensors_zeroed_span_touching_header_is_an_error(tmp_path, small_st, data):
    """A zeroed span of >= 64 bytes that reaches into the prefix or JSON header is always caught.

    Limit: a zeroed span wholly inside tensor data is only caught when it cuts
    across a tensor boundary (see safetensors_check._suspicious_zero_runs); a
    span inside one tensor looks like legitimate zeros.
    """
    raw = bytearray(small_st.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    start = data.draw(st.integers(0, 8 + n - 1))
    length = data.draw(st.integers(64, max(64, len(raw) - start)))
    assume(start + length <= len(raw))
    assume(any(raw[start: start + length]))
    raw[start: start + length] = bytes(length)
    p = _write(tmp_path, bytes(raw), "z.safetensors")
    h, fs = check_safetensors(p)
    assert errors(fs)


# ------------------------------------------------------------------ safetensors


def _st_file(tmp_path: Path, header: dict, data: bytes, name="h.safetensors", pad=True) -> Path:
    hb = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        hb += b" " * (-len(hb) % 8)
    return _write(tmp_path, struct.pack("<Q", len(hb)) + hb + data, name)


def test_small_safetensors_is_clean(small_st):
    h, fs = check_safetensors(small_st)
    assert fs == []
    assert h["b.weight"] == {"dtype": "BF16", "shape": [4, 16], "data_offsets": h["b.weight"]["data_offsets"]}


@pytest.mark.parametrize("header, why", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}},
     ("b", [12, 20], "leave a gap of 4 bytes after 'a' (which ends at 8)")),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
     ("b", [4, 12], "overlap the previous tensor 'a', which ends at 8")),
    ({"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}},
     ("a", [0, 8], "span 8 bytes but F16 x [3] needs 6 bytes")),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}},
     ("a", [8, 0], "end (0) before they begin (8)")),
])
def test_safetensors_offsets_invalid(tmp_path, header, why):
    end = max(max(e["data_offsets"]) for e in header.values())
    p = _st_file(tmp_path, header, b"\1" * end)
    _, fs = check_safetensors(p)
    bad = [f for f in fs if f.kind == "safetensors_offsets_invalid"]
    assert bad, [f.message for f in fs]
    tensor, offsets, text = why
    assert bad[0].message == f"{p}: tensor {tensor} has data_offsets {offsets} that {text}."


def test_safetensors_header_errors(tmp_path):
    p = _write(tmp_path, struct.pack("<Q", 200_000_000) + b"{}", "big.safetensors")
    (f,) = check_safetensors(p)[1]
    assert f.message == f"{p}: the safetensors header length prefix says 200000000 bytes but the file has only 10."
    p = _st_file(tmp_path, {"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\1", "dt.safetensors")
    (f,) = check_safetensors(p)[1]
    assert (f.kind, f.detail["why"]) == ("invalid_header_json", "tensor 'a' has unknown dtype 'Q7'")
    p = _write(tmp_path, struct.pack("<Q", 8) + b"[1,2,3] ", "arr.safetensors")
    (f,) = check_safetensors(p)[1]
    assert f.detail["why"] == "it starts with '[1,2,3] ', not '{'"
    hb = b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}'
    p = _write(tmp_path, struct.pack("<Q", len(hb)) + hb + b"\1", "dup.safetensors")
    (f,) = check_safetensors(p)[1]
    assert f.detail["why"] == "duplicate key(s) ['a']"


def test_safetensors_trailing_bytes(tmp_path, small_st):
    p = _write(tmp_path, small_st.read_bytes() + b"junk", "t.safetensors")
    h, (f,) = check_safetensors(p)
    # safetensors refuses uncovered bytes, so it is an error whose repair is a truncated copy
    assert (f.kind, f.severity, f.caps, f.detail["extra_bytes"]) == ("safetensors_trailing_bytes", "error",
                                                                     "resume", 4)
    assert f.repair == f"cp {p} {p}.fixed && truncate -s {p.stat().st_size - 4} {p}.fixed"


def test_safetensors_zero_block_across_tensors(tmp_path):
    """A lost 8 KiB block that cuts two non-zero tensors is flagged; whole zero tensors are not."""
    rnd = os.urandom(3 * 16384).replace(b"\0", b"\1")
    hdr = {f"t{i}": {"dtype": "F32", "shape": [4096], "data_offsets": [i * 16384, (i + 1) * 16384]}
           for i in range(3)}
    data = bytearray(rnd)
    data[12000:20192] = bytes(8192)
    p = _st_file(tmp_path, hdr, bytes(data), "span.safetensors")
    _, fs = check_safetensors(p)
    assert [f.kind for f in fs] == ["zero_filled_span"]
    n = struct.unpack("<Q", p.read_bytes()[:8])[0]
    assert fs[0].detail == {"zero_bytes": 8192, "offset": 8 + n + 12000, "member": "tensors 't0' and 't1'"}
    # tail: from inside t1 to EOF
    data = bytearray(rnd)
    data[30000:] = bytes(len(data) - 30000)
    p = _st_file(tmp_path, hdr, bytes(data), "tail.safetensors")
    assert [f.kind for f in check_safetensors(p)[1]] == ["zero_filled_tail"]
    # legitimately all-zero tensors next to each other (zero-initialised biases): no finding
    data = bytearray(rnd)
    data[16384:] = bytes(2 * 16384)
    p = _st_file(tmp_path, hdr, bytes(data), "legit.safetensors")
    assert check_safetensors(p)[1] == []


# ------------------------------------------------------------------ legacy


def test_legacy_intact(small_legacy):
    res, fs = check_legacy(small_legacy)
    assert fs == []
    assert sorted(r.dtype for r in res.storages.values()) == ["float16", "float32", "int64"]


def test_legacy_every_truncation(tmp_path, small_legacy):
    """Every cut of a legacy file is reported, by pickle or by storage."""
    raw = small_legacy.read_bytes()
    wheres = set()
    for cut in range(1, len(raw)):
        p = _write(tmp_path, raw[:cut], "c.pt")
        _, fs = check_legacy(p)
        assert errors(fs), cut
        for f in fs:
            if f.kind == "truncated_legacy_pickle":
                wheres.add(f.detail.get("pickle") or "storage")
    assert {"object pickle", "storage-key pickle", "storage"} <= wheres


def test_legacy_magic_mismatch(tmp_path, small_legacy):
    raw = bytearray(small_legacy.read_bytes())
    raw[5] ^= 0xFF
    p = _write(tmp_path, bytes(raw), "m.pt")
    _, (f,) = check_legacy(p)
    assert f.kind == "legacy_magic_mismatch"
    assert f.detail["expected"] == "0x1950a86a20f9469cfc6c"


def test_legacy_size_prefix_mismatch(tmp_path, small_legacy):
    res, _ = check_legacy(small_legacy)
    raw = bytearray(small_legacy.read_bytes())
    # the first storage's 8-byte count follows the key pickle: find it via the walk's end offsets
    f = open(small_legacy, "rb")
    pos = 0
    for _ in range(5):
        pos, _n, _e = legacy._pickle_end(f, pos)
    f.close()
    count = struct.unpack_from("<q", raw, pos)[0]
    struct.pack_into("<q", raw, pos, count + 1)
    p = _write(tmp_path, bytes(raw), "s.pt")
    _, (fnd,) = check_legacy(p)
    assert fnd.kind == "legacy_storage_size_mismatch"
    assert (fnd.detail["found"], fnd.detail["expected"]) == (count + 1, count)


@pytest.mark.parametrize("comment", [0, 100, 5000, 65535])
def test_end_record_found_behind_a_zip_comment_of_any_length(tmp_path, comment):
    """The end record is looked for in the last 4 KiB first (torch.save writes no comment) and in the whole
    22 + 65,535-byte window when it is not there: a comment of any length still finds the central directory."""
    from ckptaudit.formats.zip.central import find_central_directory
    from ckptaudit.formats.zip.reader import ArchiveFile

    p = tmp_path / "c.zip"
    with zipfile.ZipFile(p, "w", zipfile.ZIP_STORED) as z:
        z.writestr("c/data.pkl", b"x" * 10_000)
        z.writestr("c/data/0", os.urandom(200_000))
        z.comment = b"#" * comment
    with zipfile.ZipFile(p) as z:
        want = z.start_dir
    cd = find_central_directory(ArchiveFile(str(p), window=65536, prefetch=False))
    assert isinstance(cd, dict) and cd["cd_offset"] == want and cd["n_entries"] == 2
