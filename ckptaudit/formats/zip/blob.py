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
    Reads: the end record (22 bytes, 20 more for a ZIP64 locator), the central directory, each local header."""
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
