"""The torch zip without its central directory: walk the local headers of a cut archive, say where and how it ends.

:func:`ckptaudit.formats.torchzip._check_without_cd` runs the walk (``walk_local``), the tail decision
(``decide_tail``) and the texts of ``describe_cut``; :func:`truncated` builds the cut's finding.
"""

from __future__ import annotations

import re
import struct
from typing import Callable, Dict, List, Optional, Tuple

from ... import findings
from ...findings import Finding
from .crc32 import crc32
from .central import read_descriptor
from .reader import (CENTRAL_SIZE, EOCD_SIZE, LOCAL_SIZE, SIG_CENTRAL, SIG_DESCRIPTOR, SIG_EOCD, SIG_LOCAL,
                     SIG_ZIP64_EOCD, SIG_ZIP64_LOCATOR, Member, ArchiveFile, strip_prefix, zip64_extra)


def _scan_descriptor(fh: ArchiveFile, data_offset: int, chunk: int) -> Optional[dict]:
    """Find the end of a record whose sizes are deferred to a data descriptor.

    Streams from ``data_offset`` looking for ``PK\\x07\\x08`` whose stated size
    equals the distance travelled (32- or 64-bit form).  Returns
    ``{size, crc_stored, crc_actual, dd_len}``; ``{"partial": True, ...}`` when the
    file ends inside a descriptor whose CRC matches; None when none is found.
    """
    size = fh.size
    crc = 0
    done = data_offset  # crc covers [data_offset, done)
    carry = b""
    pos = data_offset
    while pos < size:
        b = fh.pread(pos, min(chunk, size - pos))
        if not b:
            break
        pos += len(b)
        bufb = carry + b
        i = bufb.find(SIG_DESCRIPTOR)
        while i >= 0:
            p = done + i
            length = p - data_offset
            dd = fh.pread(p, 24)
            ok_len = _descriptor_len(dd, length)
            if ok_len or len(dd) < 16:
                crc_here = crc32(bufb[:i], crc)
                stored = struct.unpack_from("<I", dd, 4)[0] if len(dd) >= 8 else None
                if ok_len:
                    return {"size": length, "crc_stored": stored, "crc_actual": crc_here, "dd_len": ok_len}
                if stored is not None and stored == crc_here:
                    return {"partial": True, "size": length, "crc_stored": stored, "crc_actual": crc_here,
                            "dd_len": len(dd)}
            i = bufb.find(SIG_DESCRIPTOR, i + 1)
        keep = min(3, len(bufb))
        crc = crc32(bufb[: len(bufb) - keep], crc)
        done += len(bufb) - keep
        carry = bufb[len(bufb) - keep:]
    return None


def _descriptor_len(dd: bytes, length: int) -> int:
    """16 or 24 when the data descriptor ``dd`` (up to 24 bytes from its signature) states ``length`` as both
    sizes in its 32- or 64-bit form; 0 when it does not."""
    if len(dd) >= 16:
        _c, c32, u32 = struct.unpack_from("<III", dd, 4)
        if c32 == length and u32 == length:
            return 16
    if len(dd) >= 24:
        _c, c64, u64 = struct.unpack_from("<IQQ", dd, 4)
        if c64 == length and u64 == length:
            return 24
    return 0


def trailing_zero_start(fh: ArchiveFile, chunk: int) -> int:
    """Offset where the run of NUL bytes that ends the file starts (== size if none)."""
    pos = fh.size
    while pos > 0:
        n = min(chunk, pos)
        b = fh.pread(pos - n, n)
        stripped = b.rstrip(b"\0")
        if len(stripped) < len(b) and stripped:
            return pos - n + len(stripped)
        if stripped:
            return pos
        pos -= n
    return 0


