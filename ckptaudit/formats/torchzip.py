"""Check a torch.save zip archive from its bytes (own zip parser; no torch, no zipfile).

Zip structures (PKWARE APPNOTE.TXT 6.3; offsets in bytes, integers little-endian):

* local file header ``PK\\x03\\x04`` (30 bytes + name + extra), then the data,
  then - when general-purpose flag bit 3 is set - a data descriptor
  ``PK\\x07\\x08`` + crc32 + compressed size + size (4+4+4+4 bytes, or 4+4+8+8
  in ZIP64 archives);
* central directory headers ``PK\\x01\\x02`` (46 bytes + name + extra + comment),
  sizes/offsets of 0xFFFFFFFF live in the ZIP64 extra field (id 0x0001);
* ZIP64 end record ``PK\\x06\\x06``, ZIP64 locator ``PK\\x06\\x07`` (20 bytes),
  end-of-central-directory record ``PK\\x05\\x06`` (22 bytes + comment).

Torch's writer conventions (c10 ``PyTorchStreamWriter`` over miniz, driven by
``torch/serialization.py`` ``_save``; seen in the bytes of the cases):

* every record lives under one folder, ``<prefix>/data.pkl`` first, then
  ``.format_version``, ``.storage_alignment``, ``byteorder``, ``data/0``,
  ``data/1``, ... (storage keys in first-use order), ``version``,
  ``.data/serialization_id``; the reader takes ``<prefix>`` from the first
  central-directory name;
* records are STORED (method 0), flags 0x0808 (bit 3: sizes and CRC are 0 in
  the local header and follow the data in a data descriptor; bit 11: UTF-8);
* the local header's extra field is ``FB`` padding so that record data starts
  on a multiple of ``.storage_alignment`` (64);
* the CRC32 is real unless ``torch.utils.serialization.config.save.compute_crc32``
  is off, in which case 0 is stored (treated here as "not recorded").
* record ``data/<key>`` holds exactly ``numel * element_size`` bytes of storage
  ``<key>``; the reader (``_load.load_tensor``) takes that many bytes from the
  record, so a record may be longer but never shorter.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .. import findings, fs
from ..findings import Finding
from .sniff import generic_findings, sniff

SIG_LOCAL = b"PK\x03\x04"
SIG_CENTRAL = b"PK\x01\x02"
SIG_EOCD = b"PK\x05\x06"
SIG_ZIP64_EOCD = b"PK\x06\x06"
SIG_ZIP64_LOCATOR = b"PK\x06\x07"
SIG_DESCRIPTOR = b"PK\x07\x08"
_EOCD_SIZE = 22
_LOCAL_SIZE = 30
_CENTRAL_SIZE = 46
#: Largest data.pkl kept in memory, bytes (a 10k-tensor model has a few MB).
MAX_DATA_PKL_BYTES = 256 << 20
#: Least bytes one small ranged GET of a remote archive fetches (and keeps for the reads that
#: follow): 64 KiB costs ~1 ms more transfer at 100 MB/s than 256 bytes, against 10–30 ms of
#: latency per GET saved whenever the next local header lies within it.
REMOTE_WINDOW_BYTES = 64 << 10
#: Fetch the local headers and data descriptors of a remote archive (:meth:`_File.prefetch`),
#: and the values of its small tensors (``layouts.base``), in concurrent batches of ranged
#: GETs; False reads each with its own GET (kept for benchmarks/bench_s3.py --no-prefetch).
REMOTE_PREFETCH = True
#: Longest NUL run inside a member that fails its CRC before it is reported as
#: a zeroed block (``zero_filled_span``), bytes: one filesystem block.
MIN_ZERO_SPAN_BYTES = 4096
#: Trailing NUL bytes from which a file without central directory is reported
#: as zero-filled when data.pkl cannot tell (see :func:`_decide_tail`), bytes.
MIN_ZERO_TAIL_BYTES = 4096


@dataclass
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


@dataclass
class ZipReport:
    """What :func:`check_zip` found.

    ``prefix`` is the archive folder (``'ckpt'`` for ``ckpt/data.pkl``);
    ``data_pkl`` the bytes of ``<prefix>/data.pkl`` when that record is intact
    and at most :data:`MAX_DATA_PKL_BYTES`; ``intact_members`` the names whose
    header (and CRC, when checked) are fine; ``cut_offset`` the byte where the
    readable archive ends when the file was cut short or zero-filled, else None.
    ``data_pkl_any`` the bytes of that record as far as they can be read even when
    its CRC or local header is wrong (for the security walk only: a loader that
    ignores the CRC still unpickles them).
    """

    members: List[Member] = field(default_factory=list)
    prefix: str = ""
    has_central_directory: bool = False
    data_pkl: Optional[bytes] = None
    data_pkl_any: Optional[bytes] = None
    findings: List[Finding] = field(default_factory=list)
    intact_members: List[str] = field(default_factory=list)
    cut_offset: Optional[int] = None


class _File:
    """Positional reads on one open file (``os.pread``: no shared seek state).

    A remote object (``s3://…``, see :mod:`ckptaudit.fs`) is read with ranged GETs
    (seek + read on an fsspec file); the central directory, local headers and
    data.pkl cost a few small GETs, while CRC verification streams every member
    (as hashing does: each streams the object once).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        if fs.is_remote(path):
            self.f = fs.open_binary(path, exact=True)
            self.fd = None
            self.size = fs.size(path)
        else:
            self.f = open(path, "rb", buffering=0)
            self.fd = self.f.fileno()
            self.size = os.fstat(self.fd).st_size

    def prefetch(self, ranges: List[Tuple[int, int]]) -> None:
        """Remote only (a no-op locally): fetch these ``(offset, length)`` ranges now, all
        at once (:func:`ckptaudit.fs.read_ranges`), for the :meth:`pread` calls that follow
        (the local header of every member, whose offsets the central directory gives)."""
        if self.fd is not None or not ranges or not REMOTE_PREFETCH:
            return
        ranges = sorted({(o, min(n, self.size - o)) for o, n in ranges if 0 <= o < self.size and n > 0})
        blobs = fs.read_ranges(self.path, ranges)
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

    def pread(self, off: int, n: int) -> bytes:
        if off < 0 or n <= 0 or off >= self.size:
            return b""
        n = min(n, self.size - off)
        if self.fd is None and (hit := self._prefetched(off, n)) is not None:
            return hit
        if self.fd is None:  # remote: large reads (the record walk of a damaged archive, which may
            # pass over the same bytes again) go through an LRU of 1 MiB blocks (at most 32 MiB
            # held).  A small read fetches at least REMOTE_WINDOW_BYTES and keeps them: a local
            # header with its name/extra is one GET, and the headers of the small members that
            # follow it (torch aligns members to 64 bytes) come with it.
            if n >= (64 << 10):
                if getattr(self, "_blocks", None) is None:
                    self._blocks = fs.open_binary(self.path, block_size=1 << 20, cache_type="blockcache")
                self._blocks.seek(off)
                return self._blocks.read(n)
            w0, win = getattr(self, "_win", (0, b""))
            if not (w0 <= off and off + n <= w0 + len(win)):
                self.f.seek(off)
                w0, win = off, self.f.read(max(n, REMOTE_WINDOW_BYTES))
                self._win = (w0, win)
            return win[off - w0: off - w0 + n]
        out = os.pread(self.fd, n, off)
        while len(out) < n:  # pread may return short on some filesystems
            more = os.pread(self.fd, n - len(out), off + len(out))
            if not more:
                break
            out += more
        return out

    def crc(self, off: int, n: int, chunk: int, buf: bytearray) -> Tuple[int, int]:
        """CRC32 of ``n`` bytes from ``off`` (streamed); returns ``(crc, bytes_read)``."""
        crc = 0
        done = 0
        view = memoryview(buf)
        f = self.f
        if self.fd is None:  # remote: stream with large ranged GETs, not the small readahead
            if getattr(self, "_stream", None) is None:
                self._stream = fs.open_binary(self.path, block_size=fs.STREAM_BLOCK_BYTES)
            f = self._stream
        f.seek(off)
        while done < n:
            k = f.readinto(view[: min(len(buf), n - done)])
            if not k:
                break
            crc = zlib.crc32(view[:k], crc)
            done += k
        return crc, done

    def close(self) -> None:
        self.f.close()
        for extra in (getattr(self, "_stream", None), getattr(self, "_blocks", None)):
            if extra is not None:
                extra.close()


def _hex(v: Optional[int]) -> str:
    return "?" if v is None else f"{v:08x}"


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix) + 1:] if prefix and name.startswith(prefix + "/") else name


