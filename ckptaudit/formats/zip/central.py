"""The torch zip's central directory: find and parse the end records and entries, check local headers against them.

:func:`ckptaudit.formats.torchzip._check_with_cd` walks the entries; what these functions say is wrong
(a reason string, or None) becomes a finding through the builders at the end of this module, the one
place each of ``zip_central_directory_corrupted``, ``zip_member_header_corrupted`` and
``zip_missing_record`` is made.
"""

from __future__ import annotations

import struct
from typing import Iterator, List, Optional, Sequence, Tuple

from ... import findings
from ...findings import Finding
from .reader import (CENTRAL_SIZE, EOCD_SIZE, LOCAL_SIZE, SIG_CENTRAL, SIG_DESCRIPTOR, SIG_EOCD, SIG_LOCAL,
                     SIG_ZIP64_EOCD, SIG_ZIP64_LOCATOR, Member, ArchiveFile, hex32, zip64_extra)
from .records import Records


def find_central_directory(fh: ArchiveFile, first_tail: Optional[int] = None):
    """Locate and parse the end records.

    Returns a dict ``{cd_offset, cd_size, n_entries, end_offset, eocd_offset}``
    when a consistent EOCD (and ZIP64 end record where needed) is found;
    otherwise a string saying what is wrong with an EOCD that was found but is
    inconsistent, or None when there is no EOCD signature at all.  ``first_tail``:
    bytes before the end record's fixed part read in the first look (default
    :data:`_FIRST_TAIL_BYTES`; 0: the record alone, for a zip known to end with
    it, as each blob of a DCP data file does).
    """
    size = fh.size
    if size < EOCD_SIZE:
        return None
    first_tail = _FIRST_TAIL_BYTES if first_tail is None else first_tail
    # The end record sits in the last 22 + 65,535 bytes (its comment is at most 65,535 bytes; APPNOTE 4.3.16).
    # torch.save writes no comment, so the last 4 KiB are read first: the search runs from the end backwards,
    # so a consistent record found there is the one the whole window would give.  Only without one is the
    # whole window read (on a remote object those are the tail bytes of the last tensor's record).
    if size > EOCD_SIZE + first_tail:
        found = _search_end_records(fh, size, EOCD_SIZE + first_tail)
        if isinstance(found, dict):
            return found
    return _search_end_records(fh, size, min(size, EOCD_SIZE + 0xFFFF))


#: Bytes before the end record's fixed part read in the first look for it.
_FIRST_TAIL_BYTES = 4096
#: ``first_tail`` of a caller that compares the bytes its parse read with another file's
#: (:mod:`ckptaudit.onepass.zip_layouts`): the end record's own 22 bytes are looked at first, not a small file's
#: tensor data.  The same record results: the search runs from the end backwards in either window, and a
#: candidate's consistency does not depend on the window.
END_RECORD_ALONE = 0


