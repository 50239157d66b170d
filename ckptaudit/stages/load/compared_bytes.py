"""The bytes of a file that :mod:`.equivalent` compares: read where asked and counted, and a zip's stored records.

A template compares a file everywhere but its tensor data (:mod:`.equivalent`): :class:`Reader` reads those
regions of another file (a small file once, whole), :func:`stored_records` finds a zip's records and the places
of their CRC-32 fields and names, and :func:`outside` / :class:`JoinedOffsets` turn the tensor data's spans into
the regions compared and map file offsets into their joined bytes.  Record layout: PKWARE APPNOTE 4.3.7 (local
header), 4.3.9 (data descriptor), 4.3.12 (central directory header), 4.3.16 (end of central directory).
"""

from __future__ import annotations

import io
import os
import struct
from typing import List, Optional, Tuple

from ...formats.zip.reader import (EOCD_SIZE, SIG_CENTRAL, SIG_DESCRIPTOR, SIG_EOCD, SIG_LOCAL, SIG_ZIP64_EOCD,
                                   SIG_ZIP64_LOCATOR, ArchiveFile)


def file_size(path: str) -> int:
    """The size of the file at ``path`` in bytes, -1 when it cannot be stat'ed."""
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


class Reader:
    """Bytes of one local file at given offsets, through :class:`ckptaudit.formats.zip.reader.ArchiveFile` (counted
    as the audit's reads; a file of up to ``WHOLE_READ_BYTES`` read once, whole), or of bytes in memory
    (:meth:`of`).  ``size``: the file's size in bytes (-1 when it cannot be opened)."""

    def __init__(self, path: Optional[str], data: Optional[bytes] = None) -> None:
        self._data, self._file = data, None
        if data is None:
            try:
                self._file = ArchiveFile(path or "", window=0, prefetch=False, whole=True)
            except OSError:
                pass
        self.size = len(data) if data is not None else self._file.size if self._file is not None else -1

    @classmethod
    def of(cls, data: bytes) -> "Reader":
        return cls(None, data)

    def read(self, off: int, n: int) -> bytes:
        """``n`` bytes from ``off`` (fewer at the end of the file; b"" when it cannot be read)."""
        if self._data is not None:
            return self._data[max(0, off):max(0, off + n)]
        try:
            return self._file.pread(off, n) if self._file is not None else b""
        except OSError:
            return b""

    def spans(self, regions) -> Optional[bytes]:
        """The bytes at ``regions`` (rows ``(start, end)``), joined; None when one is cut short."""
        out = [self.read(int(a), int(b - a)) for a, b in regions]
        return b"".join(out) if all(len(x) == b - a for x, (a, b) in zip(out, regions)) else None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def outside(spans: List[Tuple[int, int]], size: int):
    """Rows ``(start, end)`` of ``[0, size)`` outside ``spans`` (sorted, disjoint), as a numpy int64 array."""
    import numpy as np

    out, at = [], 0
    for a, b in spans:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < size:
        out.append((at, size))
    return np.array(out, dtype=np.int64).reshape(-1, 2)


class JoinedOffsets:
    """Where a file offset inside one of ``regions`` lands in their joined bytes."""

    def __init__(self, regions) -> None:
        import numpy as np

        self.starts = regions[:, 0]
        self.before = np.concatenate([[0], np.cumsum(regions[:, 1] - regions[:, 0])[:-1]])

    def __call__(self, off: int) -> int:
        import numpy as np

        i = int(np.searchsorted(self.starts, off, side="right")) - 1
        return int(self.before[i]) + off - int(self.starts[i])


