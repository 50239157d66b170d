"""The hashing writer: digests computed from memory match the bytes on disk, whatever the write sizes."""

from __future__ import annotations

import hashlib
import os
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ckptaudit import publish as P
from ckptaudit.publish import writer as W
from ckptaudit.publish.clock import Clock


def test_digests_from_memory_match_the_file_across_chunk_and_write_boundaries(tmp_path):
    """Writes of both kinds (inline below PARALLEL_BYTES, on the pool above) and chunks that
    end inside a write must give the digests of the bytes the file holds."""
    cb = 100_003  # divides no write: every big write ends and starts chunks mid-buffer
    blobs = [b"x" * 17, bytes(range(256)) * 4096, b"", b"y" * (W.PARALLEL_BYTES + 5), b"z" * 3]
    with ThreadPoolExecutor(2) as pool:
        w = W.HashingWriter(tmp_path / "f.bin", "f.bin", cb, pool, Clock())
        for b in blobs:
            assert w.write(memoryview(b)) == len(b)
        rec = w.close()
    data = (tmp_path / "f.bin").read_bytes()
    assert data == b"".join(blobs) and rec.size_bytes == len(data) == 1048576 + 17 + 5 + 3 + 1048576
    assert rec.sha256_hex == hashlib.sha256(data).hexdigest()
    assert rec.chunk_sha256_hex == [hashlib.sha256(data[i:i + cb]).hexdigest() for i in range(0, len(data), cb)]
    assert len(rec.chunk_sha256_hex) == 21


def test_publish_of_big_tensors_records_the_file_digests(tmp_path):
    """torch.save hands each storage over in one write: those go through the pool."""
    state = {f"t{i}": torch.full((300_000,), float(i)) for i in range(3)}  # 1.2 MB each, > PARALLEL_BYTES
    P.save(state, tmp_path, 1, chunk_bytes=1 << 20)
    data = (tmp_path / "ckpt_000001.pt").read_bytes()
    (e,) = json.loads((tmp_path / "ckpt_000001.pt.manifest.json").read_text())["files"]
    assert e["sha256_hex"] == hashlib.sha256(data).hexdigest() and e["size_bytes"] == len(data)
    assert e["chunk_sha256_hex"] == [hashlib.sha256(data[i:i + (1 << 20)]).hexdigest()
                                     for i in range(0, len(data), 1 << 20)]
    assert len(e["chunk_sha256_hex"]) == 4


def test_failed_big_write_waits_for_the_hash_workers_and_keeps_the_error(tmp_path, monkeypatch):
    """A disk-full write must raise ENOSPC itself, with no worker still reading the buffer."""
    import errno

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    with ThreadPoolExecutor(2) as pool:
        w = W.HashingWriter(tmp_path / "f.bin", "f.bin", 1 << 20, pool, Clock())
        monkeypatch.setattr(W, "_write_all", full)
        with pytest.raises(OSError) as ei:
            w.write(b"q" * (W.PARALLEL_BYTES * 2))
        assert ei.value.errno == errno.ENOSPC and w.error is ei.value
        w.abort()
    assert w.closed and w.fd == -1


@pytest.mark.parametrize("sizes", [[0], [5], [4096], [4095, 1], [4096, 1], [100, 8000], [W.PARALLEL_BYTES + 1]])
def test_chunk_zero_from_the_whole_file_hash_at_every_boundary(tmp_path, sizes):
    """Chunk 0 is taken from the whole-file hasher: a file that ends before, at or just after
    the first chunk boundary must still list the digests of its own chunks."""
    cb = 4096
    data = os.urandom(sum(sizes))
    with ThreadPoolExecutor(2) as pool:
        w = W.HashingWriter(tmp_path / "f.bin", "f.bin", cb, pool, Clock())
        off = 0
        for n in sizes:
            w.write(data[off:off + n])
            off += n
        rec = w.close()
    assert rec.sha256_hex == hashlib.sha256(data).hexdigest()
    assert rec.chunk_sha256_hex == [hashlib.sha256(data[i:i + cb]).hexdigest() for i in range(0, len(data), cb)]


def test_start_writeback_finds_sync_file_range_on_linux_and_is_advice_elsewhere(tmp_path):
    p = tmp_path / "f.bin"
    fd = os.open(p, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"w" * 8192)
        W.start_writeback(fd, 0, 8192)
        W.start_writeback(-1, 0, 8192)  # a bad descriptor: advice, never an error
    finally:
        os.close(fd)
    assert (W._libc_sync_file_range() is not None) == os.uname().sysname.startswith("Linux")
    assert p.read_bytes() == b"w" * 8192