def _names_text(names: List[str], prefix: str) -> str:
    """``data.pkl, .format_version, data/0..data/10`` (consecutive storage keys joined)."""
    parts: List[str] = []
    run: List[int] = []

    def flush() -> None:
        if run:
            parts.append(f"data/{run[0]}" if len(run) == 1 else f"data/{run[0]}..data/{run[-1]}")
            run.clear()

    for n in names:
        s = _strip(n, prefix)
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


def _zip64_extra(extra: bytes, want: List[str], vals: Dict[str, int]) -> None:
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


# ------------------------------------------------------------------ public API


def check_zip(path, *, verify_crc: bool = True, chunk: int = 1 << 20) -> ZipReport:
    """Audit the zip structure of a torch.save archive at ``path``.

    With an end-of-central-directory record: every central-directory entry's
    local header is checked against it, data descriptors are checked, and with
    ``verify_crc`` every record's data is streamed once (``chunk`` bytes at a
    time) through CRC32.  Without one: local headers are walked from offset 0
    (record ends found through their data descriptors) to say where the file
    ends and which records are complete, and a zero-filled tail is told apart
    from a cut (see :func:`_decide_tail`).  Memory: O(chunk) plus the central
    directory entries and data.pkl.  Never raises on bad content; OSError only
    when the file cannot be opened.
    """
    path = fs.fspath(path)
    rep = ZipReport()
    s = sniff(path)
    if s.kind in ("empty", "all_zero"):
        rep.findings = generic_findings(s)
        return rep
    pre: List[Finding] = []
    zip_like = s.kind in ("torch_zip", "zip", "npz")
    if not zip_like:
        zh = s.detail.get("zero_head_bytes") or 0
        if zh >= 64:
            pre = [findings.make("zero_filled_head", path=path, zero_bytes=zh, size_bytes=s.size_bytes)]
        else:
            pre = generic_findings(s)
    fh = _File(path)
    try:
        buf = bytearray(max(4096, chunk))
        cd = _find_central_directory(fh)
        if isinstance(cd, dict):
            rep.has_central_directory = True
            _check_with_cd(fh, path, cd, rep, verify_crc, chunk, buf)
            rep.findings[:0] = pre
        elif not zip_like:
            rep.findings = pre or [findings.make(
                "zip_missing_record", path=path, member="end-of-central-directory",
                why=f"the file is not a zip archive at all: it is {s.kind!r} by its first bytes "
                    f"({s.head[:8].hex(' ')})")]
        else:
            _check_without_cd(fh, path, rep, verify_crc, chunk, buf, cd_problem=cd)
            rep.findings[:0] = [p for p in pre if p.kind == "zero_filled_head"]
    finally:
        fh.close()
    return rep