def _search_end_records(fh: ArchiveFile, size: int, tail_len: int):
    """:func:`find_central_directory` over the last ``tail_len`` bytes."""
    tail_off = size - tail_len
    tail = fh.pread(tail_off, tail_len)
    problem = None
    i = tail.rfind(SIG_EOCD)
    while i >= 0:
        if i + EOCD_SIZE <= len(tail):
            (_sig, disk, cd_disk, n_disk, n_total, cd_size, cd_off, clen) = struct.unpack_from(
                "<4sHHHHIIH", tail, i)
            eocd = tail_off + i
            if eocd + EOCD_SIZE + clen <= size:
                res = {"cd_offset": cd_off, "cd_size": cd_size, "n_entries": n_total,
                       "end_offset": eocd, "eocd_offset": eocd}
                needs64 = cd_off == 0xFFFFFFFF or cd_size == 0xFFFFFFFF or n_total == 0xFFFF
                loc = fh.pread(eocd - 20, 20) if eocd >= 20 else b""
                if loc[:4] == SIG_ZIP64_LOCATOR:
                    _s, _d, z64_off, _nd = struct.unpack("<4sIQI", loc)
                    rec = fh.pread(z64_off, 56)
                    if len(rec) == 56 and rec[:4] == SIG_ZIP64_EOCD:
                        (_s, _rsize, _vm, _vn, _d1, _d2, _n1, n64, size64, off64) = struct.unpack(
                            "<4sQHHIIQQQQ", rec)
                        res.update(cd_offset=off64, cd_size=size64, n_entries=n64, end_offset=z64_off)
                    elif needs64:
                        problem = f"the ZIP64 end record at offset {z64_off} is missing or damaged"
                        i = tail.rfind(SIG_EOCD, 0, i)
                        continue
                elif needs64:
                    problem = "the ZIP64 locator before the end record is missing"
                    i = tail.rfind(SIG_EOCD, 0, i)
                    continue
                if res["cd_offset"] + res["cd_size"] == res["end_offset"]:
                    return res
                problem = (f"the end record at offset {eocd} puts the central directory at "
                           f"{res['cd_offset']}..{res['cd_offset'] + res['cd_size']}, which does not end where "
                           f"the end records start ({res['end_offset']})")
        i = tail.rfind(SIG_EOCD, 0, i)
    return problem


def parse_central(fh: ArchiveFile, cd: dict) -> Tuple[List[dict], Optional[str]]:
    """Central-directory entries (dicts) and the first problem met, if any."""
    problem: List[str] = []
    entries = list(iter_central(fh, cd, problem))
    return entries, (problem[0] if problem else None)


def iter_central(fh: ArchiveFile, cd: dict, problem: List[str]) -> Iterator[dict]:
    """The central-directory entries of :func:`parse_central` one at a time, read in slabs of at most 8 MiB,
    so a caller that handles each entry in turn holds one entry, not one per member; the first problem met
    is appended to ``problem`` (then the iteration stops)."""
    off = cd["cd_offset"]
    end = cd["cd_offset"] + cd["cd_size"]
    n = 0
    slab_off, slab = off, b""
    for idx in range(cd["n_entries"]):
        need = CENTRAL_SIZE
        if off + need > end:
            problem.append(f"entry {idx} at offset {off} runs past the end of the central directory")
            return
        if off + need > slab_off + len(slab):
            slab_off, slab = off, fh.pread(off, min(8 << 20, end - off))
        h = slab[off - slab_off: off - slab_off + CENTRAL_SIZE]
        if len(h) < CENTRAL_SIZE or h[:4] != SIG_CENTRAL:
            problem.append(f"entry {idx} at offset {off} has signature {h[:4].hex(' ') or 'EOF'}, "
                           f"not 50 4b 01 02")
            return
        (_sig, _vm, vn, flags, method, mtime, mdate, crc, csize, usize, nlen, xlen, clen, _disk, _ia, _ea,
         lho) = struct.unpack("<4sHHHHHHIIIHHHHHII", h)
        total = CENTRAL_SIZE + nlen + xlen + clen
        if off + total > end:
            problem.append(f"entry {idx} at offset {off} runs past the end of the central directory")
            return
        if off + total > slab_off + len(slab):
            slab_off, slab = off, fh.pread(off, min(max(8 << 20, total), end - off))
        base = off - slab_off + CENTRAL_SIZE
        name_b = slab[base: base + nlen]
        extra = slab[base + nlen: base + nlen + xlen]
        vals = {"usize": usize, "csize": csize, "lho": lho}
        want = [k for k, v in (("usize", usize), ("csize", csize), ("lho", lho)) if v == 0xFFFFFFFF]
        if want:
            zip64_extra(extra, want, vals)
        n += 1
        yield {"name": name_b.decode("utf-8" if flags & 0x800 else "cp437", "replace"),
               "name_bytes": name_b, "flags": flags, "method": method, "crc": crc,
               "fixed": (vn, flags, mtime, mdate),
               "csize": vals["csize"], "usize": vals["usize"], "lho": vals["lho"]}
        off += total
    if off != end:
        problem.append(f"{end - off} bytes of the central directory are not covered by its {n} entries")


