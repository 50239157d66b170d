"""Salvage proves every byte a tensor's identity depends on, writes keys that are unique and reversible, handles
every tensor shape torch saves, and says the same shares as the verdict (issue 43).

Each case is written by the real writers (torch.save, safetensors, ckptaudit.publish, torch.distributed.checkpoint)
and damaged by editing bytes; the expectation comes from the original objects, never from the code under test.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import _TYPES, load_file
from safetensors.torch import save as st_save

from ckptaudit import publish as P
from ckptaudit.intact.proof import SAFETENSORS_DTYPE
from ckptaudit.salvage import salvage
from ckptaudit.salvage.keys import unescape


def _rows(report: dict) -> dict:
    return {r["name"]: r for r in report["tensors"]}


def _sealed_safetensors(run: Path, sd: dict, chunk_bytes: int) -> Path:
    with P.publish(run, 30, name="model.safetensors", chunk_bytes=chunk_bytes) as pub:
        pub.open().write(st_save(sd))
    return run / "model.safetensors"


def _header(path: Path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw, n, json.loads(raw[8:8 + n])


@pytest.mark.parametrize("chunk_bytes", [4096, 64 << 20])
def test_a_sealed_safetensors_header_rewritten_f32_to_i32_proves_no_tensor(tmp_path, chunk_bytes):
    """The header edited from F32 to I32 (same length, offsets still fit) gave an 'intact' int32 tensor: only
    the data chunks were checked.  With 4 KiB chunks the data chunks still verify; the header's does not."""
    sd = {"w": torch.randn(64, 64), "v": torch.randn(64, 64)}
    src = _sealed_safetensors(tmp_path / "run", sd, chunk_bytes)
    raw = src.read_bytes()
    src.write_bytes(raw.replace(b'"F32"', b'"I32"', 1))
    report = salvage(src, tmp_path / "out")
    assert report["counts"]["intact"] == 0 and report["written"] == 0
    assert all(r["status"] == "lost" and "the header" in r["proof"] and "changed" in r["proof"]
               for r in report["tensors"])
    assert not list((tmp_path / "out").glob("*.safetensors"))


def test_sealed_safetensors_offsets_swapped_prove_no_tensor_and_unsealed_ones_are_never_intact(tmp_path):
    """Two same-sized tensors' data_offsets swapped: each one's bytes would be written 'intact' under the other's
    name (their data chunks verify).  Sealed: every tensor lost; unsealed: unproven at best, never intact."""
    sd = {"a": torch.randn(32, 32), "b": torch.randn(32, 32), "c": torch.randn(8)}
    for sealed in (True, False):
        run = tmp_path / f"run{sealed}"
        if sealed:
            src = _sealed_safetensors(run, sd, 4096)
        else:
            run.mkdir()
            src = run / "model.safetensors"
            src.write_bytes(st_save(sd))
        raw, n, head = _header(src)
        head["a"]["data_offsets"], head["b"]["data_offsets"] = head["b"]["data_offsets"], head["a"]["data_offsets"]
        text = json.dumps(head, separators=(",", ":")).encode()
        src.write_bytes(raw[:8] + text + b" " * (n - len(text)) + raw[8 + n:])
        report = salvage(src, tmp_path / f"out{sealed}", include_unproven=not sealed)
        assert report["counts"]["intact"] == 0
        if sealed:
            assert report["counts"]["lost"] == 3 and report["written"] == 0
        else:
            assert {r["status"] for r in report["tensors"]} == {"unproven"}
            got = load_file(str(tmp_path / f"out{sealed}" / "model.safetensors"))
            assert torch.equal(got["a"], sd["b"])  # what --include-unproven writes is what it says: unproven


