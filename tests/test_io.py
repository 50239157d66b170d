"""ckptaudit._io: the one atomic write leaves the old bytes or the new ones, never a torn file or a temp."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import socket

import pytest

from ckptaudit import _io


def _fsyncs(monkeypatch):
    """Record what each os.fsync was given: 'file' or 'dir'."""
    seen = []
    real = os.fsync

    def fsync(fd):
        seen.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_bytes_replace_the_target_and_no_temp_is_left(tmp_path):
    p = tmp_path / "a.json"
    p.write_bytes(b"old")
    _io.atomic_write(p, b"new bytes")
    assert p.read_bytes() == b"new bytes"
    assert os.listdir(tmp_path) == ["a.json"]
    assert oct(p.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_a_writer_callable_gets_the_temp_file(tmp_path):
    p = tmp_path / "t.bin"
    _io.atomic_write(p, lambda f: (f.write(b"ab"), f.write(memoryview(b"cd"))))
    assert p.read_bytes() == b"abcd"
    assert os.listdir(tmp_path) == ["t.bin"]


def test_durable_fsyncs_the_file_then_the_folder(tmp_path, monkeypatch):
    seen = _fsyncs(monkeypatch)
    _io.atomic_write(tmp_path / "d", b"x", durable=True)
    assert seen == ["file", "dir"]


def test_durable_without_sync_dir_leaves_the_folder_to_the_caller(tmp_path, monkeypatch):
    seen = _fsyncs(monkeypatch)
    _io.atomic_write(tmp_path / "d", b"x", durable=True, sync_dir=False)
    assert seen == ["file"]


def test_not_durable_fsyncs_nothing(tmp_path, monkeypatch):
    seen = _fsyncs(monkeypatch)
    _io.atomic_write(tmp_path / "d", b"x")
    assert seen == []


def test_the_clock_times_every_fsync(tmp_path):
    keys = []

    class Clock:
        def __call__(self, key):
            keys.append(key)
            return self

        def __enter__(self):
            return None

        def __exit__(self, *exc):
            return False

    _io.atomic_write(tmp_path / "d", b"x", durable=True, clock=Clock())
    assert keys == ["fsync_seconds", "fsync_seconds"]


def test_a_failing_writer_leaves_the_old_bytes_and_no_temp(tmp_path):
    p = tmp_path / "keep"
    p.write_bytes(b"old")

    def writer(f):
        f.write(b"half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        _io.atomic_write(p, writer)
    assert p.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["keep"]


def test_a_failing_rename_removes_the_temp(tmp_path, monkeypatch):
    p = tmp_path / "x"

    def replace(src, dst):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="cross-device"):
        _io.atomic_write(p, b"data", durable=True)
    assert os.listdir(tmp_path) == []


def test_temp_names_are_in_progress_names_of_this_host_and_process():
    name = _io.tmp_name("ckpt_000001.pt")
    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
    assert re.fullmatch(rf"\.ckptaudit-tmp-{host}-{os.getpid()}-[0-9a-f]{{8}}-ckpt_000001\.pt", name), name
    assert _io.host_tag() == host and name.startswith(_io.TMP_PREFIX)


def test_atomic_symlink_swaps_the_link(tmp_path):
    (tmp_path / "a").write_text("A")
    (tmp_path / "b").write_text("B")
    link = tmp_path / "last"
    _io.atomic_symlink(link, "a")
    assert os.readlink(link) == "a"
    _io.atomic_symlink(link, "b")
    assert os.readlink(link) == "b" and link.read_text() == "B"
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "last"]


def test_fsync_dir_tolerates_a_file_system_that_cannot(tmp_path, monkeypatch, caplog):
    def fsync(fd):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(_io, "_DIR_FSYNC_WARNED", False)
    _io.fsync_dir(tmp_path)
    _io.fsync_dir(tmp_path)
    assert [r.getMessage() for r in caplog.records].count(
        f"{tmp_path}: this file system cannot fsync a folder (Invalid argument); renames are not made durable") == 1


def test_fsync_dir_raises_other_errors(tmp_path, monkeypatch):
    def fsync(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="I/O error"):
        _io.fsync_dir(tmp_path)