def walk_local(fh: ArchiveFile, verify_crc: bool, chunk: int, buf: bytearray,
               expected_size: Optional[Callable[[str, List[Member]], Optional[int]]] = None) -> dict:
    """Walk local headers from offset 0.  Returns what was found and where it stopped: ``members`` (the
    :class:`Member` records met, ``complete`` when whole), ``stop`` (why the walk ended: ``eof_between``,
    ``eof_in_header``, ``eof_in_data``, ``eof_in_descriptor``, ``bad_descriptor``, ``unsupported``,
    ``eof_in_end_records``, ``eocd_inconsistent``, ``nul``, ``garbage``), ``stop_at`` (byte), ``cut_member``
    and ``cut_data_offset`` (the last record begun), ``cd_entries`` and ``reached_cd``.

    ``expected_size(name, members so far)``: the size a record whose sizes only its data descriptor states
    should have (a storage's bytes, from data.pkl, which torch writes first), or None.  With it, the
    descriptor is looked for at that one place and the record's CRC-32 computed in one pass, instead of a
    search for the descriptor's signature through every byte; where it is not there, the search runs."""
    size = fh.size
    pos = 0
    st = {"members": [], "stop": "eof_between", "stop_at": 0, "cut_member": None,
          "cut_data_offset": None, "cd_entries": 0, "reached_cd": False, "expected_size": expected_size}
    while True:
        st["stop_at"] = pos
        if pos >= size:
            st["stop"] = "eof_between" if not st["reached_cd"] else "eof_in_end_records"
            return st
        sig = fh.pread(pos, 4)
        if sig == SIG_LOCAL:
            pos = _local_record(fh, pos, st, verify_crc, chunk, buf)
        elif sig == SIG_CENTRAL:
            pos = _central_entry(fh, pos, st)
        elif st["reached_cd"] and sig in (SIG_ZIP64_EOCD, SIG_ZIP64_LOCATOR, SIG_EOCD):
            pos = _end_record(fh, sig, pos, st)
        elif len(sig) < 4:
            st["stop"] = "eof_in_header" if not st["reached_cd"] else "eof_in_end_records"
            return st
        else:
            st["stop"] = "nul" if sig == b"\0\0\0\0" else "garbage"
            return st
        if pos is None:
            return st


def _local_record(fh: ArchiveFile, pos: int, st: dict, verify_crc: bool, chunk: int,
                  buf: bytearray) -> Optional[int]:
    """The local record at ``pos``: its :class:`Member` appended to ``st["members"]`` when whole; returns
    the offset after it, or None (``st["stop"]`` says why) where the walk ends."""
    h = fh.pread(pos, LOCAL_SIZE)
    if len(h) < LOCAL_SIZE:
        st["stop"] = "eof_in_header"
        return None
    (_s, _v, flags, method, _t, _d, crc, csize, usize, nlen, xlen) = struct.unpack("<4sHHHHHIIIHH", h)
    name_b = fh.pread(pos + LOCAL_SIZE, nlen)
    name = name_b.decode("utf-8" if flags & 0x800 else "cp437", "replace")
    st["cut_member"] = name
    extra = fh.pread(pos + LOCAL_SIZE + nlen, xlen)
    if len(name_b) < nlen or len(extra) < xlen:
        st["stop"] = "eof_in_header"
        return None
    vals = {"usize": usize, "csize": csize}
    want = [k for k, v in (("usize", usize), ("csize", csize)) if v == 0xFFFFFFFF]
    if want:
        zip64_extra(extra, want, vals)
    data_offset = pos + LOCAL_SIZE + nlen + xlen
    st["cut_data_offset"] = data_offset
    m = Member(name=name, header_offset=pos, data_offset=data_offset, size_bytes=vals["usize"],
               crc32=crc, compressed_size_bytes=vals["csize"], method=method, flags=flags,
               complete=False)
    if bool(flags & 8) and vals["csize"] == 0:
        hint = st["expected_size"](name, st["members"]) if st.get("expected_size") else None
        if hint is not None and m.method == 0:
            end = _predicted_record(fh, m, st, hint, chunk, buf)
            if end is not None:
                return end
        return _deferred_record(fh, m, st, chunk)
    return _sized_record(fh, m, st, vals, verify_crc, chunk, buf)


def _predicted_record(fh: ArchiveFile, m: Member, st: dict, n: int, chunk: int, buf: bytearray) -> Optional[int]:
    """A deferred record of ``n`` bytes when its descriptor is right after them (its CRC-32 computed); None
    when it is not there (the caller searches)."""
    dd = fh.pread(m.data_offset + n, 24)
    if dd[:4] != SIG_DESCRIPTOR:
        return None
    dd_len = _descriptor_len(dd, n)
    if not dd_len:
        return None
    crc, got = fh.crc(m.data_offset, n, chunk, buf)
    if got != n:
        return None
    m.size_bytes = m.compressed_size_bytes = n
    m.crc32 = struct.unpack_from("<I", dd, 4)[0]
    m.crc_actual = crc
    m.crc_ok = crc == m.crc32
    m.complete = True
    st["members"].append(m)
    return m.data_offset + n + dd_len


def _deferred_record(fh: ArchiveFile, m: Member, st: dict, chunk: int) -> Optional[int]:
    """A record whose sizes only its data descriptor states: found by :func:`_scan_descriptor`."""
    if m.method != 0:
        st["stop"] = "unsupported"
        return None
    found = _scan_descriptor(fh, m.data_offset, chunk)
    if found is None:
        st["stop"] = "eof_in_data"
        return None
    m.size_bytes = m.compressed_size_bytes = found["size"]
    m.crc32 = found["crc_stored"] if found["crc_stored"] is not None else 0
    m.crc_actual = found["crc_actual"]
    m.crc_ok = found["crc_actual"] == found["crc_stored"]
    m.complete = True
    st["members"].append(m)
    if found.get("partial"):
        st["stop"] = "eof_in_descriptor"
        return None
    return m.data_offset + found["size"] + found["dd_len"]