def check_storages(report: ZipReport, storages: Dict[str, Tuple[int, str, int]], path: str) -> List[Finding]:
    """Check that every storage named in data.pkl has a big enough record.

    ``storages``: key -> ``(nbytes_needed, dtype, numel)``; the record is
    ``<prefix>/data/<key>`` and must hold at least ``nbytes_needed`` bytes
    (torch reads exactly that many; a longer record loads).  When the archive
    was cut short or zero-filled (``report.cut_offset`` set or no central
    directory), records past the cut are not reported again: the truncation
    finding covers them; the complete records are still size-checked.
    """
    out: List[Finding] = []
    by_name = {m.name: m for m in report.members}
    cut = report.cut_offset is not None or not report.has_central_directory
    pre = f"{report.prefix}/" if report.prefix else ""

    def keyorder(k: str):
        return (0, int(k), "") if k.isdigit() else (1, 0, k)

    for key in sorted(storages, key=keyorder):
        nbytes, dtype, numel = storages[key]
        name = f"{pre}data/{key}"
        m = by_name.get(name)
        if m is None or not m.complete:
            if not cut:
                out.append(findings.make("zip_storage_missing", path=path, storage=key, member=name))
            continue
        if nbytes is not None and m.size_bytes < nbytes:
            out.append(findings.make("zip_storage_size_mismatch", path=path, storage=key, expected=nbytes,
                                     dtype=dtype, numel=numel, actual=m.size_bytes, member=name))
    return out


# ------------------------------------------------------------ central directory


def _find_central_directory(fh: _File):
    """Locate and parse the end records.

    Returns a dict ``{cd_offset, cd_size, n_entries, end_offset, eocd_offset}``
    when a consistent EOCD (and ZIP64 end record where needed) is found;
    otherwise a string saying what is wrong with an EOCD that was found but is
    inconsistent, or None when there is no EOCD signature at all.
    """
    size = fh.size
    if size < _EOCD_SIZE:
        return None
    tail_len = min(size, _EOCD_SIZE + 0xFFFF)
    tail_off = size - tail_len
    tail = fh.pread(tail_off, tail_len)
    problem = None
    i = tail.rfind(SIG_EOCD)
    while i >= 0:
        if i + _EOCD_SIZE <= len(tail):
            (_sig, disk, cd_disk, n_disk, n_total, cd_size, cd_off, clen) = struct.unpack_from(
                "<4sHHHHIIH", tail, i)
            eocd = tail_off + i
            if eocd + _EOCD_SIZE + clen <= size:
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


def _parse_central(fh: _File, cd: dict) -> Tuple[List[dict], Optional[str]]:
    """Central-directory entries (dicts) and the first problem met, if any."""
    entries: List[dict] = []
    off = cd["cd_offset"]
    end = cd["cd_offset"] + cd["cd_size"]
    # read in slabs to keep syscalls down, never more than 8 MiB at a time
    slab_off, slab = off, b""
    for idx in range(cd["n_entries"]):
        need = _CENTRAL_SIZE
        if off + need > end:
            return entries, f"entry {idx} at offset {off} runs past the end of the central directory"
        if off + need > slab_off + len(slab):
            slab_off, slab = off, fh.pread(off, min(8 << 20, end - off))
        h = slab[off - slab_off: off - slab_off + _CENTRAL_SIZE]
        if len(h) < _CENTRAL_SIZE or h[:4] != SIG_CENTRAL:
            return entries, (f"entry {idx} at offset {off} has signature {h[:4].hex(' ') or 'EOF'}, "
                             f"not 50 4b 01 02")
        (_sig, _vm, vn, flags, method, mtime, mdate, crc, csize, usize, nlen, xlen, clen, _disk, _ia, _ea,
         lho) = struct.unpack("<4sHHHHHHIIIHHHHHII", h)
        total = _CENTRAL_SIZE + nlen + xlen + clen
        if off + total > end:
            return entries, f"entry {idx} at offset {off} runs past the end of the central directory"
        if off + total > slab_off + len(slab):
            slab_off, slab = off, fh.pread(off, min(max(8 << 20, total), end - off))
        base = off - slab_off + _CENTRAL_SIZE
        name_b = slab[base: base + nlen]
        extra = slab[base + nlen: base + nlen + xlen]
        vals = {"usize": usize, "csize": csize, "lho": lho}
        want = [k for k, v in (("usize", usize), ("csize", csize), ("lho", lho)) if v == 0xFFFFFFFF]
        if want:
            _zip64_extra(extra, want, vals)
        entries.append({"name": name_b.decode("utf-8" if flags & 0x800 else "cp437", "replace"),
                        "name_bytes": name_b, "flags": flags, "method": method, "crc": crc,
                        "fixed": (vn, flags, mtime, mdate),
                        "csize": vals["csize"], "usize": vals["usize"], "lho": vals["lho"]})
        off += total
    if off != end:
        return entries, f"{end - off} bytes of the central directory are not covered by its {len(entries)} entries"
    return entries, None


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


