"""Progress of the hash stage: the jobs' ProgressWriter files and the line the CLI draws from them."""

from __future__ import annotations

import hashlib
from pathlib import Path

import blake3

from ckptaudit.stages import hash as hashing, progress


def test_writer_counts_and_close_writes_the_last_count(tmp_path):
    w = progress.ProgressWriter(tmp_path / "p" / "a.progress", 1000)
    assert (tmp_path / "p" / "a.progress").read_text() == "0 1000\n"
    for _ in range(10):
        w.add(100)
    w.close()
    assert (tmp_path / "p" / "a.progress").read_text() == "1000 1000\n"
    assert progress.read_progress(tmp_path / "p") == 1000
    assert list((tmp_path / "p").iterdir()) == [tmp_path / "p" / "a.progress"]  # no temp file left


def test_writer_is_rate_limited(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    w = progress.ProgressWriter(tmp_path / "a.progress", 10)
    w.add(3)  # same instant as the first write: not written
    assert (tmp_path / "a.progress").read_text() == "0 10\n"
    clock[0] += 1.0 / progress.WRITES_PER_SECOND
    w.add(2)
    assert (tmp_path / "a.progress").read_text() == "5 10\n"


def test_no_progress_folder_no_writer(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    assert progress.for_unit({"unit": "u", "size_bytes": 5}) is progress.NULL


def test_hash_unit_reports_every_byte_it_hashes(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    data = bytes(range(256)) * 4096  # 1 MiB
    (run / "ckpt_000100.pt").write_bytes(data)
    monkeypatch.setenv(progress.ENV, str(tmp_path / "progress"))
    rows = hashing.hash_unit(run, {"unit": "ckpt_000100.pt", "files": ["ckpt_000100.pt"], "size_bytes": len(data)})
    assert rows[0]["sha256_hex"] == ""  # no sidecar: the audit's own fast digest only (issue 45)
    assert (rows[0]["digest_algorithm"], rows[0]["digest_hex"]) == ("blake3", blake3.blake3(data).hexdigest())
    files = list((tmp_path / "progress").glob("*.progress"))
    assert len(files) == 1 and files[0].read_text() == f"{len(data)} {len(data)}\n"
    assert progress.read_progress(tmp_path / "progress") == len(data)


def test_line_says_done_total_rate_and_eta():
    gib = 1 << 30
    assert progress.line(gib, 4 * gib, 0) == "hashed 1.0 GiB of 4.0 GiB (25%)"
    assert progress.line(gib, 4 * gib, 2.0) == "hashed 1.0 GiB of 4.0 GiB (25%), 512.0 MiB/s, ETA 6 s"
    assert progress.line(3 * gib, 4 * gib, 2.0, since=2 * gib) == "hashed 3.0 GiB of 4.0 GiB (75%), 512.0 MiB/s, ETA 2 s"
    assert progress.line(4 * gib, 4 * gib, 8.0) == "hashed all 4.0 GiB; scanning, load-testing and checking the units"
    assert progress.line(1 << 20, 100 * gib, 1.0) == "hashed 1.0 MiB of 100.0 GiB (0%), 1.0 MiB/s, ETA 28 h 26 min"


def test_totals_reads_the_inventory(tmp_path):
    assert progress.totals(tmp_path / "missing.json") == (0, 0)
    (tmp_path / "inv.json").write_text('{"units": [{"size_bytes": 3}, {"size_bytes": 4}]}')
    assert progress.totals(tmp_path / "inv.json") == (2, 7)