def test_one_flip_in_a_publish_unit_keeps_11_of_12_tensors_proven_by_their_crc(tmp_path):
    """One flipped byte in a file written by ckptaudit.publish (default 64 MiB chunk: the whole file is one
    chunk) made all 12 tensors lost and the audit said retrain with no salvage offer; 11 pass their record's
    CRC-32, which now decides, and each names that proof.  The audit offers the salvage."""
    from ckptaudit.pipeline import audit_in_process

    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)])  # 12 tensors
    sd = m.state_dict()
    run = tmp_path / "run"
    with P.publish(run, 40) as pub:
        pub.save({"model": sd, "step": 40})
    src = run / "ckpt_000040.pt"
    raw = bytearray(src.read_bytes())
    import zipfile

    with zipfile.ZipFile(src) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/5"))
        n, x = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
        flip = info.header_offset + 30 + n + x + 100
    raw[flip] ^= 0x10
    src.write_bytes(bytes(raw))
    report = salvage(src, tmp_path / "out")
    rows = _rows(report)
    lost = {k for k, r in rows.items() if r["status"] == "lost"}
    assert report["counts"]["intact"] == 11 and len(lost) == 1
    for k, r in rows.items():
        if k not in lost:
            assert r["proven_by"] == {"identity": "zip_crc32", "bytes": "zip_crc32"}, r
            assert "manifest BLAKE3 chunk digest differs" in r["proof"] and "zip record CRC-32" in r["proof"]
    got = load_file(str(tmp_path / "out" / "ckpt_000040.pt.safetensors"))
    assert set(got) == {f"model.{k}" for k in sd} - lost
    assert all(torch.equal(got[k], sd[k[6:]]) for k in got)
    v = audit_in_process(run, out_dir=tmp_path / "audit")
    assert v["salvage"] is not None and v["salvage"]["unit"] == "ckpt_000040.pt"


def test_names_changed_consistently_inside_a_sealed_chunk_prove_nothing_there(tmp_path):
    """Two storage records' names swapped in their local headers and the central directory (their CRC-32s still
    verify, each now under the other storage's key): the chunk differs and no record's CRC-32 there says
    where, so no record of that chunk is proven by its CRC-32."""
    sd = {"a": torch.randn(16), "b": torch.randn(16)}
    run = tmp_path / "run"
    with P.publish(run, 1) as pub:
        pub.save(sd)
    src = run / "ckpt_000001.pt"
    raw = src.read_bytes()
    prefix = raw[30:30 + struct.unpack("<H", raw[26:28])[0]].split(b"/")[0]
    a, b = prefix + b"/data/0", prefix + b"/data/1"
    src.write_bytes(raw.replace(a, b"\0TMP").replace(b, a).replace(prefix[:0] + b"\0TMP", b))
    assert src.read_bytes().count(a) == 2  # local header and central directory, each
    report = salvage(src, tmp_path / "out")
    assert report["counts"]["intact"] == 0, [(r["name"], r["proof"]) for r in report["tensors"]]


def test_flat_dotted_and_nested_keys_never_share_one_key(tmp_path):
    """{'a.b': t} and {'a': {'b': u}} both became 'model.a.b': one header key for two payloads, a file that did
    not open, salvage.json saying 7 written where it held 6, exit 0."""
    sd = {"model": {"a.b": torch.ones(2), "a": {"b": torch.zeros(3)}, "c": torch.full((4,), 2.0),
                    "d%2Ee": torch.ones(1), "d": {"e": torch.zeros(1)}, "x": [torch.ones(1)], "x.0": torch.zeros(2)}}
    run = tmp_path / "run"
    run.mkdir()
    torch.save(sd, run / "ckpt_000007.pt")
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "ckpt_000007.pt"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "out" / "salvage.json").read_text())
    got = load_file(str(tmp_path / "out" / "ckpt_000007.pt.safetensors"))
    assert report["written"] == len(got) == 7 == len({t["key"] for t in report["tensors"]})
    for t in report["tensors"]:
        want = sd
        for p in t["path"]:
            want = want[p]
        assert torch.equal(got[t["key"]], want), t
        if t["key"] != t["name"]:  # escaped (its joined name collided): the key itself gives the path back
            assert unescape(t["key"]) == [str(p) for p in t["path"]]
    escaped = {t["name"] for t in report["tensors"] if t["key"] != t["name"]}
    assert escaped == {"model.a.b", "model.x.0"}
    assert got["model.c"].tolist() == [2.0] * 4  # an unambiguous key stays the state_dict's key


