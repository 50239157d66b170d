"""The hashing writer: digests computed from memory match the bytes on disk, whatever the write sizes."""

from __future__ import annotations

import hashlib
import os
import json

import blake3
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
    w = W.HashingWriter(tmp_path / "f.bin", "f.bin", cb, Clock())
    for b in blobs:
        assert w.write(memoryview(b)) == len(b)
    rec = w.close()
    data = (tmp_path / "f.bin").read_bytes()
    assert data == b"".join(blobs) and rec.size_bytes == len(data) == 1048576 + 17 + 5 + 3 + 1048576
    assert rec.sha256_hex == hashlib.sha256(data).hexdigest()
    assert rec.chunk_blake3_hex == [blake3.blake3(data[i:i + cb]).hexdigest() for i in range(0, len(data), cb)]
    assert len(rec.chunk_blake3_hex) == 21


def test_publish_of_big_tensors_records_the_file_digests(tmp_path):
    """torch.save hands each storage over in one write: those go through the pool."""
    state = {f"t{i}": torch.full((300_000,), float(i)) for i in range(3)}  # 1.2 MB each, > PARALLEL_BYTES
    P.save(state, tmp_path, 1, chunk_bytes=1 << 20)
    data = (tmp_path / "ckpt_000001.pt").read_bytes()
    (e,) = json.loads((tmp_path / "ckpt_000001.pt.manifest.json").read_text())["files"]
    assert e["sha256_hex"] == hashlib.sha256(data).hexdigest() and e["size_bytes"] == len(data)
    assert e["chunk_blake3_hex"] == [blake3.blake3(data[i:i + (1 << 20)]).hexdigest()
                                     for i in range(0, len(data), 1 << 20)]
    assert len(e["chunk_blake3_hex"]) == 4 and "chunk_sha256_hex" not in e


def test_failed_big_write_waits_for_the_hash_workers_and_keeps_the_error(tmp_path, monkeypatch):
    """A disk-full write must raise ENOSPC itself, with no worker still reading the buffer."""
    import errno

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    w = W.HashingWriter(tmp_path / "f.bin", "f.bin", 1 << 20, Clock())
    monkeypatch.setattr(W, "_write_all", full)
    with pytest.raises(OSError) as ei:
        w.write(b"q" * (W.PARALLEL_BYTES * 2))
    assert ei.value.errno == errno.ENOSPC and w.error is ei.value and all(f.done() for f in w._pending)
    w.abort()
    assert w.closed and w.fd == -1


@pytest.mark.parametrize("sizes", [[0], [5], [4096], [4095, 1], [4096, 1], [100, 8000], [W.PARALLEL_BYTES + 1]])
def test_chunk_digests_at_every_boundary(tmp_path, sizes):
    """A file that ends before, at or just after the first chunk boundary lists the digests of its own
    chunks (none for an empty file), whatever the writes that made it."""
    cb = 4096
    data = os.urandom(sum(sizes))
    w = W.HashingWriter(tmp_path / "f.bin", "f.bin", cb, Clock())
    off = 0
    for n in sizes:
        w.write(data[off:off + n])
        off += n
    rec = w.close()
    assert rec.sha256_hex == hashlib.sha256(data).hexdigest()
    assert rec.chunk_blake3_hex == [blake3.blake3(data[i:i + cb]).hexdigest() for i in range(0, len(data), cb)]


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


def test_held_writes_are_hashed_after_write_returns_in_file_order(tmp_path):
    """Big writes from held memory return before their hashing ends; small writes made meanwhile and a big
    write from memory that is not held come after them in the digests, as in the file."""
    import numpy as np

    held = np.frombuffer(os.urandom(3 * W.PARALLEL_BYTES + 77), np.uint8)
    other = os.urandom(W.PARALLEL_BYTES + 9)
    cb = 300_007
    w = W.HashingWriter(tmp_path / "f.bin", "f.bin", cb, Clock())
    w.hold([(held.ctypes.data, held.ctypes.data + held.nbytes)])
    parts = [held[:W.PARALLEL_BYTES], b"h" * 30, held[W.PARALLEL_BYTES:2 * W.PARALLEL_BYTES + 5], b"s" * 7,
             other, held[2 * W.PARALLEL_BYTES + 5:], b"t" * (W.TAIL_BATCH_BYTES + 1), b"e"]
    for p in parts:
        w.write(memoryview(p))
    assert w._lanes is not None  # the big writes went to the hashing threads
    rec = w.close()
    data = (tmp_path / "f.bin").read_bytes()
    assert data == b"".join(bytes(p) for p in parts)
    assert rec.sha256_hex == hashlib.sha256(data).hexdigest()
    assert rec.chunk_blake3_hex == [blake3.blake3(data[i:i + cb]).hexdigest() for i in range(0, len(data), cb)]
    assert w._lanes is None and not w._pending and not w._tail


def test_a_buffer_only_partly_inside_held_memory_is_waited_for(tmp_path):
    import numpy as np

    buf = np.frombuffer(os.urandom(2 * W.PARALLEL_BYTES), np.uint8)
    w = W.HashingWriter(tmp_path / "f.bin", "f.bin", 1 << 20, Clock())
    w.hold([(buf.ctypes.data, buf.ctypes.data + W.PARALLEL_BYTES)])  # the first half only
    assert w._is_held(memoryview(buf[:W.PARALLEL_BYTES])) and not w._is_held(memoryview(buf))
    w.write(memoryview(buf))
    assert not w._pending  # waited for: the caller may free it as soon as write returns
    w.abort()
    assert w._lanes is None and w.closed


def test_cpu_storage_ranges_walks_containers_once_and_skips_what_torch_copies():
    a, b = torch.zeros(1000), torch.ones(10, 10)
    view = b[2:]  # a view: its storage is b's
    d = {"model": {"a": a, "b": b}, "opt": [view, (torch.zeros(3, device="meta"),)], "n": 3}
    d["self"] = d  # a cycle
    got = sorted(W.cpu_storage_ranges(d))
    sa, sb = a.untyped_storage(), b.untyped_storage()
    assert sorted(set(got)) == sorted([(sa.data_ptr(), sa.data_ptr() + 4000), (sb.data_ptr(), sb.data_ptr() + 400)])
    assert W.cpu_storage_ranges(torch.zeros(0)) == [] and W.cpu_storage_ranges({"x": object()}) == []
