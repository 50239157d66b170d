"""One parse per layout of zip in a job: a torch zip's records, shared by files whose structure bytes match.

A run's checkpoints of one model, saved by one ``torch.save`` call site, hold the same records at the same
offsets: their central directories, local headers, data descriptors and end records are equal byte for byte
except for each record's CRC-32 fields and the archive folder (torch names it after the file's stem).  A job
parses each torch zip's records: the hash stage to plan its CRC ranges (:func:`.plan._records`, ~1 ms for issue
45's small unit of 72 records), the scan to check them (:mod:`ckptaudit.formats.zip.same_layout`).
:class:`ZipLayouts` keeps what one parse per layout gave, and the byte ranges it read (the readers log them); a
later file of the same size whose bytes in those ranges are equal, outside the CRC fields and one archive folder
of the same length used in every name, matches it (:meth:`ZipLayouts.match`) and gets those records with its own
CRC-32s and folder.

Why equal bytes give the hash plan equal records (the scan adds conditions of its own,
:mod:`ckptaudit.formats.zip.same_layout`): :func:`~ckptaudit.formats.zip.central.find_central_directory` and
:func:`.plan._records` are functions of the bytes they read and the file's size; a CRC field's value reaches the
records only as their ``crc`` column (taken from the file itself) and in two comparisons that cannot move a
record: the local header's CRC and sizes against the central directory's (a layout is kept only when every local
header states them as 0, as a writer that sets flag bit 3 does: torch's) and the data descriptor's CRC against
the central directory's (a finding of the scan stage, not a record's place).  And sound whatever the match says,
by the way a plan is used, as :mod:`.pickle_templates` explains: a plan names the byte ranges over which the pass
computes CRC-32s; the scan stage takes a CRC-32 only for a record whose own ``(offset, length)`` — from its own
parse of that file — finds one (:meth:`ckptaudit.onepass.facts.ByteFacts.crc_of`), and reads any other record.

Memory: at most :data:`ZipLayouts.HELD` layouts, each its records' columns and the bytes it compares (the
files' structure bytes, ~130 a record); only files held whole in memory (:data:`.filepass.SMALL_LOCAL_BYTES`,
:data:`ckptaudit.formats.zip.reader.WHOLE_READ_BYTES`).
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import List, Optional, Tuple

from ..formats.zip.reader import CENTRAL_SIZE, LOCAL_SIZE, SIG_CENTRAL, SIG_DESCRIPTOR
from ..pickle_walk.templates import TemplateShelf

#: field offsets inside a central-directory entry and a local header (PKWARE APPNOTE 4.3.7, 4.3.12): the CRC-32,
#: and the local header's CRC and sizes; a data descriptor with its signature and 32-bit sizes (4.3.9), in bytes
_CENTRAL_CRC, _LOCAL_SIZES, _DESCRIPTOR_BYTES = 16, (14, 26), 16


#: the bytes a follower's archive folder may hold (torch names it after the file: its stem)
_FOLDER_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


@dataclasses.dataclass
class _Layout:
    size: int
    at: object  # numpy int64: the compared byte positions (read by the parse, outside the CRC fields and folder)
    want: bytes  # the layout's bytes at those positions
    crc_at: object  # numpy int64: each record's central-directory CRC field, in record order
    desc_rows: object  # numpy int64: the records with a data descriptor (flag bit 3) …
    desc_at: object  # numpy int64: … and the offset of that descriptor's CRC field
    folder_at: object  # numpy int64 (names, folder length): the folder's bytes in every name, both directories
    folder: bytes  # the layout's archive folder
    payload: object  # what the parse gave (the hash plan's records, the scan's checked records)


@dataclasses.dataclass(frozen=True)
class Match:
    """A file that matches a layout: ``payload`` (the layout's parse), the file's own central-directory CRC-32s
    (``crc``: numpy int64, in record order), its archive folder (``folder``; ``old_folder``: the layout's), and
    ``descriptors_agree``: whether each data descriptor states its record's central-directory CRC-32."""

    payload: object
    crc: object
    folder: bytes
    old_folder: bytes
    descriptors_agree: bool


class ZipLayouts(TemplateShelf):
    """The zip layouts one job has parsed (thread-safe: a job's threads share it), at most :attr:`HELD`, the most
    recent first.  ``hits``: parses saved; ``walks``: layouts kept."""

    HELD = 4
    #: a layout compares at most this many bytes (a larger structure is parsed every time)
    MAX_COMPARED = 1 << 20

    def match(self, data: bytes) -> Optional[Match]:
        """The layout the zip ``data`` (a whole file) matches, with its own CRC-32s and archive folder; None when
        it matches none.  A caller that takes its records counts it (:meth:`~ckptaudit.pickle_walk.templates.
        TemplateShelf.hit`)."""
        import numpy as np

        u = np.frombuffer(data, np.uint8)
        for t in self.held():
            if t.size != len(data) or u[t.at].tobytes() != t.want:
                continue
            names = u[t.folder_at]
            folder = names[0].tobytes()
            if not (names == names[0]).all() or not _FOLDER_BYTES.issuperset(folder):
                continue
            crc = _u32_at(data, t.crc_at)
            return Match(t.payload, crc, folder, t.folder,
                         bool((crc[t.desc_rows] == _u32_at(data, t.desc_at)).all()))
        return None

    def records_of(self, data: bytes):
        """The hash plan's records (:class:`.plan._Records`) of the zip ``data`` from a layout it matches, with its
        own CRC-32s and archive folder; None when it matches none."""
        got = self.match(data)
        if got is None:
            return None
        self.hit()
        return dataclasses.replace(got.payload, crc=got.crc, **_renamed(got.payload, got.old_folder, got.folder))

    def add(self, data: bytes, cd_offset: int, reads: List[Tuple[int, int]], data_offset, csize, folder: str,
            payload) -> None:
        """Keep the layout of zip ``data`` whose parse read ``reads`` (``(offset, length)`` pairs) and gave
        ``payload``: its central directory at ``cd_offset``, its records' data offsets and stored sizes
        ``data_offset`` and ``csize`` (numpy int64, in central-directory order) and archive folder ``folder``.
        Kept when every record is placed and every local header states CRC and sizes as 0 (:func:`_crc_fields`); the
        CRC fields of its central directory and data descriptors, and the folder in its names, are left out of the
        bytes compared, when each of those bytes was read exactly once."""
        import numpy as np

        n = len(data)
        if not len(data_offset) or (data_offset < 0).any():
            return
        fields = _crc_fields(data, cd_offset, data_offset, csize)
        name = folder.encode("utf-8", "surrogatepass")
        if fields is None or not name or not _FOLDER_BYTES.issuperset(name):
            return
        central, desc_rows, desc_at, names = fields
        folder_at = np.array(names, np.int64)[:, None] + np.arange(len(name), dtype=np.int64)[None, :]
        if any(data[o:o + len(name) + 1] != name + b"/" for o in names):
            return
        left_out = np.concatenate([(np.array(central + desc_at, np.int64)[:, None] + np.arange(4)).ravel(),
                                   folder_at.ravel()])
        reads_of = np.zeros(n + 1, np.int64)  # how many reads covered each byte (a running sum of their ends)
        for off, k in reads:
            a, b = max(0, off), max(0, min(n, off + k))
            if b > a:
                reads_of[a] += 1
                reads_of[b] -= 1
        reads_of = np.cumsum(reads_of[:n])
        # a byte left out is read once, by the parse that reads it as a CRC or a name: a second read (the end
        # records' zip64 locator and record, a window over the whole tail) could take it for something else
        if (reads_of[left_out] != 1).any():
            return
        marks = reads_of > 0
        marks[left_out] = False
        at = np.flatnonzero(marks)
        if len(at) > self.MAX_COMPARED:
            return
        i64 = functools.partial(np.array, dtype=np.int64)
        self.walked(_Layout(n, at, np.frombuffer(data, np.uint8)[at].tobytes(), i64(central), i64(desc_rows),
                            i64(desc_at), folder_at, name, payload))


def _u32_at(data: bytes, at) -> "np.ndarray":  # noqa: F821 - numpy is imported inside, when called
    """The little-endian unsigned 32-bit numbers of ``data`` at offsets ``at`` (numpy int64), as int64."""
    import numpy as np

    u = np.frombuffer(data, np.uint8)
    idx = at[:, None] + np.arange(4, dtype=np.int64)[None, :]
    return np.ascontiguousarray(u[idx]).view("<u4").reshape(-1).astype(np.int64)


def _crc_fields(data: bytes, cd_offset: int, data_offset, csize):
    """``(central-directory CRC fields, records with a data descriptor, their descriptors' CRC fields, names)``:
    the offset of each CRC field of the central directory's entries from ``cd_offset`` (one per record, in record
    order), the records with flag bit 3 and the offset of the CRC field of the data descriptor after each, and the
    offset of each record's name in the central directory and in its local header.

    None (no layout) unless every structure a CRC field could be read as is where a writer puts it, apart from the
    others: an entry where the one before it ends, a 32-bit local header offset, a local header stating CRC and
    sizes as 0, each data descriptor (flag bit 3) with its signature (APPNOTE 4.3.9.3: optional; without it the
    CRC's 4 bytes are the place a reader looks for one) right after its record's data, and the local headers,
    records' data and descriptors not overlapping one another nor the central directory.  So a CRC field left out
    of the bytes compared is read as nothing but that CRC: by the central directory's entry, or by
    :func:`~ckptaudit.formats.zip.central.read_descriptor` (whose 24-byte read past a 16-byte descriptor
    reaches only bytes compared)."""
    central, desc_rows, desc_at, names, spans, at = [], [], [], [], [], cd_offset
    for row, (off, size) in enumerate(zip(data_offset.tolist(), csize.tolist())):
        if at + CENTRAL_SIZE > len(data) or data[at:at + 4] != SIG_CENTRAL:
            return None
        flags = struct.unpack_from("<H", data, at + 8)[0]
        nlen, xlen, clen = struct.unpack_from("<HHH", data, at + 28)
        lho = struct.unpack_from("<I", data, at + 42)[0]
        if lho == 0xFFFFFFFF or lho + LOCAL_SIZE > len(data) or \
                data[lho + _LOCAL_SIZES[0]:lho + _LOCAL_SIZES[1]] != bytes(12):
            return None
        central.append(at + _CENTRAL_CRC)
        names += [at + CENTRAL_SIZE, lho + LOCAL_SIZE]
        spans += [(lho, lho + LOCAL_SIZE + sum(struct.unpack_from("<HH", data, lho + 26))), (off, off + size)]
        if flags & 8:
            end = off + size
            if data[end:end + 4] != SIG_DESCRIPTOR:
                return None
            desc_rows.append(row)
            desc_at.append(end + 4)
            spans.append((end, end + _DESCRIPTOR_BYTES))
        at += CENTRAL_SIZE + nlen + xlen + clen
    spans.sort()
    if any(b > a for (_, b), (a, _) in zip(spans, spans[1:])) or (spans and spans[-1][1] > cd_offset):
        return None
    return central, desc_rows, desc_at, names


def _renamed(records, old: bytes, new: bytes) -> dict:
    """``names`` and ``prefix`` of ``records`` (whose every name begins with folder ``old`` and ``/``) with
    folder ``new`` (of the same length, bytes of :data:`_FOLDER_BYTES`) instead; nothing when they are equal."""
    if new == old:
        return {}
    import pyarrow.compute as pc

    text = new.decode("ascii")
    return {"names": pc.utf8_replace_slice(records.names, 0, len(old), text), "prefix": text, "_by_name": None}