def test_keys_that_print_alike_are_refused_with_one_line(tmp_path):
    """{0: t, '0': u} join alike however escaped: one is refused (not written), named in one line; the file opens."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"s": {0: torch.ones(2), "0": torch.zeros(2)}, "w": torch.ones(3)}, run / "ckpt_000001.pt")
    report = salvage(run / "ckpt_000001.pt", tmp_path / "out")
    got = load_file(str(tmp_path / "out" / "ckpt_000001.pt.safetensors"))
    assert set(got) == {"w"} and report["written"] == 1
    row = next(f for f in report["files"] if f["kind"] == "not written")
    assert "2 tensor(s) not written" in row["problem"] and "print alike" in row["problem"]


def test_every_shape_and_dtype_torch_saves(tmp_path):
    """torch.zeros(4, 0) crashed (torch.frombuffer of an empty buffer, exit 1, no salvage.json); 0-d tensors,
    every dtype safetensors holds, and views with strides and storage offsets come back bit-exact; a dtype no
    safetensors dtype holds is named, not written."""
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    sd = {"empty": torch.zeros(4, 0), "empty1": torch.ones(0), "scalar": torch.tensor(3.5),
          "row": base[2], "col": base[:, 3], "t": base.t(), "strided": base[1:, ::3], "expanded": base[0, :1].expand(5),
          "c128": torch.ones(2, dtype=torch.complex128)}
    for name in SAFETENSORS_DTYPE:
        dtype = getattr(torch, name)
        sd[f"dt.{name}"] = torch.randint(0, 2, (3, 2), dtype=torch.uint8).view(dtype) if dtype.itemsize == 1 else \
            torch.randint(0, 255, (3, 2 * dtype.itemsize), dtype=torch.uint8).view(dtype)
    assert set(SAFETENSORS_DTYPE.values()) == set(_TYPES)  # every dtype safetensors reads back, no other
    run = tmp_path / "run"
    run.mkdir()
    torch.save(sd, run / "ckpt_000001.pt")
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "ckpt_000001.pt"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "out" / "salvage.json").read_text())
    got = load_file(str(tmp_path / "out" / "ckpt_000001.pt.safetensors"))
    assert set(got) == set(sd) - {"c128"} and report["counts"]["intact"] == len(sd)
    for k, v in got.items():
        assert v.dtype == sd[k].dtype and v.shape == sd[k].shape, k
        assert v.contiguous().view(torch.uint8).tolist() == sd[k].contiguous().view(torch.uint8).tolist() \
            if v.dim() and v.numel() else torch.equal(v.view(torch.uint8) if v.dim() else v, sd[k].view(torch.uint8)
                                                      if v.dim() else sd[k]), k
    assert any("'c128': complex128 is no dtype safetensors holds" in f["problem"] for f in report["files"])


def test_an_unexpected_error_is_exit_3_with_one_line_and_a_log(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"w": torch.ones(3)}, run / "ckpt_000001.pt")
    code = ("import sys, ckptaudit.salvage.writer as w\n"
            "def boom(*a, **k): raise RuntimeError('disk said no')\n"
            "w.write = boom\n"
            "from ckptaudit.cli import main\n"
            f"sys.argv = ['ckptaudit', 'salvage', {str(run / 'ckpt_000001.pt')!r}, '--out', {str(tmp_path / 'out')!r}]\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 3, (r.stdout, r.stderr)
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("ckptaudit salvage: failed: RuntimeError: disk said no (traceback: ")
    log = Path(line.split("(traceback: ", 1)[1].split(")", 1)[0])
    assert "disk said no" in log.read_text() and "Traceback" in log.read_text()
    log.unlink()
    assert not (tmp_path / "out").exists()  # nothing published


def test_a_sidecar_sha256_proves_an_unsealed_safetensors_file_and_its_mismatch_proves_nothing(tmp_path):
    sd = {"a": torch.randn(8, 8), "b": torch.randn(4)}
    run = tmp_path / "run"
    run.mkdir()
    src = run / "model.safetensors"
    src.write_bytes(st_save(sd))
    (run / "model.safetensors.sha256").write_text(f"{hashlib.sha256(src.read_bytes()).hexdigest()}  model.safetensors\n")
    report = salvage(src, tmp_path / "out")
    assert report["counts"]["intact"] == 2
    assert all(r["proven_by"] == {"identity": "sha256_sidecar", "bytes": "sha256_sidecar"} for r in report["tensors"])
    raw = bytearray(src.read_bytes())
    raw[-3] ^= 1
    src.write_bytes(bytes(raw))
    report = salvage(src, tmp_path / "out2")
    assert report["counts"]["intact"] == 0 and report["counts"]["unproven"] == 2
    assert all("SHA-256 differs" in r["proof"] for r in report["tensors"])


def test_the_verdict_and_salvage_name_the_same_two_shares_in_the_same_words(tmp_path):
    """'98 % of the weights intact' (the verdict) beside '52.3 % of their bytes' (salvage, all tensors) read as
    a contradiction: both now state the model weights' share and all tensors' share, in one wording."""
    from ckptaudit.pipeline import audit_in_process
    from ckptaudit.salvage_option import share_words

    torch.manual_seed(0)
    run = tmp_path / "run"
    run.mkdir()
    m = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 64)).sum().backward()
    opt.step()
    for step in (100, 200):
        torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": step}, run / f"ckpt_{step:06d}.pt")
    raw = (run / "ckpt_000200.pt").read_bytes()
    (run / "ckpt_000200.pt").write_bytes(raw[: int(len(raw) * 0.55)])  # inside the optimizer state
    v = audit_in_process(run, out_dir=tmp_path / "audit")
    words = share_words(v["salvage"]["shares"])
    assert words in v["salvage"]["sentence"] and "of the bytes of the model weights" in words
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "ckpt_000200.pt"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0 and f"  {words} are proven intact" in r.stdout, (words, r.stdout)
    assert v["salvage"]["shares"]["model_weights"] > v["salvage"]["shares"]["all_tensors"]


def test_a_dcp_metadata_its_integrity_json_refuses_proves_no_tensor(tmp_path):
    """A DCP folder's .metadata names every tensor and places its chunks; replaced by another save's (its chunk
    blobs still verify), integrity.json's SHA-256 of it differs and no tensor is intact."""
    import torch.distributed.checkpoint as dcp

    from ckptaudit.formats.integrity_json import write_folder

    run = tmp_path / "run"
    for step, seed in ((10, 1), (20, 2)):
        torch.manual_seed(seed)
        dcp.save({"model": torch.nn.Linear(8, 8).state_dict()}, checkpoint_id=str(run / f"iter_{step:07d}"))
    (run / "latest_checkpointed_iteration.txt").write_text("20")
    write_folder(run / "iter_0000020")
    report = salvage(run / "iter_0000020", tmp_path / "out")
    assert report["counts"]["intact"] == 2
    assert {r["proven_by"]["identity"] for r in report["tensors"]} == {"sha256_integrity_json"}
    (run / "iter_0000020" / ".metadata").write_bytes((run / "iter_0000010" / ".metadata").read_bytes() + b"\0")
    report = salvage(run / "iter_0000020", tmp_path / "out2")
    assert report["counts"]["intact"] == 0 and all(".metadata" in r["proof"] for r in report["tensors"])
    assert os.listdir(run / "iter_0000020")  # only read


def test_a_written_file_that_is_not_what_was_written_is_never_published(tmp_path, monkeypatch):
    """The check before publishing: a header whose offsets do not place each tensor where its bytes were written
    (here: the header lists the tensors in reverse) stops the publish; nothing appears under --out."""
    from ckptaudit.salvage import WrittenFileDiffers
    from ckptaudit.salvage import writer

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"a": torch.ones(3), "b": torch.zeros(5)}, run / "ckpt_000001.pt")
    real = writer.header_bytes
    monkeypatch.setattr(writer, "header_bytes", lambda ts, meta: real(list(reversed(ts)), meta))
    with pytest.raises(WrittenFileDiffers, match="its bytes were written at"):
        salvage(run / "ckpt_000001.pt", tmp_path / "out")
    assert not (tmp_path / "out").exists() and sorted(os.listdir(tmp_path)) == ["run"]
