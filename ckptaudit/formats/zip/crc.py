"""The torch zip's record data: the CRC32 of a member (stored or deflated), its longest NUL run, data.pkl's bytes.

:func:`ckptaudit.formats.torchzip._verify_member` builds the findings from what these return.
"""

from __future__ import annotations

import zlib
from typing import Optional, Tuple

from .crc32 import crc32
from .reader import Member, ArchiveFile


def member_crc(fh: ArchiveFile, m: Member, chunk: int, buf: bytearray) -> Optional[Tuple[int, Optional[int]]]:
    """``(crc, bytes)`` of record ``m``'s data (``bytes`` None: deflated data that does not inflate);
    None when it cannot be verified (CRC not recorded, or a method other than stored/deflated)."""
    if m.crc32 == 0 and m.size_bytes > 0:
        return None  # CRC not recorded (torch compute_crc32=False writes 0): cannot verify
    if m.method == 0:  # the hash stage's one pass computed it already, when it could plan this archive
        known = None if fh.facts is None else fh.facts.crc_of(fh.path, m.data_offset, m.compressed_size_bytes)
        return known if known is not None else fh.crc(m.data_offset, m.compressed_size_bytes, chunk, buf)
    if m.method == 8:
        return _crc_deflated(fh, m, chunk)
    return None


def _crc_deflated(fh: ArchiveFile, m: Member, chunk: int) -> Tuple[int, Optional[int]]:
    d = zlib.decompressobj(-15)
    crc, total, off, left = 0, 0, m.data_offset, m.compressed_size_bytes
    try:
        while left > 0:
            b = fh.pread(off, min(chunk, left))
            if not b:
                break
            off += len(b)
            left -= len(b)
            piece = d.decompress(b, chunk)
            while True:
                crc = crc32(piece, crc)
                total += len(piece)
                if not d.unconsumed_tail:
                    break
                piece = d.decompress(d.unconsumed_tail, chunk)
        piece = d.flush()
        crc = crc32(piece, crc)
        total += len(piece)
    except zlib.error:
        return 0, None
    return crc, total


def longest_zero_run(fh: ArchiveFile, off: int, n: int, chunk: int) -> Optional[Tuple[int, int]]:
    """``(offset, length)`` of the longest run of at least 64 NUL bytes in ``n`` bytes from ``off`` (None: none,
    or not looked for), asked only of a record whose CRC fails: the hash stage's pass answers for a remote
    object's records; a local file's record is read again (:mod:`ckptaudit.onepass.filepass` says why), unless
    the facts' read depth has no ``damage_detail`` (the reader: :data:`ckptaudit.fs.read_depth.CHECKED_DIGESTS_ONLY`),
    and then it is not looked for."""
    from ..sniff import zero_runs

    known, run = (False, None) if fh.facts is None else fh.facts.nul_run_of(fh.path, off, n)
    if known:
        return run
    if fh.facts is not None and not fh.facts.damage_detail:
        return None
    runs = zero_runs(fh.path, min_run=64, chunk=chunk, start=off, end=off + n, kept=fh.kept)
    return max(runs, key=lambda r: r[1]) if runs else None


def load_data_pkl(fh: ArchiveFile, rep, limit: int) -> None:
    """Put data.pkl's bytes on ``rep`` (a ``ZipReport``): ``data_pkl_any`` as far as they read, ``data_pkl``
    when the record is whole and intact; nothing for a record over ``limit`` bytes (``MAX_DATA_PKL_BYTES``)."""
    want = f"{rep.prefix}/data.pkl" if rep.prefix else "data.pkl"
    m = rep.members.find(want)
    start = -1 if m is None else m.data_offset if m.data_offset >= 0 else m.loose_data_offset
    if m is None or start < 0:
        return
    if m.size_bytes > limit or m.compressed_size_bytes > limit:
        return
    raw = fh.pread(start, m.compressed_size_bytes)
    whole = len(raw) == m.compressed_size_bytes
    if m.method == 8:
        try:
            d = zlib.decompressobj(-15)
            raw = d.decompress(raw, limit + 1)
        except zlib.error:
            return
        if len(raw) > limit:
            return
    elif m.method != 0:
        return
    rep.data_pkl_any = raw
    if whole and m.complete and m.data_offset >= 0 and m.crc_ok is not False:
        rep.data_pkl = raw