#: Torch's alignment padding: extra-field id ``b"FB"`` (0x4246) filled with ``b"Z"``
#: (c10 ``PyTorchStreamWriter::getPadding``).
_TORCH_PAD_ID = 0x4246


def _extra_problem(extra: bytes, xlen: int) -> Optional[str]:
    """Why a local header's extra field is damaged, or None.

    The extra field is a sequence of ``(id u16, size u16, body)`` blocks
    (APPNOTE 4.5.1); id 0 is not assigned, and torch's padding block holds only
    ``Z``.  Damage here leaves the data readable but proves a block of the file
    was overwritten.
    """
    if len(extra) < xlen:
        return f"its extra field is cut off ({len(extra)} of {xlen} bytes)"
    i = 0
    while i < len(extra):
        if i + 4 > len(extra):
            return f"its extra field ends in {len(extra) - i} stray bytes ({extra[i:].hex(' ')})"
        hid, hlen = struct.unpack_from("<HH", extra, i)
        body = extra[i + 4: i + 4 + hlen]
        if hid == 0:
            nul = len(extra) - len(extra.replace(b"\0", b""))
            return f"its extra field has a block with id 0 ({nul} of its {len(extra)} bytes are NUL)"
        if len(body) < hlen:
            return f"extra-field block {hid:#06x} claims {hlen} bytes but only {len(body)} remain"
        if hid == _TORCH_PAD_ID and body.strip(b"Z"):
            return f"torch's alignment padding holds bytes other than 'Z' ({body.strip(b'Z')[:8].hex(' ')})"
        if hid != _TORCH_PAD_ID and hlen >= 4 and not body.strip(b"Z"):
            return f"torch's alignment padding block has id {extra[i:i + 2].hex(' ')}, not 46 42 ('FB')"
        i += 4 + hlen
    return None


def read_descriptor(fh: ArchiveFile, off: int, csize: int, usize: int) -> Tuple[Optional[dict], str]:
    """Read a data descriptor at ``off`` that should state ``csize``/``usize``.

    Returns ``(dict(crc, length), "")`` or ``(None, why)``.
    """
    b = fh.pread(off, 24)
    if len(b) < 12:
        return None, f"its data descriptor at offset {off} is cut off"
    if b[:4] == SIG_DESCRIPTOR:
        body, base_len = b[4:], 4
    else:
        body, base_len = b, 0  # the signature is optional (APPNOTE 4.3.9.3)
    if len(body) >= 12:
        crc, c32, u32 = struct.unpack_from("<III", body, 0)
        if c32 == csize & 0xFFFFFFFF and u32 == usize & 0xFFFFFFFF and csize < 0xFFFFFFFF:
            return {"crc": crc, "length": base_len + 12}, ""
    if len(body) >= 20:
        crc, c64, u64 = struct.unpack_from("<IQQ", body, 0)
        if c64 == csize and u64 == usize:
            return {"crc": crc, "length": base_len + 20}, ""
    if not b.strip(b"\0")[:1] and len(b) >= 16:
        return None, f"its data descriptor at offset {off} is NUL bytes"
    return None, (f"its data descriptor at offset {off} ({b[:16].hex(' ')}) does not state the "
                  f"central directory's sizes ({csize}/{usize})")


