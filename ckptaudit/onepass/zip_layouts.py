"""One parse per layout of zip in a hash job: a torch zip's records, shared by files whose structure bytes match.

A run's checkpoints of one model, saved by one ``torch.save`` call site, hold the same records at the same
offsets: their central directories, local headers and end records are equal byte for byte except for each
record's CRC-32 (and the data descriptor that repeats it).  The hash stage plans each torch zip's CRC ranges from
its records (:func:`.plan._records`: the central directory parsed and every local header checked, ~1 ms for issue
45's small unit of 72 records).  :class:`ZipLayouts` keeps the records of one parse per layout, and the byte
ranges that parse read (:class:`.plan._MemFile` logs them); a later file of the same size whose bytes in those
ranges are equal, outside the CRC fields, gets the same records with its own CRC-32s, read from its central
directory.

Why equal bytes give equal records: :func:`~ckptaudit.formats.zip.central.find_central_directory` and
:func:`.plan._records` are functions of the bytes they read and the file's size; a CRC field's value reaches the
records only as their ``crc`` column (taken from the file itself) and in two comparisons that cannot move a
record: the local header's CRC and sizes against the central directory's (a layout is kept only when every local
header states them as 0, as a writer that sets flag bit 3 does: torch's) and the data descriptor's CRC against
the central directory's (a finding of the scan stage, not a record's place).  And sound whatever the match says,
by the way a plan is used, as :mod:`.pickle_templates` explains: a plan names the byte ranges over which the pass
computes CRC-32s; the scan stage takes a CRC-32 only for a record whose own ``(offset, length)`` — from its own
parse of that file — finds one (:meth:`ckptaudit.onepass.facts.ByteFacts.crc_of`), and reads any other record.

Memory: at most :data:`ZipLayouts.HELD` layouts, each its records' columns and the bytes it compares (the
files' structure bytes, ~130 a record); only files held whole in memory (:data:`.filepass.SMALL_LOCAL_BYTES`).
"""

from __future__ import annotations

import dataclasses
import struct
import threading
from typing import List, Optional, Tuple

#: zip signatures and field offsets (PKWARE APPNOTE 4.3.7, 4.3.9, 4.3.12)
_CENTRAL_SIG, _DESCRIPTOR_SIG = b"PK\x01\x02", b"PK\x07\x08"
_CENTRAL_FIXED, _CENTRAL_CRC, _LOCAL_FIXED, _LOCAL_SIZES = 46, 16, 30, (14, 26)


#: the bytes a follower's archive folder may hold (torch names it after the file: its stem)
_FOLDER_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


@dataclasses.dataclass
class _Layout:
    size: int
    at: object  # numpy int64: the compared byte positions (read by the parse, outside the CRC fields and folder)
    want: bytes  # the layout's bytes at those positions
    crc_at: object  # numpy int64: each record's central-directory CRC field, in record order
    folder_at: object  # numpy int64 (names, folder length): the folder's bytes in every name, both directories
    folder: bytes  # the layout's archive folder
    records: object  # the parse's plan._Records