def _sized_record(fh: ArchiveFile, m: Member, st: dict, vals: dict, verify_crc: bool, chunk: int,
                  buf: bytearray) -> Optional[int]:
    """A record whose local header states its sizes (``vals``); its CRC is checked when ``verify_crc``."""
    end = m.data_offset + vals["csize"]
    if end > fh.size:
        st["stop"] = "eof_in_data"
        return None
    m.complete = True
    if verify_crc and m.method == 0 and m.crc32:
        c, _got = fh.crc(m.data_offset, vals["csize"], chunk, buf)
        m.crc_actual = c
        m.crc_ok = c == m.crc32
    st["members"].append(m)
    if not m.flags & 8:
        return end
    dd, _why = read_descriptor(fh, end, vals["csize"], vals["usize"])
    if dd is None:
        st["stop_at"] = end
        st["stop"] = "bad_descriptor"
        return None
    return end + dd["length"]


def _central_entry(fh: ArchiveFile, pos: int, st: dict) -> Optional[int]:
    """A central-directory entry met by the walk: counted; returns the offset after it."""
    st["reached_cd"] = True
    h = fh.pread(pos, CENTRAL_SIZE)
    if len(h) < CENTRAL_SIZE:
        st["stop"] = "eof_in_end_records"
        return None
    nlen, xlen, clen = struct.unpack_from("<HHH", h, 28)
    if pos + CENTRAL_SIZE + nlen + xlen + clen > fh.size:
        st["stop"] = "eof_in_end_records"
        return None
    st["cd_entries"] += 1
    return pos + CENTRAL_SIZE + nlen + xlen + clen


def _end_record(fh: ArchiveFile, sig: bytes, pos: int, st: dict) -> Optional[int]:
    """A ZIP64 end record, its locator or the end-of-central-directory record after the central directory."""
    if sig == SIG_ZIP64_EOCD:
        h = fh.pread(pos, 12)
        if len(h) < 12:
            st["stop"] = "eof_in_end_records"
            return None
        return pos + 12 + struct.unpack_from("<Q", h, 4)[0]
    if sig == SIG_ZIP64_LOCATOR:
        return pos + 20
    if pos + EOCD_SIZE > fh.size:
        st["stop"] = "eof_in_end_records"
        st["eocd_missing_bytes"] = pos + EOCD_SIZE - fh.size
    else:
        st["stop"] = "eocd_inconsistent"
    return None


def decide_tail(st: dict, storages: Optional[Dict[str, int]], prefix: str, zstart: int, zlen: int,
                 size: int, min_tail: int) -> Tuple[bool, bool]:
    """Is the end of the file zero-filled rather than cut?  Returns ``(zero_fill, definite)``.

    A cut file ends wherever the writer stopped, possibly inside an all-zero
    tensor; a zero-filled file (size committed, blocks never written) has NUL
    bytes where later records' headers must be.  Definite evidence: the walk
    stopped on NUL where a header or data descriptor must start and the NULs run
    to EOF; or data.pkl (statically walked) says how long the record being read
    is, and the file holds NULs past that end.  Without either, a trailing NUL
    run of at least ``min_tail`` bytes (``torchzip.MIN_ZERO_TAIL_BYTES``) is reported as a zero-filled
    tail *as well as* the truncation (``definite`` False).
    """
    if zlen < 64:
        return False, False
    if st["stop"] in ("nul", "bad_descriptor") and st["stop_at"] >= zstart:
        return True, True
    if st["stop"] == "eof_in_data" and st["cut_member"] and storages is not None:
        key = strip_prefix(st["cut_member"], prefix)
        mm = re.fullmatch(r"data/(\w+)", key)
        if mm and mm.group(1) in storages and st["cut_data_offset"] is not None:
            expected_end = st["cut_data_offset"] + storages[mm.group(1)]
            if expected_end < size:
                return expected_end >= zstart, True
            return False, True
    return zlen >= min_tail, False