def prefetch_headers(fh: ArchiveFile, entries: List[dict], cd_start: int) -> None:
    """Remote only: fetch the local headers (and data descriptors) of ``entries`` in batches."""
    # Object storage: every local header (fixed part, name, and torch's ≤ 64-byte alignment
    # padding in the extra field, with room to spare) in one concurrent batch of GETs.  Each
    # range starts 24 bytes early: a data descriptor (flag bit 3, 16 or 24 bytes) ends where
    # the next record begins, so the previous member's descriptor comes in the same GET; the
    # last member's sits before the central directory.  Descriptors elsewhere (a gap between
    # records) are fetched in a second batch.
    fh.prefetch([(max(0, e["lho"] - 24), 24 + LOCAL_SIZE + len(e["name_bytes"]) + 256) for e in entries]
                + [(max(0, cd_start - 24), 48)])
    if fh.fd is None and fh.prefetch_enabled:
        dds = []
        for e in entries:
            lh = fh._prefetched(e["lho"], LOCAL_SIZE) if e["flags"] & 8 else None
            if lh and lh[:4] == SIG_LOCAL:
                nlen, xlen = struct.unpack_from("<HH", lh, 26)
                off = e["lho"] + LOCAL_SIZE + nlen + xlen + e["csize"]
                if fh._prefetched(off, 24) is None:
                    dds.append((off, 24))
        fh.prefetch(dds)


def header_problem(fh: ArchiveFile, e: dict, m: Member, cd_start: int) -> Optional[str]:
    """Why the local header of central-directory entry ``e`` (record ``m``) is damaged, or None.

    Sets ``m.loose_data_offset`` when the header is readable and ``m.data_offset`` when it
    agrees with the entry (reset to -1 when its data would run into the central directory).
    """
    lh = fh.pread(e["lho"], LOCAL_SIZE)
    if e["lho"] + LOCAL_SIZE > cd_start or len(lh) < LOCAL_SIZE:
        return f"its offset {e['lho']} lies outside the member area (central directory at {cd_start})"
    if lh[:4] != SIG_LOCAL:
        nul = lh.count(0)
        return (f"signature is {lh[:4].hex(' ')}, not 50 4b 03 04"
                + (f"; {nul} of its {LOCAL_SIZE} fixed bytes are NUL" if nul >= 8 else ""))
    (_s, lvn, lflags, lmethod, lt, ld, lcrc, lcsize, lusize, nlen, xlen) = struct.unpack("<4sHHHHHIIIHH", lh)
    var = fh.pread(e["lho"] + LOCAL_SIZE, nlen + xlen)
    lname, lextra = var[:nlen], var[nlen:]
    m.loose_data_offset = e["lho"] + LOCAL_SIZE + nlen + xlen  # where a lenient reader starts
    why = _local_disagrees(e, lname, lmethod, (lvn, lflags, lt, ld), (lcrc, lcsize, lusize),
                           _extra_problem(lextra, xlen))
    if why:
        return why
    m.data_offset = e["lho"] + LOCAL_SIZE + nlen + xlen
    return _data_problem(fh, e, m, cd_start)


def _local_disagrees(e: dict, lname: bytes, lmethod: int, fixed: tuple, sizes: tuple, xwhy: Optional[str]
                     ) -> Optional[str]:
    """Where a readable local header disagrees with its central-directory entry ``e`` (name, method, the
    version/flags/time/date fields, its extra field ``xwhy``, CRC and sizes), or None."""
    if lname != e["name_bytes"]:
        return f"it names {lname.decode('utf-8', 'replace')!r} where the central directory says {e['name']!r}"
    if lmethod != e["method"]:
        return f"compression method {lmethod} where the central directory says {e['method']}"
    if fixed != e["fixed"]:
        return (f"its version/flags/time/date fields {list(fixed)} differ from the central "
                f"directory's {list(e['fixed'])}")
    if xwhy:
        return xwhy
    lcrc, lcsize, lusize = sizes
    if sizes != (0, 0, 0) and lcsize != 0xFFFFFFFF and \
            sizes != (e["crc"], e["csize"] & 0xFFFFFFFF, e["usize"] & 0xFFFFFFFF):
        # with flag bit 3 these are 0 (APPNOTE 4.4.4); otherwise they must match the central directory
        return (f"it states CRC {hex32(lcrc)} / {lcsize} / {lusize} bytes where the central directory says "
                f"{hex32(e['crc'])} / {e['csize']} / {e['usize']}")
    return None