def _read_descriptor(fh: _File, off: int, csize: int, usize: int) -> Tuple[Optional[dict], str]:
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


def _check_with_cd(fh: _File, path: str, cd: dict, rep: ZipReport, verify_crc: bool, chunk: int,
                   buf: bytearray) -> None:
    entries, problem = _parse_central(fh, cd)
    out = rep.findings
    if problem:
        out.append(findings.make("zip_central_directory_corrupted", path=path, offset=cd["cd_offset"],
                                 cd_bytes=cd["cd_size"], why=problem))
    if entries:
        first = entries[0]["name"]
        rep.prefix = first.split("/", 1)[0] if "/" in first else ""
    cd_start = cd["cd_offset"]
    n_hdr_findings = 0
    # Object storage: every local header (fixed part, name, and torch's ≤ 64-byte alignment
    # padding in the extra field, with room to spare) in one concurrent batch of GETs.  Each
    # range starts 24 bytes early: a data descriptor (flag bit 3, 16 or 24 bytes) ends where
    # the next record begins, so the previous member's descriptor comes in the same GET; the
    # last member's sits before the central directory.  Descriptors elsewhere (a gap between
    # records) are fetched in a second batch.
    fh.prefetch([(max(0, e["lho"] - 24), 24 + _LOCAL_SIZE + len(e["name_bytes"]) + 256) for e in entries]
                + [(max(0, cd_start - 24), 48)])
    if fh.fd is None and REMOTE_PREFETCH:
        dds = []
        for e in entries:
            lh = fh._prefetched(e["lho"], _LOCAL_SIZE) if e["flags"] & 8 else None
            if lh and lh[:4] == SIG_LOCAL:
                nlen, xlen = struct.unpack_from("<HH", lh, 26)
                off = e["lho"] + _LOCAL_SIZE + nlen + xlen + e["csize"]
                if fh._prefetched(off, 24) is None:
                    dds.append((off, 24))
        fh.prefetch(dds)
    for e in entries:
        name = e["name"]
        m = Member(name=name, header_offset=e["lho"], data_offset=-1, size_bytes=e["usize"], crc32=e["crc"],
                   crc_ok=None, compressed_size_bytes=e["csize"], method=e["method"], flags=e["flags"])
        rep.members.append(m)
        why = None
        lh = fh.pread(e["lho"], _LOCAL_SIZE)
        if e["lho"] + _LOCAL_SIZE > cd_start or len(lh) < _LOCAL_SIZE:
            why = f"its offset {e['lho']} lies outside the member area (central directory at {cd_start})"
        elif lh[:4] != SIG_LOCAL:
            nul = lh.count(0)
            why = (f"signature is {lh[:4].hex(' ')}, not 50 4b 03 04"
                   + (f"; {nul} of its {_LOCAL_SIZE} fixed bytes are NUL" if nul >= 8 else ""))
        else:
            (_s, lvn, lflags, lmethod, lt, ld, lcrc, lcsize, lusize, nlen, xlen) = struct.unpack(
                "<4sHHHHHIIIHH", lh)
            var = fh.pread(e["lho"] + _LOCAL_SIZE, nlen + xlen)
            lname, lextra = var[:nlen], var[nlen:]
            m.loose_data_offset = e["lho"] + _LOCAL_SIZE + nlen + xlen  # where a lenient reader starts
            xwhy = _extra_problem(lextra, xlen)
            if lname != e["name_bytes"]:
                why = (f"it names {lname.decode('utf-8', 'replace')!r} where the central directory says "
                       f"{name!r}")
            elif lmethod != e["method"]:
                why = f"compression method {lmethod} where the central directory says {e['method']}"
            elif (lvn, lflags, lt, ld) != e["fixed"]:
                why = (f"its version/flags/time/date fields {[lvn, lflags, lt, ld]} differ from the central "
                       f"directory's {list(e['fixed'])}")
            elif xwhy:
                why = xwhy
            elif (lcrc, lcsize, lusize) != (0, 0, 0) and lcsize != 0xFFFFFFFF and \
                    (lcrc, lcsize, lusize) != (e["crc"], e["csize"] & 0xFFFFFFFF, e["usize"] & 0xFFFFFFFF):
                # with flag bit 3 these are 0 (APPNOTE 4.4.4); otherwise they must match the central directory
                why = (f"it states CRC {_hex(lcrc)} / {lcsize} / {lusize} bytes where the central directory says "
                       f"{_hex(e['crc'])} / {e['csize']} / {e['usize']}")
            else:
                m.data_offset = e["lho"] + _LOCAL_SIZE + nlen + xlen
                end = m.data_offset + e["csize"]
                if end > cd_start:
                    why = (f"its data ({e['csize']} bytes from offset {m.data_offset}) runs into the central "
                           f"directory at {cd_start}")
                    m.data_offset = -1
                elif e["flags"] & 8:
                    dd, dwhy = _read_descriptor(fh, end, e["csize"], e["usize"])
                    if dd is None:
                        why = dwhy
                    elif dd["crc"] != e["crc"]:
                        why = (f"its data descriptor states CRC {_hex(dd['crc'])} where the central directory "
                               f"says {_hex(e['crc'])}")
        if why:
            m.header_ok = False
            m.complete = m.data_offset >= 0
            if n_hdr_findings < 20:
                out.append(findings.make("zip_member_header_corrupted", path=path, member=name,
                                         offset=e["lho"], why=why))
            n_hdr_findings += 1
            if m.data_offset < 0:
                continue
        if verify_crc and m.data_offset >= 0:
            _verify_member(fh, path, m, chunk, buf, out)
    # overlapping records (a damaged central directory entry pointing into another record)
    placed = sorted((m for m in rep.members if m.data_offset >= 0), key=lambda m: m.header_offset)
    for a, b in zip(placed, placed[1:]):
        if a.data_offset + a.compressed_size_bytes > b.header_offset:
            out.append(findings.make("zip_central_directory_corrupted", path=path, offset=cd["cd_offset"],
                                     cd_bytes=cd["cd_size"],
                                     why=f"records {a.name!r} and {b.name!r} overlap"))
            break
    rep.intact_members = [m.name for m in rep.members if m.header_ok and m.crc_ok is not False]
    _missing_data_pkl(path, rep)
    _load_data_pkl(fh, rep)


