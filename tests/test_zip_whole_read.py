"""A small local archive whose every record is checked is read at once (ckptaudit/formats/zip/reader.py,
``ArchiveFile(whole=True)``): the same report, one read instead of a few per record."""

from __future__ import annotations

import pytest

from ckptaudit import fs
from ckptaudit.formats import torchzip
from ckptaudit.formats.zip import reader

_PREAD = fs.pread


def _save(path, n: int = 40):
    import torch

    torch.save({f"w{i}": torch.full((3,), float(i)) for i in range(n)} | {"step": 7}, path)
    return path


def _report(path, monkeypatch, whole_read_bytes: int):
    calls = []

    def counted(fd, n, off):
        calls.append((n, off))
        return _PREAD(fd, n, off)

    monkeypatch.setattr(reader, "WHOLE_READ_BYTES", whole_read_bytes)
    monkeypatch.setattr(fs, "pread", counted)
    rep = torchzip.check_zip(path)
    return [f.to_dict() for f in rep.findings], [(m.name, m.data_offset, m.crc_ok) for m in rep.members], calls


@pytest.mark.parametrize("damage", [None, "flip", "cut"])
def test_a_small_archive_read_at_once_gives_the_same_report(tmp_path, monkeypatch, damage):
    path = _save(tmp_path / "ckpt.pt")
    data = bytearray(path.read_bytes())
    if damage == "flip":  # a tensor byte: a CRC mismatch
        data[data.index(b"data/1") + 200] ^= 0xFF
    elif damage == "cut":
        data = data[: len(data) * 2 // 3]
    path.write_bytes(bytes(data))
    findings, members, at_once = _report(path, monkeypatch, 1 << 20)
    findings_before, members_before, record_by_record = _report(path, monkeypatch, 0)
    assert (findings, members) == (findings_before, members_before)
    assert at_once[0] == (len(data), 0) and len(at_once) <= 2 < len(record_by_record)
    if damage == "flip":
        assert [f["kind"] for f in findings] == ["zip_crc_mismatch"]


def test_a_big_archive_is_read_record_by_record(tmp_path, monkeypatch):
    path = _save(tmp_path / "ckpt.pt")
    _, _, calls = _report(path, monkeypatch, path.stat().st_size - 1)
    assert all(n < path.stat().st_size for n, _ in calls) and len(calls) > 2