def _data_problem(fh: ArchiveFile, e: dict, m: Member, cd_start: int) -> Optional[str]:
    """Why the data of a record whose local header agrees (``m.data_offset`` set) is damaged: it runs into
    the central directory (``m.data_offset`` reset to -1), or its data descriptor is missing or disagrees."""
    end = m.data_offset + e["csize"]
    if end > cd_start:
        why = (f"its data ({e['csize']} bytes from offset {m.data_offset}) runs into the central "
               f"directory at {cd_start}")
        m.data_offset = -1
        return why
    if e["flags"] & 8:
        dd, dwhy = read_descriptor(fh, end, e["csize"], e["usize"])
        if dd is None:
            return dwhy
        if dd["crc"] != e["crc"]:
            return (f"its data descriptor states CRC {hex32(dd['crc'])} where the central directory "
                    f"says {hex32(e['crc'])}")
    return None


def overlapping_records(members: Records) -> Optional[Tuple[Member, Member]]:
    """The first two placed records (data offset known), in order of their header offsets, that overlap (a damaged
    entry pointing into another record), or None.  Reads the records' columns, not a member object each; the rows
    are sorted only when the archive does not already hold them in order (torch writes them so)."""
    header, data = members.int_column("header_offset"), members.int_column("data_offset")
    size = members.int_column("compressed_size_bytes")
    placed = (i for i in range(len(members)) if data[i] >= 0)
    prev = -1
    for i in placed:
        if prev >= 0 and header[i] < header[prev]:  # out of order: sort (stable, as records at one offset keep theirs)
            placed = sorted((i for i in range(len(members)) if data[i] >= 0), key=header.__getitem__)
            break
        prev = i
    else:
        placed = (i for i in range(len(members)) if data[i] >= 0)
    prev = -1
    for i in placed:
        if prev >= 0 and data[prev] + size[prev] > header[i]:
            return members[prev], members[i]
        prev = i
    return None


# ------------------------------------------------------------------ findings


def cd_corrupted(display: str, offset: int, why: str, *, cd_bytes: Optional[int] = None) -> Finding:
    """``zip_central_directory_corrupted``: the central directory or end records from ``offset`` are damaged
    (``why``: :func:`parse_central`'s problem, two :func:`overlapping_records` records, or an inconsistent end
    record met by the local walk of a cut archive, :mod:`.cut`).  ``cd_bytes``: the directory's size, when the end
    record states one."""
    if cd_bytes is None:
        return findings.make("zip_central_directory_corrupted", path=display, offset=offset, why=why)
    return findings.make("zip_central_directory_corrupted", path=display, offset=offset, cd_bytes=cd_bytes, why=why)


def member_header_corrupted(display: str, member: str, offset: int, why: str) -> Finding:
    """``zip_member_header_corrupted``: the local header of ``member`` at ``offset`` disagrees with the central
    directory (``why``, from :func:`header_problem`)."""
    return findings.make("zip_member_header_corrupted", path=display, member=member, offset=offset, why=why)


def missing_record(display: str, member: str, why: str) -> Finding:
    """``zip_missing_record``: the archive has no ``member`` record (data.pkl, :func:`missing_data_pkl`; or no
    end-of-central-directory record in a file that is no zip at all, ``torchzip.check_zip``)."""
    return findings.make("zip_missing_record", path=display, member=member, why=why)


def missing_data_pkl(display: str, names: Sequence[str], prefix: str) -> Optional[Finding]:
    """:func:`missing_record` when none of the records ``names`` is ``<prefix>/data.pkl`` (where torch reads
    it: the folder of the first record), else None."""
    want = f"{prefix}/data.pkl" if prefix else "data.pkl"
    if want in names:
        return None
    elsewhere = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if elsewhere:
        why = (f"the first record puts the archive under {prefix!r} (torch reads the folder name from it) "
               f"but data.pkl is at {elsewhere[0]!r}")
    else:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        why = f"none of its {len(names)} records is named {want} (records: {shown})"
    return missing_record(display, want, why)
