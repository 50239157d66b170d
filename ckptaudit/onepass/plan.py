"""What one pass feeds whom: the ranges of a file's zip records and tensors, found first with small reads.

A torch zip: the central directory and each record's local header (the file layer's own parser,
:mod:`ckptaudit.formats.zip.central`, so the offsets are the ones the scan stage asks for), then
data.pkl, walked statically (:func:`ckptaudit.pickle_walk.walk`, nothing unpickled) for each
tensor's storage, offset and dtype.  A safetensors file: its 8-byte length and JSON header.  What
cannot be planned (a damaged archive, another format) gets no ranges: the stage that needs the
fact reads those bytes itself, as it did before.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .. import fs
from .values import FLOAT_DTYPES

#: Largest safetensors header read for planning (bytes); the file layer checks the header itself.
MAX_HEADER_BYTES = 100 << 20


@dataclass
class Plan:
    """The byte ranges of one file: ``crc`` ``(member, data offset, length)`` of stored zip records with a
    recorded CRC32, ``values`` ``(data offset, nbytes, dtype)`` of floating tensors (deduplicated),
    ``tensor_data`` ``(offset, length)`` of the bytes that only hold tensor data (stored ``data/`` records,
    a safetensors data area): what a loader that builds the object tree over ``mmap`` does not read;
    ``nul_scans`` ``(start, length, min_run)``: ranges whose every NUL run of ``min_run`` bytes or more the file
    layer lists (a safetensors data area: :func:`ckptaudit.formats.safetensors_check._suspicious_zero_runs`)."""

    crc: List[Tuple[str, int, int]] = field(default_factory=list)
    values: List[Tuple[int, int, str]] = field(default_factory=list)
    tensor_data: List[Tuple[int, int]] = field(default_factory=list)
    nul_scans: List[Tuple[int, int, int]] = field(default_factory=list)


def plan_file(path, data: Optional[bytes] = None) -> Plan:
    """The plan of ``path`` (empty when its format is neither a readable torch zip nor safetensors); ``data``:
    the whole file's bytes when the caller holds them already (a small remote object), so nothing is read."""
    try:
        if data is not None:
            head = bytes(data[:16])
        elif fs.is_remote(path):
            with fs.open_binary(path, exact=True) as fh:
                head = fh.read(16)
        else:
            fd = os.open(fs.fspath(path), os.O_RDONLY)
            try:
                head = fs.pread(fd, 16, 0)
            finally:
                os.close(fd)
        if head[:4] == b"PK\x03\x04":
            return _plan_zip(path, data)
        if len(head) >= 9 and head[8:9] == b"{":
            return _plan_safetensors(path, struct.unpack("<Q", head[:8])[0], data)
    except Exception:  # noqa: BLE001 - planning is an optimisation: the stages read what is not planned
        pass
    return Plan()


def _mem_file(path, data: bytes):
    """A :class:`ckptaudit.formats.zip.reader._File` over bytes in memory (no reads, no prefetch)."""
    from ..formats.zip.reader import _File

    class _Mem(_File):
        def __init__(self) -> None:  # noqa: D401 - the parent's opens are not wanted
            self.path, self.size, self.fd, self.f = fs.fspath(path), len(data), -1, None
            self.window_bytes, self.prefetch_enabled = 0, False

        def pread(self, off: int, n: int) -> bytes:
            return bytes(data[off:off + n]) if 0 <= off < self.size and n > 0 else b""

        def close(self) -> None:
            pass

    return _Mem()


