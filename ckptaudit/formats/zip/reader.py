"""The torch zip's records as bytes: signatures and sizes, one record (Member), positional reads (ArchiveFile).

Field helpers shared by the central-directory and local-header walks live here too (``hex32``,
``strip_prefix``, ``zip64_extra``).  The structures are described in :mod:`ckptaudit.formats.torchzip`.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ... import fs
from .crc32 import crc32

SIG_LOCAL = b"PK\x03\x04"
SIG_CENTRAL = b"PK\x01\x02"
SIG_EOCD = b"PK\x05\x06"
SIG_ZIP64_EOCD = b"PK\x06\x06"
SIG_ZIP64_LOCATOR = b"PK\x06\x07"
SIG_DESCRIPTOR = b"PK\x07\x08"
#: Fixed sizes (bytes) of the end-of-central-directory record, a local header and a central-directory entry
#: (PKWARE APPNOTE 4.3.16, 4.3.7, 4.3.12).
EOCD_SIZE = 22
LOCAL_SIZE = 30
CENTRAL_SIZE = 46
#: A local archive of at most this many bytes opened with ``whole=True`` is read in one ``pread`` (see
#: :class:`ArchiveFile`).
WHOLE_READ_BYTES = 1 << 20


@dataclass(slots=True)
class Member:
    """One zip record.  Offsets and sizes in bytes; ``size_bytes`` is the
    uncompressed size.  ``crc_ok`` is None when not verified (``verify_crc``
    off, CRC not recorded, unknown method, or the header is damaged)."""

    name: str
    header_offset: int
    data_offset: int
    size_bytes: int
    crc32: int
    crc_ok: Optional[bool] = None
    compressed_size_bytes: int = 0
    method: int = 0
    flags: int = 0
    header_ok: bool = True
    complete: bool = True
    crc_actual: Optional[int] = None
    loose_data_offset: int = -1  # data start per the local header alone, even when it disagrees


class ArchiveFile:
    """Positional reads on one open file (``os.pread``: no shared seek state).

    A remote object (``s3://…``, see :mod:`ckptaudit.fs`) is read with ranged GETs
    (seek + read on an fsspec file); the central directory, local headers and
    data.pkl cost a few small GETs, while CRC verification streams every member
    (as hashing does: each streams the object once).

    ``window`` is the least bytes one small remote read fetches (``torchzip.REMOTE_WINDOW_BYTES``)
    and ``prefetch`` whether :meth:`prefetch` batches ranged GETs (``torchzip.REMOTE_PREFETCH``);
    the caller reads both when it opens the file.  ``facts``: the hash stage's
    (:class:`ckptaudit.onepass.facts.ByteFacts`) for this file's records, or None.  ``kept``: bytes of the
    remote object already read (:class:`ckptaudit.fs.kept.KeptBytes`, or None), which every read of this
    file answers from first, for its life.  ``whole``: a local file of at most :data:`WHOLE_READ_BYTES` is read
    at once and every read answered from those bytes: a check that visits every record's local header pays one
    ``pread`` instead of two or three a record (issue 45: a small ``torch.save`` file of 72 records cost ~226
    ``pread`` calls, ~0.3 ms of its 6 ms scan).
    """

    def __init__(self, path: str, *, window: int, prefetch: bool, facts=None, kept=None, whole: bool = False) -> None:
        self.path = path
        self.facts = facts
        self.kept = kept
        self.window_bytes = window
        self.prefetch_enabled = prefetch
        if fs.is_remote(path):
            self.f = fs.open_binary(path, exact=True, kept=kept)
            self.fd = None
            self.size = fs.size(path)
        else:
            self.f = fs.CountedFile(path)  # every byte read is counted (fs.local_bytes_read)
            self.fd = self.f.fileno()
            self.size = os.fstat(self.fd).st_size
            if whole and 0 < self.size <= WHOLE_READ_BYTES:
                self._last = (0, fs.pread(self.fd, self.size, 0))  # what _local_read answers from

    def prefetch(self, ranges: List[Tuple[int, int]]) -> None:
        """Remote only (a no-op locally): fetch these ``(offset, length)`` ranges now, all
        at once (:func:`ckptaudit.fs.read_ranges`), for the :meth:`pread` calls that follow
        (the local header of every member, whose offsets the central directory gives)."""
        if self.fd is not None or not ranges or not self.prefetch_enabled:
            return
        ranges = sorted({(o, min(n, self.size - o)) for o, n in ranges if 0 <= o < self.size and n > 0})
        blobs = fs.read_ranges(self.path, ranges, kept=self.kept)
        self._pre = sorted(getattr(self, "_pre", []) + [(o, b) for (o, _), b in zip(ranges, blobs) if b],
                           key=lambda t: t[0])
        self._pre_starts = [o for o, _ in self._pre]

    def _prefetched(self, off: int, n: int) -> Optional[bytes]:
        pre = getattr(self, "_pre", None)
        if not pre:
            return None
        i = bisect.bisect_right(self._pre_starts, off) - 1
        if i >= 0:
            o, b = pre[i]
            if off + n <= o + len(b):
                return b[off - o: off - o + n]
        return None

    #: a list while a caller logs the reads: each :meth:`pread`'s ``(offset, length)`` is appended
    reads: Optional[List[Tuple[int, int]]] = None

    def whole_bytes(self) -> Optional[bytes]:
        """The whole local file, when it was read at once (``whole``), else None."""
        b0, blk = getattr(self, "_last", (0, b""))
        return blk if self.fd is not None and b0 == 0 and len(blk) == self.size > 0 else None

    def pread(self, off: int, n: int) -> bytes:
        """``n`` bytes of the archive from byte ``off`` (fewer at its end; ``b""`` outside it)."""
        if self.reads is not None:
            self.reads.append((off, n))
        if off < 0 or n <= 0 or off >= self.size:
            return b""
        n = min(n, self.size - off)
        if self.fd is None and (hit := self._prefetched(off, n)) is not None:
            return hit
        return self._remote_read(off, n) if self.fd is None else self._local_read(off, n)

    def _remote_read(self, off: int, n: int) -> bytes:
        """Large reads (the record walk of a damaged archive, which may pass over the same bytes again)
        go through an LRU of 1 MiB blocks (at most 32 MiB held).  A small read fetches at least ``window``
        bytes and keeps them: a local header with its name/extra is one GET, and the headers of the small
        members that follow it (torch aligns members to 64 bytes) come with it."""
        if n >= (64 << 10):
            if getattr(self, "_blocks", None) is None:
                self._blocks = fs.open_binary(self.path, block_size=1 << 20, cache_type="blockcache", kept=self.kept)
            self._blocks.seek(off)
            return self._blocks.read(n)
        w0, win = getattr(self, "_win", (0, b""))
        if not (w0 <= off and off + n <= w0 + len(win)):
            self.f.seek(off)
            w0, win = off, self.f.read(max(n, self.window_bytes))
            self._win = (w0, win)
        return win[off - w0: off - w0 + n]

    def _local_read(self, off: int, n: int) -> bytes:
        """The last large read is kept, so a walk that reads a chunk past a record's end (the descriptor
        search of a cut archive) finds the next header and data there, not on disk again."""
        b0, blk = getattr(self, "_last", (0, b""))
        out = blk[off - b0: off - b0 + n] if b0 <= off < b0 + len(blk) else b""
        if len(out) == n:
            return out
        start = off + len(out)
        got = fs.pread(self.fd, n - len(out), start)
        while len(out) + len(got) < n:  # pread may return short on some filesystems
            more = fs.pread(self.fd, n - len(out) - len(got), start + len(got))
            if not more:
                break
            got += more
        if len(got) >= (64 << 10):
            self._last = (start, got)
        return out + got if out else got

    def crc(self, off: int, n: int, chunk: int, buf: bytearray) -> Tuple[int, int]:
        """CRC32 of ``n`` bytes from ``off`` (streamed); returns ``(crc, bytes_read)``."""
        crc = 0
        done = 0
        view = memoryview(buf)
        f = self.f
        b0, blk = getattr(self, "_last", (0, b""))
        if self.fd is not None and b0 <= off < b0 + len(blk):  # the bytes a record walk already read
            part = memoryview(blk)[off - b0: off - b0 + n]
            crc, done = crc32(part, 0), len(part)
        if self.fd is None:  # remote: stream with large ranged GETs, not the small readahead
            if getattr(self, "_stream", None) is None:
                self._stream = fs.open_binary(self.path, block_size=fs.STREAM_BLOCK_BYTES, kept=self.kept)
            f = self._stream
        f.seek(off + done)
        k = 0
        while done < n:
            k = f.readinto(view[: min(len(buf), n - done)])
            if not k:
                break
            crc = crc32(view[:k], crc)
            done += k
        if self.fd is not None and k >= (64 << 10):  # the last piece stays at hand, as _local_read keeps it
            self._last = (off + done - k, bytes(view[:k]))
        return crc, done

    def close(self) -> None:
        self.f.close()
        for extra in (getattr(self, "_stream", None), getattr(self, "_blocks", None)):
            if extra is not None:
                extra.close()


def hex32(v: Optional[int]) -> str:
    """A CRC-32 as eight hex digits ("?" when unknown), as the findings print it."""
    return "?" if v is None else f"{v:08x}"


def strip_prefix(name: str, prefix: str) -> str:
    """A record name without the archive's top folder ``prefix`` (torch writes ``<prefix>/data.pkl`` ...)."""
    return name[len(prefix) + 1:] if prefix and name.startswith(prefix + "/") else name


def zip64_extra(extra: bytes, want: List[str], vals: Dict[str, int]) -> None:
    """Fill ``vals`` from a ZIP64 extra field (id 0x0001) for the fields in ``want``, in order."""
    i = 0
    while i + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4: i + 4 + hlen]
        if hid == 0x0001:
            j = 0
            for k in want:
                if j + 8 <= len(body):
                    vals[k] = struct.unpack_from("<Q", body, j)[0]
                    j += 8
            return
        i += 4 + hlen