def _verify_member(fh: _File, path: str, m: Member, chunk: int, buf: bytearray, out: List[Finding]) -> None:
    if m.crc32 == 0 and m.size_bytes > 0:
        return  # CRC not recorded (torch compute_crc32=False writes 0): cannot verify
    if m.method == 0:
        crc, got = fh.crc(m.data_offset, m.compressed_size_bytes, chunk, buf)
    elif m.method == 8:
        crc, got = _crc_deflated(fh, m, chunk)
        if got is None:
            m.crc_ok = False
            out.append(findings.make("zip_crc_mismatch", path=path, member=m.name, expected=_hex(m.crc32),
                                     actual="(does not inflate)", tensor_text=_tensor_text(m.name)))
            return
    else:
        return
    m.crc_ok = crc == m.crc32 and got == m.size_bytes
    if not m.crc_ok:
        span = _longest_zero_run(fh, m.data_offset, m.compressed_size_bytes, chunk)
        if span and span[1] >= MIN_ZERO_SPAN_BYTES:
            out.append(findings.make("zero_filled_span", path=path, zero_bytes=span[1], offset=span[0],
                                     member=m.name))
        out.append(findings.make("zip_crc_mismatch", path=path, member=m.name, expected=_hex(m.crc32),
                                 actual=_hex(crc), tensor_text=_tensor_text(m.name)))


def _tensor_text(name: str) -> str:
    mm = re.search(r"(?:^|/)data/(\w+)$", name)
    return f" (the bytes of storage {mm.group(1)})" if mm else ""


def _crc_deflated(fh: _File, m: Member, chunk: int) -> Tuple[int, Optional[int]]:
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
                crc = zlib.crc32(piece, crc)
                total += len(piece)
                if not d.unconsumed_tail:
                    break
                piece = d.decompress(d.unconsumed_tail, chunk)
        piece = d.flush()
        crc = zlib.crc32(piece, crc)
        total += len(piece)
    except zlib.error:
        return 0, None
    return crc, total


def _longest_zero_run(fh: _File, off: int, n: int, chunk: int) -> Optional[Tuple[int, int]]:
    from .sniff import zero_runs

    runs = zero_runs(fh.path, min_run=64, chunk=chunk, start=off, end=off + n)
    return max(runs, key=lambda r: r[1]) if runs else None


def _missing_data_pkl(path: str, rep: ZipReport) -> None:
    names = [m.name for m in rep.members]
    want = f"{rep.prefix}/data.pkl" if rep.prefix else "data.pkl"
    if want in names:
        return
    elsewhere = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if elsewhere:
        why = (f"the first record puts the archive under {rep.prefix!r} (torch reads the folder name from it) "
               f"but data.pkl is at {elsewhere[0]!r}")
    else:
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        why = f"none of its {len(names)} records is named {want} (records: {shown})"
    rep.findings.append(findings.make("zip_missing_record", path=path, member=want, why=why))