def describe_cut(st: dict, members: List[Member], prefix: str, storages: Optional[Dict[str, int]], size: int,
                  zero_fill: bool, zstart: int) -> Tuple[str, str]:
    """Two sentences on a zip cut short (or zero-filled from ``zstart``) of ``size`` bytes: which records are
    complete and where the cut falls (from :func:`walk_local`'s state ``st``), and which storages (key →
    bytes, None when data.pkl is lost) the lost records held."""
    complete = [m.name for m in members if m.complete]
    stop = st["stop"]
    at = zstart if zero_fill else size
    cut_name = strip_prefix(st["cut_member"], prefix) if st["cut_member"] else None
    n_total = str(len(members)) if st.get("eocd_missing_bytes") or st["reached_cd"] else "?"
    where = _cut_where(st, stop, cut_name, members)
    lead = "the zero fill starts inside" if zero_fill else "the cut falls inside"
    if complete:
        of_total = f" of {n_total}" if n_total != "?" else ""
        intact = (f"The first {len(complete)}{of_total} records ({_names_text(complete, prefix)}) are "
                  f"complete; {lead} {where} at byte {at}.")
    else:
        intact = f"No record is complete; {lead} {where} at byte {at}."
    if storages is not None:
        intact += _storages_text(members, prefix, storages)
    missing = _missing_text(st, members, prefix, storages, cut_name, at)
    return intact, missing


def _cut_where(st: dict, stop: str, cut_name: Optional[str], members: List[Member]) -> str:
    """Where in the archive the walk of :func:`walk_local` stopped, in words."""
    if st.get("eocd_missing_bytes"):
        return "the end-of-central-directory record"
    if st["reached_cd"]:
        return (f"the central directory or end records ({st['cd_entries']} of {len(members)} central "
                f"directory entries are complete)")
    if stop == "eof_in_data" and cut_name:
        return f"the data of {cut_name} (which starts at byte {st['cut_data_offset']})"
    if stop == "eof_in_header":
        return f"the local header of {cut_name}" if cut_name else "a local header"
    if stop in ("eof_in_descriptor", "bad_descriptor"):
        return f"the data descriptor of {cut_name}"
    if stop == "unsupported":
        return f"{cut_name}, a compressed record whose size only its (missing) data descriptor states,"
    return "the gap between records"


def _storages_text(members: List[Member], prefix: str, storages: Dict[str, int]) -> str:
    """How many of the storages data.pkl names (key -> bytes) lie in complete records."""
    have = {m.name for m in members if m.complete}
    pre = f"{prefix}/" if prefix else ""
    n_ok = sum(1 for k in storages if f"{pre}data/{k}" in have)
    return f" {n_ok} of the {len(storages)} storages named in data.pkl are intact."


def _missing_text(st: dict, members: List[Member], prefix: str, storages: Optional[Dict[str, int]],
                  cut_name: Optional[str], at: int) -> str:
    """What the cut lost, in a parenthesis: tensor bytes (when data.pkl's storages are known) or only the
    archive's closing records; "" when nothing can be said."""
    if st.get("eocd_missing_bytes"):
        k = st["eocd_missing_bytes"]
        return (f" (only the last {k} of that record's 22 bytes {'are' if k != 1 else 'is'} missing; every "
                f"record and the central directory are complete)")
    if storages is None:
        return " (all records are present; only the archive's closing records are missing)" if st["reached_cd"] \
            else ""
    have = {m.name for m in members if m.complete}
    pre = f"{prefix}/" if prefix else ""
    lost = sum(nb for k, nb in storages.items() if f"{pre}data/{k}" not in have)
    if st["stop"] == "eof_in_data" and cut_name and cut_name.startswith("data/") and st["cut_data_offset"] is not None:
        lost -= max(0, at - st["cut_data_offset"])
    if lost > 0:
        return f" (at least {lost} bytes of tensor data are missing, and the central directory)"
    if st["reached_cd"]:
        return " (all tensor data is present; only the archive's closing records are missing)"
    return ""


def _names_text(names: List[str], prefix: str) -> str:
    """``data.pkl, .format_version, data/0..data/10`` (consecutive storage keys joined)."""
    parts: List[str] = []
    run: List[int] = []

    def flush() -> None:
        if run:
            parts.append(f"data/{run[0]}" if len(run) == 1 else f"data/{run[0]}..data/{run[-1]}")
            run.clear()

    for n in names:
        s = strip_prefix(n, prefix)
        m = re.fullmatch(r"data/(\d+)", s)
        if m and (not run or int(m.group(1)) == run[-1] + 1):
            run.append(int(m.group(1)))
            continue
        flush()
        if m:
            run.append(int(m.group(1)))
        else:
            parts.append(s)
    flush()
    return ", ".join(parts)


def truncated(display: str, size_bytes: int, missing_text: str, intact_text: str, n_records_intact: int) -> Finding:
    """``truncated_zip_no_central_directory``: the archive ends at ``size_bytes`` without its end records;
    ``intact_text``/``missing_text`` come from :func:`describe_cut` (where the cut falls, what survived)."""
    return findings.make("truncated_zip_no_central_directory", path=display, size_bytes=size_bytes,
                         missing_text=missing_text, intact_text=intact_text, n_records_intact=n_records_intact)
