"""Zips embedded at a byte range of a larger file: the stored records of each, found with small reads.

A torch.distributed.checkpoint data file (``__<rank>_<n>.distcp``) is, with the default
``SerializationFormat.TORCH_SAVE``, the ``torch.save`` zips of its items back to back (torch
``distributed/checkpoint/filesystem.py``, ``_write_item``: ``torch.save(tensor, stream)`` at the stream's
position; a non-tensor item is a ``torch.save`` into a ``BytesIO`` written as is).  ``torch.save``'s writer
(c10 ``PyTorchStreamWriter``) counts offsets from where it began, so each blob's central directory and local
header offsets are relative to the blob's first byte, and the blob ends with its end record (no comment).
:func:`blob_records` reads one blob's end record, central directory and local headers through
:class:`BlobView` (the file layer's own parser, :mod:`.central`, with offsets shifted by the blob's start).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Optional

from .central import find_central_directory, header_problem, iter_central
from .reader import Member


class BlobView:
    """``length`` bytes of ``parent`` (an :class:`~.reader.ArchiveFile`, or anything with ``pread(off, n)`` and
    ``path``) from byte ``base``, as an archive of its own: ``pread`` offsets are relative to ``base`` and never
    reach outside ``[base, base + length)``."""

    def __init__(self, parent, base: int, length: int) -> None:
        self.parent, self.base, self.size = parent, base, length
        self.path = parent.path
        self.fd = getattr(parent, "fd", None)
        self.facts, self.window_bytes, self.prefetch_enabled = None, 0, False
        self.kept = getattr(parent, "kept", None)  # reads go through the parent, which has its kept bytes

    def pread(self, off: int, n: int) -> bytes:
        if off < 0 or n <= 0 or off >= self.size:
            return b""
        return self.parent.pread(self.base + off, min(n, self.size - off))

    def close(self) -> None:
        pass


@dataclass
class BlobRecords:
    """The stored (method 0) records of one blob whose local header agrees with the central directory, as
    columns: ``names`` (list of str), ``data_offset`` (absolute offsets in the parent file, bytes), ``length``
    (bytes) and ``crc`` (the CRC-32 the central directory records; 0 with data means none was recorded:
    torch's ``compute_crc32=False``)."""

    names: list
    data_offset: array
    length: array
    crc: array

    def __len__(self) -> int:
        return len(self.names)


def blob_records(fh, base: int, length: int) -> Optional[BlobRecords]:
    """The stored records of the zip at ``[base, base + length)`` of ``fh`` (see :class:`BlobView`), or None
    when those bytes are no consistent zip (no end record at the blob's end, a central directory that does not
    end where it begins: a blob written in another format, or a damaged one).  Records whose local header
    disagrees with their entry, or that are compressed, are left out (nothing to compare a CRC over).
    Reads: the blob's first and last :data:`EDGE_BYTES` (:func:`_plain_records`, the shape torch.save writes),
    else the end record, the central directory and each local header through the file layer's parser."""
    fast = _plain_records(fh, base, length)
    if fast is not None:
        return fast
    view = BlobView(fh, base, length)
    cd = find_central_directory(view, first_tail=0)
    if not isinstance(cd, dict):
        return None
    out = BlobRecords(names=[], data_offset=array("q"), length=array("q"), crc=array("q"))
    m = Member(name="", header_offset=0, data_offset=-1, size_bytes=0, crc32=0)
    problem: list = []
    for e in iter_central(view, cd, problem):
        m.data_offset = -1
        header_problem(view, e, m, cd["cd_offset"])
        if m.data_offset < 0 or e["method"] != 0 or e["csize"] != e["usize"]:
            continue
        out.names.append(e["name"])
        out.data_offset.append(base + m.data_offset)
        out.length.append(e["csize"])
        out.crc.append(e["crc"])
    return out


_CD = struct.Struct("<4sHHHHHHIIIHHHHHII")  # a central-directory entry's 46 fixed bytes (APPNOTE 4.3.12)
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # a local header's 30 fixed bytes (APPNOTE 4.3.7)
_FULL = 0xFFFFFFFF
_ENDS = 22 + 20 + 56  # the end record, the ZIP64 locator and the ZIP64 end record before it


def _plain_records(fh, base: int, length: int) -> Optional[BlobRecords]:
    """:func:`blob_records` of a blob as ``torch.save`` writes it, reading only its end records, its central
    directory and each local header (no tensor byte), without the general parser's per-field diagnosis: an end
    record with no comment and no saturated field, a central directory that ends where the end records begin,
    entries without ZIP64 sizes, local headers that agree with their entries in name, method, version, flags,
    time and date, and data that ends before the central directory.  None for anything else: the caller then
    takes the general parser, which says what is wrong (c10 ``PyTorchStreamWriter`` writes the ZIP64 end
    record and locator too; their values equal the plain record's while nothing exceeds 32 bits)."""
    if length < 22:
        return None
    k = min(length, _ENDS)
    tail = fh.pread(base + length - k, k)
    if len(tail) != k:
        return None
    sig, disk, cd_disk, n_here, n, cd_size, cd_off, comment = struct.unpack_from("<4sHHHHIIH", tail, k - 22)
    if sig != b"PK\x05\x06" or comment or disk or cd_disk or n != n_here or n == 0xFFFF or \
            _FULL in (cd_size, cd_off) or cd_off + cd_size not in (length - 22, length - _ENDS):
        return None
    cd = fh.pread(base + cd_off, cd_size)
    if len(cd) != cd_size:
        return None
    out = BlobRecords(names=[], data_offset=array("q"), length=array("q"), crc=array("q"))
    at = 0
    for _ in range(n):
        if at + 46 > cd_size:
            return None
        (csig, _made, need, flags, method, tm, dt, crc, csize, usize, nlen, xlen, clen, _d, _ia, _ea,
         lho) = _CD.unpack_from(cd, at)
        name = cd[at + 46:at + 46 + nlen]
        at += 46 + nlen + xlen + clen
        if csig != b"PK\x01\x02" or _FULL in (csize, usize, lho) or lho + 30 > cd_off:
            return None
        lh = fh.pread(base + lho, 30)
        if len(lh) != 30:
            return None
        (lsig, lneed, lflags, lmethod, ltm, ldt, _lc, _ls, _lu, lnlen, lxlen) = _LOCAL.unpack(lh)
        data = lho + 30 + lnlen + lxlen
        if lsig != b"PK\x03\x04" or (lneed, lflags, lmethod, ltm, ldt) != (need, flags, method, tm, dt) or \
                data + csize > cd_off or fh.pread(base + lho + 30, lnlen) != name:
            return None
        if method != 0 or csize != usize:
            continue
        out.names.append(name.decode("utf-8", "replace"))
        out.data_offset.append(base + data)
        out.length.append(csize)
        out.crc.append(crc)
    return out if at == cd_size else None