def _load_data_pkl(fh: _File, rep: ZipReport) -> None:
    want = f"{rep.prefix}/data.pkl" if rep.prefix else "data.pkl"
    m = next((m for m in rep.members if m.name == want), None)
    start = -1 if m is None else m.data_offset if m.data_offset >= 0 else m.loose_data_offset
    if m is None or start < 0:
        return
    if m.size_bytes > MAX_DATA_PKL_BYTES or m.compressed_size_bytes > MAX_DATA_PKL_BYTES:
        return
    raw = fh.pread(start, m.compressed_size_bytes)
    whole = len(raw) == m.compressed_size_bytes
    if m.method == 8:
        try:
            d = zlib.decompressobj(-15)
            raw = d.decompress(raw, MAX_DATA_PKL_BYTES + 1)
        except zlib.error:
            return
        if len(raw) > MAX_DATA_PKL_BYTES:
            return
    elif m.method != 0:
        return
    rep.data_pkl_any = raw
    if whole and m.complete and m.data_offset >= 0 and m.crc_ok is not False:
        rep.data_pkl = raw


# ---------------------------------------------------- no central directory: walk


def _scan_descriptor(fh: _File, data_offset: int, chunk: int) -> Optional[dict]:
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
            ok_len = 0
            if len(dd) >= 16:
                _c, c32, u32 = struct.unpack_from("<III", dd, 4)
                if c32 == length and u32 == length:
                    ok_len = 16
            if not ok_len and len(dd) >= 24:
                _c, c64, u64 = struct.unpack_from("<IQQ", dd, 4)
                if c64 == length and u64 == length:
                    ok_len = 24
            if ok_len or len(dd) < 16:
                crc_here = zlib.crc32(bufb[:i], crc)
                stored = struct.unpack_from("<I", dd, 4)[0] if len(dd) >= 8 else None
                if ok_len:
                    return {"size": length, "crc_stored": stored, "crc_actual": crc_here, "dd_len": ok_len}
                if stored is not None and stored == crc_here:
                    return {"partial": True, "size": length, "crc_stored": stored, "crc_actual": crc_here,
                            "dd_len": len(dd)}
            i = bufb.find(SIG_DESCRIPTOR, i + 1)
        keep = min(3, len(bufb))
        crc = zlib.crc32(bufb[: len(bufb) - keep], crc)
        done += len(bufb) - keep
        carry = bufb[len(bufb) - keep:]
    return None


def _trailing_zero_start(fh: _File, chunk: int) -> int:
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


def _walk_local(fh: _File, verify_crc: bool, chunk: int, buf: bytearray) -> dict:
    """Walk local headers from offset 0.  Returns what was found and where it stopped."""
    size = fh.size
    pos = 0
    members: List[Member] = []
    st = {"members": members, "stop": "eof_between", "stop_at": 0, "cut_member": None,
          "cut_data_offset": None, "cd_entries": 0, "reached_cd": False}
    while True:
        st["stop_at"] = pos
        if pos >= size:
            st["stop"] = "eof_between" if not st["reached_cd"] else "eof_in_end_records"
            return st
        sig = fh.pread(pos, 4)
        if sig == SIG_LOCAL:
            h = fh.pread(pos, _LOCAL_SIZE)
            if len(h) < _LOCAL_SIZE:
                st["stop"] = "eof_in_header"
                return st
            (_s, _v, flags, method, _t, _d, crc, csize, usize, nlen, xlen) = struct.unpack("<4sHHHHHIIIHH", h)
            name_b = fh.pread(pos + _LOCAL_SIZE, nlen)
            name = name_b.decode("utf-8" if flags & 0x800 else "cp437", "replace")
            st["cut_member"] = name
            extra = fh.pread(pos + _LOCAL_SIZE + nlen, xlen)
            if len(name_b) < nlen or len(extra) < xlen:
                st["stop"] = "eof_in_header"
                return st
            vals = {"usize": usize, "csize": csize}
            want = [k for k, v in (("usize", usize), ("csize", csize)) if v == 0xFFFFFFFF]
            if want:
                _zip64_extra(extra, want, vals)
            data_offset = pos + _LOCAL_SIZE + nlen + xlen
            st["cut_data_offset"] = data_offset
            m = Member(name=name, header_offset=pos, data_offset=data_offset, size_bytes=vals["usize"],
                       crc32=crc, compressed_size_bytes=vals["csize"], method=method, flags=flags,
                       complete=False)
            deferred = bool(flags & 8) and vals["csize"] == 0
            if deferred:
                if method != 0:
                    st["stop"] = "unsupported"
                    return st
                found = _scan_descriptor(fh, data_offset, chunk)
                if found is None:
                    st["stop"] = "eof_in_data"
                    return st
                m.size_bytes = m.compressed_size_bytes = found["size"]
                m.crc32 = found["crc_stored"] if found["crc_stored"] is not None else 0
                m.crc_actual = found["crc_actual"]
                m.crc_ok = found["crc_actual"] == found["crc_stored"]
                if found.get("partial"):
                    st["stop"] = "eof_in_descriptor"
                    m.complete = True
                    members.append(m)
                    return st
                m.complete = True
                members.append(m)
                pos = data_offset + found["size"] + found["dd_len"]
            else:
                end = data_offset + vals["csize"]
                if end > size:
                    st["stop"] = "eof_in_data"
                    return st
                m.complete = True
                if verify_crc and method == 0 and crc:
                    c, _got = fh.crc(data_offset, vals["csize"], chunk, buf)
                    m.crc_actual = c
                    m.crc_ok = c == crc
                members.append(m)
                pos = end
                if flags & 8:
                    dd, _why = _read_descriptor(fh, end, vals["csize"], vals["usize"])
                    if dd is None:
                        st["stop_at"] = end
                        st["stop"] = "bad_descriptor"
                        return st
                    pos += dd["length"]
            continue
        if sig == SIG_CENTRAL:
            st["reached_cd"] = True
            h = fh.pread(pos, _CENTRAL_SIZE)
            if len(h) < _CENTRAL_SIZE:
                st["stop"] = "eof_in_end_records"
                return st
            nlen, xlen, clen = struct.unpack_from("<HHH", h, 28)
            if pos + _CENTRAL_SIZE + nlen + xlen + clen > size:
                st["stop"] = "eof_in_end_records"
                return st
            st["cd_entries"] += 1
            pos += _CENTRAL_SIZE + nlen + xlen + clen
            continue
        if sig == SIG_ZIP64_EOCD and st["reached_cd"]:
            h = fh.pread(pos, 12)
            if len(h) < 12:
                st["stop"] = "eof_in_end_records"
                return st
            pos += 12 + struct.unpack_from("<Q", h, 4)[0]
            continue
        if sig == SIG_ZIP64_LOCATOR and st["reached_cd"]:
            pos += 20
            continue
        if sig == SIG_EOCD and st["reached_cd"]:
            if pos + _EOCD_SIZE > size:
                st["stop"] = "eof_in_end_records"
                st["eocd_missing_bytes"] = pos + _EOCD_SIZE - size
            else:
                st["stop"] = "eocd_inconsistent"
            return st
        if len(sig) < 4:
            st["stop"] = "eof_in_header" if not st["reached_cd"] else "eof_in_end_records"
            return st
        st["stop"] = "nul" if sig == b"\0\0\0\0" else "garbage"
        return st