def _plan_zip(path, data: Optional[bytes]) -> Plan:
    from ..formats import torchzip
    from ..formats.zip.central import _find_central_directory, _header_problem, _parse_central, _prefetch_headers
    from ..formats.zip.reader import Member, _File

    plan = Plan()
    fh = _mem_file(path, data) if data is not None else _File(
        fs.fspath(path), window=torchzip.REMOTE_WINDOW_BYTES, prefetch=torchzip.REMOTE_PREFETCH)
    try:
        cd = _find_central_directory(fh)
        if not isinstance(cd, dict):
            return plan
        entries, _problem = _parse_central(fh, cd)
        _prefetch_headers(fh, entries, cd["cd_offset"])
        members = {}
        for e in entries:
            m = Member(name=e["name"], header_offset=e["lho"], data_offset=-1, size_bytes=e["usize"], crc32=e["crc"],
                       compressed_size_bytes=e["csize"], method=e["method"], flags=e["flags"])
            _header_problem(fh, e, m, cd["cd_offset"])
            members[m.name] = m
            if m.data_offset >= 0 and m.method == 0 and not (m.crc32 == 0 and m.size_bytes > 0):
                plan.crc.append((m.name, m.data_offset, m.compressed_size_bytes))
        first = entries[0]["name"] if entries else ""
        prefix = first.split("/", 1)[0] if "/" in first else ""
        plan.tensor_data = sorted((m.data_offset, m.compressed_size_bytes) for m in members.values()
                                  if m.data_offset >= 0 and m.method == 0
                                  and m.name.startswith(f"{prefix}/data/" if prefix else "data/"))
        pkl = members.get(f"{prefix}/data.pkl" if prefix else "data.pkl")
        if pkl is None or pkl.method != 0 or pkl.data_offset < 0 or pkl.size_bytes > torchzip.MAX_DATA_PKL_BYTES:
            return plan
        if data is None and fs.is_remote(path):  # one GET of exactly its bytes
            pkl_bytes = fs.read_ranges(path, [(pkl.data_offset, pkl.size_bytes)])[0] or b""
        else:
            pkl_bytes = fh.pread(pkl.data_offset, pkl.size_bytes)
    finally:
        fh.close()
    from ..pickle_walk import walk

    res = walk(pkl_bytes)
    seen = set()
    for _name, tm in res.tensors:
        m = members.get(f"{prefix}/data/{tm.storage.key}")
        if m is None or m.data_offset < 0 or tm.dtype not in FLOAT_DTYPES or not tm.nbytes:
            continue
        key = (m.data_offset + tm.storage_offset * tm.storage.itemsize, tm.nbytes, tm.dtype)
        if key not in seen:
            seen.add(key)
            plan.values.append(key)
    return plan


def skeleton_ranges(size: int, tensor_data: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """``(offset, length)`` of the bytes of a file of ``size`` bytes outside ``tensor_data`` (a plan's)."""
    out, at = [], 0
    for off, n in sorted(tensor_data):
        if off > at:
            out.append((at, off - at))
        at = max(at, off + n)
    if at < size:
        out.append((at, size - at))
    return out


def _plan_safetensors(path, hlen: int, data: Optional[bytes]) -> Plan:
    from ..formats.safetensors_check import valid_entries
    from ..layouts.scan_file import _ST_DTYPES

    plan = Plan()
    if hlen > MAX_HEADER_BYTES:
        return plan
    if data is not None:
        raw, size = bytes(data[8:8 + hlen]), len(data)
    else:
        with fs.open_binary(path, exact=True) as fh:
            fh.seek(8)
            raw = fh.read(hlen)
        size = fs.size(path) if fs.is_remote(path) else os.stat(fs.fspath(path)).st_size
    header = json.loads(raw)
    if not isinstance(header, dict):
        return plan
    if size > 8 + hlen:
        from ..formats.safetensors_check import MIN_ZERO_RUN_BYTES

        plan.tensor_data = [(8 + hlen, size - 8 - hlen)]
        plan.nul_scans = [(8 + hlen, size - 8 - hlen, MIN_ZERO_RUN_BYTES)]
    seen = set()
    for _name, info in valid_entries(header):
        a, b = info["data_offsets"]
        dtype = _ST_DTYPES.get(info.get("dtype"), str(info.get("dtype")).lower())
        key = (8 + hlen + a, b - a, dtype)
        if dtype in FLOAT_DTYPES and b > a and key not in seen:
            seen.add(key)
            plan.values.append(key)
    return plan
