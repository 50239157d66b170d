"""A finding is built once, naming the file as the run shows it and the tensors it hits: nothing relabels it later.

Guards against the format checkers building a finding with the path they opened and the scanner
re-making it (with the run-relative path, then again with the damaged tensors' names), which left
three builders of one finding that could drift apart.
"""

from __future__ import annotations

import json
import zipfile

import pytest

from ckptaudit import findings as F
from ckptaudit.discovery import folders as folder_unit
from ckptaudit.stages import inventory
from ckptaudit.formats import legacy, safetensors_check, sniff, torchzip, zeros
from ckptaudit.layouts import leftovers
from ckptaudit.stages.scan import scan_units


def _flip_in_record(src, dst, record_suffix: str, at: int) -> None:
    """Copy torch zip ``src`` to ``dst`` with one byte of the record ending in ``record_suffix`` flipped."""
    rep = torchzip.check_zip(src)
    m = next(m for m in rep.members if m.name.endswith(record_suffix))
    data = bytearray(src.read_bytes())
    data[m.data_offset + at] ^= 0x40
    dst.write_bytes(bytes(data))


def test_scanner_names_the_run_relative_path_and_the_damaged_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    run = tmp_path / "run"
    (run / "sub").mkdir(parents=True)
    good = tmp_path / "good.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g)}, good)
    _flip_in_record(good, run / "sub" / "ckpt_000100.pt", "data/0", 100)  # storage 0 holds "w"

    doc = inventory.run_inventory(str(run))
    scans, _tensors, _imports = scan_units(run, doc["units"], {})
    (crc,) = [f for r in scans for f in json.loads(r["findings_json"]) if f["kind"] == "zip_crc_mismatch"]
    assert crc["path"] == "sub/ckpt_000100.pt"
    assert crc["detail"]["tensor_text"] == "; it holds w"
    assert crc["message"].startswith("sub/ckpt_000100.pt: member good/data/0 fails its CRC32 check")
    assert crc["message"].endswith("its bytes changed after the save; it holds w.")
    assert "path" not in crc["detail"]  # nothing copied in after the finding was made
    assert crc["detector"] == "ckptaudit.formats.zip.crc_finding:crc_mismatch"


def test_check_zip_builds_with_the_display_path_and_the_names_it_is_given(tmp_path):
    torch = pytest.importorskip("torch")
    good = tmp_path / "good.pt"
    torch.save({"w": torch.randn(64, 64, generator=torch.Generator().manual_seed(0))}, good)
    bad = tmp_path / "bad.pt"
    _flip_in_record(good, bad, "data/0", 7)
    seen = []

    def names(data: bytes, n_records: int):
        seen.append((data[:2], n_records))
        return {"0": ["layer.0.weight", "layer.0.alias", "layer.1.weight", "layer.2.weight"]}

    (f,) = torchzip.check_zip(bad, display="run/bad.pt", tensor_names=names).findings
    with zipfile.ZipFile(good) as z:  # called once, with data.pkl's bytes (a protocol-2 pickle) and the records
        assert seen == [(b"\x80\x02", len(z.namelist()))]
    assert (f.kind, f.path) == ("zip_crc_mismatch", "run/bad.pt")
    assert f.detail["tensor_text"] == "; it holds layer.0.weight, layer.0.alias, layer.1.weight and 1 more"
    assert f.message.startswith("run/bad.pt: member good/data/0 fails its CRC32 check")
    (plain,) = torchzip.check_zip(bad).findings  # no names, no display: the storage key and the path opened
    assert (plain.path, plain.detail["tensor_text"]) == (str(bad), " (the bytes of storage 0)")


def test_each_checker_names_the_display_path(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    st = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(64, 4)}, st)
    cut_st = tmp_path / "cut.safetensors"
    cut_st.write_bytes(st.read_bytes()[:-100])
    (f,) = safetensors_check.check_safetensors(cut_st, display="ckpt/model.safetensors")[1]
    assert (f.kind, f.path) == ("truncated_in_data", "ckpt/model.safetensors")
    assert f.message.startswith("ckpt/model.safetensors: the safetensors header is intact")

    old = tmp_path / "old.pt"
    torch.save({"w": torch.ones(8)}, old, _use_new_zipfile_serialization=False)
    cut_old = tmp_path / "cut_old.pt"
    cut_old.write_bytes(old.read_bytes()[:-10])
    (f,) = legacy.check_legacy(cut_old, display="ckpt/old.pt")[1]
    assert (f.kind, f.path) == ("truncated_legacy_pickle", "ckpt/old.pt")

    html = tmp_path / "x.pt"
    html.write_text("<html><body>quota exceeded</body></html>")
    (f,) = sniff.generic_findings(sniff.sniff(html), "ckpt/x.pt")
    assert (f.kind, f.path, f.message[:10]) == ("html_error_page", "ckpt/x.pt", "ckpt/x.pt ")


def test_a_zeroed_head_is_the_same_finding_from_all_three_checkers(tmp_path):
    p = tmp_path / "head.safetensors"
    p.write_bytes(bytes(100) + b"\x01\x02garbage" * 50)
    want = [F.make("zero_filled_head", path="run/head.safetensors", zero_bytes=100, size_bytes=p.stat().st_size)]
    assert sniff.generic_findings(sniff.sniff(p), "run/head.safetensors") == want
    assert safetensors_check.check_safetensors(p, display="run/head.safetensors")[1] == want
    assert torchzip.check_zip(p, display="run/head.safetensors").findings == want
    assert zeros.head("run/head.safetensors", 63, 500) == []  # under MIN_HEAD_BYTES: no finding
    assert want[0].detector == "ckptaudit.formats.zeros:head"


def test_irregular_files_and_audit_errors_get_their_kind_and_layer_at_construction():
    assert leftovers.irregular("a.pt", leftovers.UNREADABLE).kind == "file_unreadable"
    assert folder_unit.UNREADABLE == leftovers.UNREADABLE == "permission denied"
    f = leftovers.irregular("p.pt", "it is a FIFO (named pipe): opening it would block")
    assert (f.kind, f.message) == ("not_a_regular_file", "p.pt is not read: it is a FIFO (named pipe): opening it "
                                                         "would block.")
    e = F.make("audit_error", path="u", stage="structure", error_type="E", error="e")
    assert (e.stage, e.layer) == ("structure", "structure")
    assert F.make("audit_error", path="u", stage="state", error_type="E", error="e").layer == "state"
    assert F.make("audit_error", path="u", stage="report", error_type="E", error="e").layer == "file"