def _storages_from_pkl(data_pkl: Optional[bytes]) -> Optional[Dict[str, int]]:
    """Storage key -> nbytes from a static walk of data.pkl (None if it cannot tell)."""
    if not data_pkl:
        return None
    try:
        from ..pickle_walk import walk

        res = walk(data_pkl)
    except Exception:  # the walker is someone else's code: a failure there only costs detail
        return None
    if res.error:
        return None
    out: Dict[str, int] = {}
    for key, ref in res.storages.items():
        nb = ref.nbytes
        if nb is None or not ref.itemsize:
            return None
        out[str(key)] = nb
    return out


def _check_without_cd(fh: _File, path: str, rep: ZipReport, verify_crc: bool, chunk: int, buf: bytearray,
                      cd_problem: Optional[str]) -> None:
    size = fh.size
    st = _walk_local(fh, verify_crc, chunk, buf)
    members: List[Member] = st["members"]
    rep.members = members
    first = members[0].name if members else (st["cut_member"] or "")
    rep.prefix = first.split("/", 1)[0] if "/" in first else ""
    pkl_name = f"{rep.prefix}/data.pkl" if rep.prefix else "data.pkl"
    pkl = next((m for m in members if m.name == pkl_name), None)
    if pkl is not None and pkl.crc_ok is not False and pkl.size_bytes <= MAX_DATA_PKL_BYTES:
        raw = fh.pread(pkl.data_offset, pkl.size_bytes)
        if len(raw) == pkl.size_bytes and pkl.method == 0:
            rep.data_pkl = raw
    rep.intact_members = [m.name for m in members if m.complete and m.crc_ok is not False]
    storages = _storages_from_pkl(rep.data_pkl)
    out = rep.findings
    for m in members:
        if m.crc_ok is False:
            out.append(findings.make("zip_crc_mismatch", path=path, member=m.name, expected=_hex(m.crc32),
                                     actual=_hex(m.crc_actual), tensor_text=_tensor_text(m.name)))

    stop = st["stop"]
    zstart = _trailing_zero_start(fh, chunk)
    zlen = size - zstart
    stop_at = st["stop_at"]
    # (1) the whole record area walked, the central directory present, the end record damaged
    if st["reached_cd"] and st["cd_entries"] == len(members) and stop == "eocd_inconsistent":
        out.append(findings.make("zip_central_directory_corrupted", path=path, offset=stop_at,
                                 why=cd_problem or "the end-of-central-directory record is inconsistent"))
        rep.cut_offset = stop_at
        return
    zero_fill, definite = _decide_tail(st, storages, rep.prefix, zstart, zlen, size)
    intact_text, missing_text = _describe_cut(st, members, rep.prefix, storages, size, zero_fill, zstart)
    if zero_fill:
        rep.cut_offset = zstart
        out.insert(0, findings.make("zero_filled_tail", path=path, zero_bytes=zlen, offset=zstart,
                                    intact_text=intact_text, evidence="definite" if definite else "heuristic"))
        if definite:
            return
    else:
        rep.cut_offset = size
    if stop in ("nul", "garbage") and not zero_fill and not st["reached_cd"]:
        what = "NUL bytes" if stop == "nul" else f"bytes {fh.pread(stop_at, 4).hex(' ')}"
        intact_text += f" The bytes at offset {stop_at}, where the next record header should be, are {what}."
    out.append(findings.make("truncated_zip_no_central_directory", path=path, size_bytes=size,
                             missing_text=missing_text, intact_text=intact_text,
                             n_records_intact=len(rep.intact_members)))