def stored_records(reader: "Reader") -> Optional[List[Tuple[str, Tuple[int, ...], int, int, Tuple[int, int]]]]:
    """``(name, offsets of its CRC-32 fields, payload start, payload end, offsets of its name in the central
    directory and the local header)`` of each record of the zip ``reader`` reads, in archive order; None unless
    every record is stored, no two names are equal ignoring case (a reader finds one of them), the local headers
    agree with the central directory on the name, and the records follow one another without overlap up to the
    central directory."""
    import zipfile

    try:
        zf = zipfile.ZipFile(_File(reader))
        infos = zf.infolist()
        cd = zf.start_dir
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error):
        return None
    if not infos or len({i.filename.casefold() for i in infos}) != len(infos) or not _one_reading(reader, cd, infos):
        return None
    central = reader.read(cd, reader.size - cd)
    out = []
    at = 0
    for info in infos:  # central directory entries, in their order (4.3.12: fixed 46 bytes, then n, m, k)
        if central[at:at + 4] != SIG_CENTRAL or info.compress_type != 0 or info.compress_size != info.file_size:
            return None
        n, m, k = struct.unpack_from("<HHH", central, at + 28)
        lho = info.header_offset
        local = reader.read(lho, 30 + n)
        if local[:4] != SIG_LOCAL:
            return None
        ln, lm = struct.unpack_from("<HH", local, 26)
        start = lho + 30 + ln + lm
        if local[30:30 + ln] != central[at + 46:at + 46 + n]:
            return None
        crcs = [cd + at + 16, lho + 14]
        end = start + info.compress_size
        if info.flag_bits & 0x8:  # a data descriptor follows the payload, with or without its signature
            crcs.append(end + 4 if reader.read(end, 4) == SIG_DESCRIPTOR else end)
        out.append((info.filename, tuple(crcs), start, end, (cd + at + 46, lho + 30)))
        at += 46 + n + m + k
    order = sorted(range(len(out)), key=lambda i: infos[i].header_offset)
    limit = [infos[i].header_offset for i in order[1:]] + [cd]
    for i, nxt in zip(order, limit):  # each record (and its descriptor's CRC) ends before the next one starts
        if max([out[i][3]] + [c + 4 for c in out[i][1][1:]]) > nxt:
            return None
    return out


def _one_reading(reader: "Reader", start_dir: int, infos: list) -> bool:
    """Whether every zip reader finds the central directory where Python's :mod:`zipfile` did (``start_dir``): an
    end record without comment closes the file and states that offset (no bytes before the archive, which zipfile
    allows for and miniz does not), a ZIP64 end record, if any, lies right before its locator and states the same
    offset, size and count, and the directory ends where the end records begin (APPNOTE 4.3.14-4.3.16)."""
    size = reader.size
    end = reader.read(size - EOCD_SIZE, EOCD_SIZE)
    if len(end) != EOCD_SIZE or end[:4] != SIG_EOCD:
        return False
    _d, _cd, _n_here, n, cd_size, cd_off, comment = struct.unpack_from("<HHHHIIH", end, 4)
    stop = size - EOCD_SIZE
    loc = reader.read(size - 42, 20) if size >= 42 else b""
    if loc[:4] == SIG_ZIP64_LOCATOR:
        rec_at = struct.unpack_from("<Q", loc, 8)[0]
        rec = reader.read(rec_at, 56)
        if len(rec) != 56 or rec[:4] != SIG_ZIP64_EOCD or rec_at + 56 != size - 42 or \
                struct.unpack_from("<Q", rec, 4)[0] != 44:
            return False
        n64, size64, off64 = struct.unpack_from("<QQQ", rec, 32)
        if (n != 0xFFFF and n != n64) or (cd_size != 0xFFFFFFFF and cd_size != size64) or \
                (cd_off != 0xFFFFFFFF and cd_off != off64):
            return False
        n, cd_size, cd_off, stop = n64, size64, off64, rec_at
    return comment == 0 and cd_off == start_dir and cd_off + cd_size == stop and n == len(infos)


class _File(io.RawIOBase):
    """A read-only file over a :class:`Reader`, for :class:`zipfile.ZipFile` (which reads the end records and the
    central directory)."""

    def __init__(self, reader: "Reader") -> None:
        super().__init__()
        self._r, self._at = reader, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, off: int, whence: int = 0) -> int:
        self._at = off if whence == 0 else self._at + off if whence == 1 else self._r.size + off
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, b) -> int:
        data = self._r.read(self._at, len(b))
        b[:len(data)] = data
        self._at += len(data)
        return len(data)
