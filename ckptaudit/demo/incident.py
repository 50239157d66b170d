"""The demo's incident: a save killed mid-write (SIGKILL) and a byte flipped in a tensor record."""

from __future__ import annotations

import os
import select
import signal
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any, Dict

import torch

from .checkpoint import PathLike, canonical, serialize


class StallingWriter:
    """File-like object for ``torch.save`` that writes straight to an fd and, once
    ``limit`` bytes are written, signals ``notify_fd`` and blocks forever (until killed)."""

    def __init__(self, fd: int, limit: int, notify_fd: int, block_fd: int):
        self.fd, self.limit, self.notify_fd, self.block_fd = fd, limit, notify_fd, block_fd
        self.written = 0

    def write(self, b) -> int:
        b = bytes(b)
        room = self.limit - self.written
        if len(b) < room:
            self._write_all(b)
            return len(b)
        self._write_all(b[:room])
        os.write(self.notify_fd, b"K")  # "kill me now": exactly `limit` bytes are on disk
        while True:
            os.read(self.block_fd, 1)  # the parent never writes: block until SIGKILL

    def _write_all(self, b: bytes) -> None:
        view = memoryview(b)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.written += n

    def flush(self) -> None:
        pass


def crash_save(ckpt: Dict[str, Any], path: PathLike, *, truncate_fraction: float = 0.55,
               timeout_s: float = 60.0) -> int:
    """Naive writer killed mid-write: a forked child ``torch.save``s ``ckpt`` directly to
    ``path`` (no temp name, no sidecar) and receives SIGKILL once
    ``int(truncate_fraction * full_size)`` bytes are on disk.  Returns that byte count.

    Raises RuntimeError if the child fails before reaching the cut, is not killed by
    SIGKILL, or does not reach the cut within ``timeout_s`` seconds; ValueError unless
    0 < ``truncate_fraction`` < 1.  POSIX only (``os.fork``)."""
    if not 0.0 < truncate_fraction < 1.0:
        raise ValueError(f"truncate_fraction must be in (0, 1), got {truncate_fraction}")
    path = Path(path)
    full_size = len(serialize(ckpt))  # same bytes the child will stream out
    limit = int(truncate_fraction * full_size)
    notify_r, notify_w = os.pipe()
    block_r, block_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: only torch.save and os calls, then os._exit; never returns
        code = 1
        try:
            os.close(notify_r)
            os.close(block_w)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            torch.save(canonical(ckpt), StallingWriter(fd, limit, notify_w, block_r))
            os.write(notify_w, b"E")  # finished without reaching the cut: must not happen
        except BaseException:
            try:
                os.write(notify_w, b"E")
            except OSError:
                pass
        finally:
            os._exit(code)
    os.close(notify_w)
    os.close(block_r)
    try:
        ready, _, _ = select.select([notify_r], [], [], timeout_s)
        msg = os.read(notify_r, 1) if ready else b""
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(notify_r)
        os.close(block_w)
    if msg != b"K":
        why = "timed out" if not ready else "failed"
        raise RuntimeError(f"{path}: writer child {why} before the cut at {limit} of {full_size} bytes")
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise RuntimeError(f"{path}: expected the writer child to die of SIGKILL, got wait status {status}")
    actual = path.stat().st_size
    if actual != limit:
        raise RuntimeError(f"{path}: expected {limit} bytes after the kill, found {actual}")
    return limit


def flip_byte_in_tensor_record(path: PathLike) -> tuple:
    """Flip one byte (XOR 0xFF) in the middle of the largest ``*/data/<n>`` record (the
    lowest ``n`` among equals: the first such model weight) of the torch zip at ``path``, in place.  The byte is the least significant byte of a float32
    element, so values stay finite and ``torch.load`` still succeeds; the zip CRC-32 and any
    file hash change.  Returns ``(file_offset_bytes, member_name)``.
    Raises ValueError if the file has no tensor data record."""
    path = Path(path)
    with zipfile.ZipFile(path) as zf:
        records = [i for i in zf.infolist() if "/data/" in i.filename and i.filename.rsplit("/", 1)[-1].isdigit()]
        if not records:
            raise ValueError(f"{path}: expected a */data/<n> tensor record, found none")
        info = max(records, key=lambda i: (i.file_size, -int(i.filename.rsplit("/", 1)[-1])))
    with open(path, "r+b") as f:
        f.seek(info.header_offset)
        local = f.read(30)  # local file header, APPNOTE.TXT 4.3.7
        sig, name_len, extra_len = struct.unpack("<I22xHH", local)
        if sig != 0x04034B50:
            raise ValueError(f"{path}: expected a local header at {info.header_offset}, found {sig:#x}")
        data_start = info.header_offset + 30 + name_len + extra_len
        offset = data_start + (info.file_size // 2) // 4 * 4  # LSB of a little-endian float32
        f.seek(offset)
        old = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([old ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    return offset, info.filename