class ZipLayouts:
    """The zip layouts one hash job has parsed (thread-safe: a job's passes share it).  ``hits``: parses saved."""

    HELD = 4
    #: a layout compares at most this many bytes (a larger structure is parsed every time)
    MAX_COMPARED = 1 << 20

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: List[_Layout] = []
        self.hits = 0

    def records_of(self, data: bytes):
        """The records of the zip ``data`` (a whole file) from a layout it matches, with its own CRC-32s and
        archive folder; None when it matches none."""
        import numpy as np

        with self._lock:
            held = list(self._held)
        u = np.frombuffer(data, np.uint8)
        for t in held:
            if t.size != len(data) or u[t.at].tobytes() != t.want:
                continue
            names = u[t.folder_at]
            folder = names[0].tobytes()
            if not (names == names[0]).all() or not _FOLDER_BYTES.issuperset(folder):
                continue
            crc = np.array([struct.unpack_from("<I", data, o)[0] for o in t.crc_at.tolist()], np.int64)
            with self._lock:
                self.hits += 1
            return dataclasses.replace(t.records, crc=crc, **_renamed(t.records, t.folder, folder))
        return None
    def add(self, data: bytes, cd_offset: int, reads: List[Tuple[int, int]], records) -> None:
        """Keep the layout of ``data`` whose parse read ``reads`` (``(offset, length)`` pairs) and gave
        ``records`` (:class:`.plan._Records`; its central directory at ``cd_offset``), when every record is
        placed and every local header states CRC and sizes as 0; the CRC fields of its central directory and data
        descriptors are left out of the bytes compared."""
        import numpy as np

        n = len(data)
        if not len(records.data_offset) or (records.data_offset < 0).any():
            return
        fields = _crc_fields(data, cd_offset, records)
        folder = records.prefix.encode("utf-8", "surrogatepass")
        if fields is None or not folder or not _FOLDER_BYTES.issuperset(folder):
            return
        marks = np.zeros(n, np.bool_)
        for off, k in reads:
            marks[max(0, off):max(0, min(n, off + k))] = True
        for off in fields[0] + fields[1]:
            marks[off:off + 4] = False
        folder_at = np.array(fields[2], np.int64)[:, None] + np.arange(len(folder), dtype=np.int64)[None, :]
        if any(data[o:o + len(folder) + 1] != folder + b"/" for o in fields[2]):
            return
        marks[folder_at.ravel()] = False
        at = np.flatnonzero(marks)
        if len(at) > self.MAX_COMPARED:
            return
        with self._lock:
            self._held.insert(0, _Layout(n, at, np.frombuffer(data, np.uint8)[at].tobytes(),
                                         np.array(fields[0], np.int64), folder_at, folder, records))
            del self._held[self.HELD:]


def _crc_fields(data: bytes, cd_offset: int, records) -> Optional[Tuple[List[int], List[int], List[int]]]:
    """``(central-directory CRC fields, data-descriptor CRC fields, names)``: the offset of each CRC field of the
    central directory's entries from ``cd_offset`` (one per record, in record order), of the data descriptor
    after each record with flag bit 3, and of each record's name in the central directory and in its local
    header; None when an entry is not where the one before it ends, a local header offset is a ZIP64 one, or a
    local header states a CRC or size."""
    central, descriptors, names, at = [], [], [], cd_offset
    for off, size in zip(records.data_offset.tolist(), records.csize.tolist()):
        if at + _CENTRAL_FIXED > len(data) or data[at:at + 4] != _CENTRAL_SIG:
            return None
        flags = struct.unpack_from("<H", data, at + 8)[0]
        nlen, xlen, clen = struct.unpack_from("<HHH", data, at + 28)
        lho = struct.unpack_from("<I", data, at + 42)[0]
        if lho == 0xFFFFFFFF or data[lho + _LOCAL_SIZES[0]:lho + _LOCAL_SIZES[1]] != bytes(12):
            return None
        central.append(at + _CENTRAL_CRC)
        names += [at + _CENTRAL_FIXED, lho + _LOCAL_FIXED]
        if flags & 8:
            end = off + size
            descriptors.append(end + 4 if data[end:end + 4] == _DESCRIPTOR_SIG else end)
        at += _CENTRAL_FIXED + nlen + xlen + clen
    return central, descriptors, names


def _renamed(records, old: bytes, new: bytes) -> dict:
    """``names`` and ``prefix`` of ``records`` (whose every name begins with folder ``old`` and ``/``) with
    folder ``new`` (of the same length, bytes of :data:`_FOLDER_BYTES`) instead; nothing when they are equal."""
    if new == old:
        return {}
    import pyarrow.compute as pc

    text = new.decode("ascii")
    return {"names": pc.utf8_replace_slice(records.names, 0, len(old), text), "prefix": text}