def _decide_tail(st: dict, storages: Optional[Dict[str, int]], prefix: str, zstart: int, zlen: int,
                 size: int) -> Tuple[bool, bool]:
    """Is the end of the file zero-filled rather than cut?  Returns ``(zero_fill, definite)``.

    A cut file ends wherever the writer stopped, possibly inside an all-zero
    tensor; a zero-filled file (size committed, blocks never written) has NUL
    bytes where later records' headers must be.  Definite evidence: the walk
    stopped on NUL where a header or data descriptor must start and the NULs run
    to EOF; or data.pkl (statically walked) says how long the record being read
    is, and the file holds NULs past that end.  Without either, a trailing NUL
    run of at least :data:`MIN_ZERO_TAIL_BYTES` is reported as a zero-filled
    tail *as well as* the truncation (``definite`` False).
    """
    if zlen < 64:
        return False, False
    if st["stop"] in ("nul", "bad_descriptor") and st["stop_at"] >= zstart:
        return True, True
    if st["stop"] == "eof_in_data" and st["cut_member"] and storages is not None:
        key = _strip(st["cut_member"], prefix)
        mm = re.fullmatch(r"data/(\w+)", key)
        if mm and mm.group(1) in storages and st["cut_data_offset"] is not None:
            expected_end = st["cut_data_offset"] + storages[mm.group(1)]
            if expected_end < size:
                return expected_end >= zstart, True
            return False, True
    return zlen >= MIN_ZERO_TAIL_BYTES, False


def _describe_cut(st: dict, members: List[Member], prefix: str, storages: Optional[Dict[str, int]], size: int,
                  zero_fill: bool, zstart: int) -> Tuple[str, str]:
    complete = [m.name for m in members if m.complete]
    n_total = "?"
    stop = st["stop"]
    at = zstart if zero_fill else size
    cut_name = _strip(st["cut_member"], prefix) if st["cut_member"] else None
    if st.get("eocd_missing_bytes"):
        n_total = str(len(members))
        where = "the end-of-central-directory record"
    elif st["reached_cd"]:
        n_total = str(len(members))
        where = (f"the central directory or end records ({st['cd_entries']} of {len(members)} central "
                 f"directory entries are complete)")
    elif stop == "eof_in_data" and cut_name:
        where = f"the data of {cut_name} (which starts at byte {st['cut_data_offset']})"
    elif stop == "eof_in_header":
        where = f"the local header of {cut_name}" if cut_name else "a local header"
    elif stop == "eof_in_descriptor":
        where = f"the data descriptor of {cut_name}"
    elif stop == "bad_descriptor":
        where = f"the data descriptor of {cut_name}"
    elif stop == "unsupported":
        where = f"{cut_name}, a compressed record whose size only its (missing) data descriptor states,"
    else:
        where = "the gap between records"
    lead = "the zero fill starts inside" if zero_fill else "the cut falls inside"
    if complete:
        of_total = f" of {n_total}" if n_total != "?" else ""
        intact = (f"The first {len(complete)}{of_total} records ({_names_text(complete, prefix)}) are "
                  f"complete; {lead} {where} at byte {at}.")
    else:
        intact = f"No record is complete; {lead} {where} at byte {at}."
    missing = ""
    if storages is not None:
        have = {m.name for m in members if m.complete}
        pre = f"{prefix}/" if prefix else ""
        n_ok = sum(1 for k in storages if f"{pre}data/{k}" in have)
        lost = sum(nb for k, nb in storages.items() if f"{pre}data/{k}" not in have)
        if stop == "eof_in_data" and cut_name and cut_name.startswith("data/") and st["cut_data_offset"] is not None:
            lost -= max(0, at - st["cut_data_offset"])
        intact += f" {n_ok} of the {len(storages)} storages named in data.pkl are intact."
        if lost > 0:
            missing = f" (at least {lost} bytes of tensor data are missing, and the central directory)"
        elif st["reached_cd"]:
            missing = " (all tensor data is present; only the archive's closing records are missing)"
    elif st["reached_cd"]:
        missing = " (all records are present; only the archive's closing records are missing)"
    if st.get("eocd_missing_bytes"):
        k = st["eocd_missing_bytes"]
        missing = (f" (only the last {k} of that record's 22 bytes {'are' if k != 1 else 'is'} missing; every "
                   f"record and the central directory are complete)")
    return intact, missing
