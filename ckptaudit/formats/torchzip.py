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

The machinery is in :mod:`ckptaudit.formats.zip` (``reader``, ``central``, ``crc``, ``crc_finding``,
``cut``, ``storages``); this module holds the tunables, the report and the entry points, which run the
checks and put their findings in order.  Each finding is built once, naming the ``display`` path it is
given, by the builder in the module that decides it (``zip.central``, ``zip.crc_finding``, ``zip.cut``,
``zip.storages``, ``zeros``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import fs
from ..findings import Finding
from . import zeros
from .sniff import generic_findings, sniff
from .zip.central import (find_central_directory, header_problem, overlapping_records, parse_central,
                          prefetch_headers, END_RECORD_ALONE, cd_corrupted, iter_central, member_header_corrupted,
                          missing_data_pkl, missing_record)
from .zip.crc import load_data_pkl, longest_zero_run, member_crc
from .zip.crc_finding import crc_mismatch
from .zip.cut import decide_tail, describe_cut, trailing_zero_start, walk_local, truncated
from .zip.reader import Member, ArchiveFile, hex32
from .zip.records import Records
from .zip.storages import check_storages  # noqa: F401 - re-exported: an entry point of the zip checks

#: Largest data.pkl kept in memory, bytes (a 10k-tensor model has a few MB).
MAX_DATA_PKL_BYTES = 256 << 20
#: Least bytes one small ranged GET of a remote archive fetches (and keeps for the reads that
#: follow): 64 KiB costs ~1 ms more transfer at 100 MB/s than 256 bytes, against 10–30 ms of
#: latency per GET saved whenever the next local header lies within it.
REMOTE_WINDOW_BYTES = 64 << 10
#: Fetch the local headers and data descriptors of a remote archive (:meth:`ArchiveFile.prefetch`),
#: and the values of its small tensors (``layouts.scan_file``), in concurrent batches of ranged
#: GETs; False reads each with its own GET (kept for benchmarks/bench_s3.py --no-prefetch).
REMOTE_PREFETCH = True
#: Longest NUL run inside a member that fails its CRC before it is reported as
#: a zeroed block (``zero_filled_span``), bytes: one filesystem block.
MIN_ZERO_SPAN_BYTES = 4096
#: Trailing NUL bytes from which a file without central directory is reported
#: as zero-filled when data.pkl cannot tell (see :func:`decide_tail`), bytes.
MIN_ZERO_TAIL_BYTES = 4096


@dataclass
class ZipReport:
    """What :func:`check_zip` found.

    ``prefix`` is the archive folder (``'ckpt'`` for ``ckpt/data.pkl``);
    ``data_pkl`` the bytes of ``<prefix>/data.pkl`` when that record is intact
    and at most :data:`MAX_DATA_PKL_BYTES`; ``members`` the records in archive order, as columns
    (:class:`ckptaudit.formats.zip.records.Records`: a record per tensor storage costs no object);
    ``intact_members`` the names whose header (and CRC, when checked) are fine; ``cut_offset`` the byte where the
    readable archive ends when the file was cut short or zero-filled, else None.
    ``data_pkl_any`` the bytes of that record as far as they can be read even when
    its CRC or local header is wrong (for the security walk only: a loader that
    ignores the CRC still unpickles them).
    """

    members: Records = field(default_factory=Records)
    prefix: str = ""
    has_central_directory: bool = False
    data_pkl: Optional[bytes] = None
    data_pkl_any: Optional[bytes] = None
    findings: List[Finding] = field(default_factory=list)
    intact_members: Sequence[str] = field(default_factory=list)
    cut_offset: Optional[int] = None


# ------------------------------------------------------------------ public API

#: ``tensor_names`` of :func:`check_zip`: (data.pkl's bytes, the zip's number of records) -> {storage key: names
#: of the tensors it holds}
TensorNames = Callable[[bytes, int], Mapping[str, Sequence[str]]]


def check_zip(path, *, display: Optional[str] = None, verify_crc: bool = True, chunk: int = 1 << 20,
              tensor_names: Optional[TensorNames] = None, facts=None) -> ZipReport:
    """Audit the zip structure of a torch.save archive at ``path``.

    With an end-of-central-directory record: every central-directory entry's
    local header is checked against it, data descriptors are checked, and with
    ``verify_crc`` every record's data is streamed once (``chunk`` bytes at a
    time) through CRC32.  Without one: local headers are walked from offset 0
    (record ends found through their data descriptors) to say where the file
    ends and which records are complete, and a zero-filled tail is told apart
    from a cut (see :func:`decide_tail`).  The findings name ``display``
    (default: ``path``).  ``tensor_names``, when given, is called once with
    data.pkl's bytes and the number of records when data.pkl is intact (before the findings are built),
    so that a storage record failing its CRC names the tensors it holds.
    With ``facts`` at a depth without tensor bytes (``facts.tensor_bytes`` false: the reader's run pass,
    :data:`ckptaudit.fs.read_depth.METADATA_ONLY`) ``verify_crc`` is off.  ``facts`` (the hash stage's
    :class:`ckptaudit.onepass.facts.ByteFacts`) answer for the records' CRC32s and NUL runs its pass computed,
    and the bytes it kept (``facts.kept``) for the reads.
    Memory: O(chunk) plus the central directory entries and data.pkl.  Never
    raises on bad content; OSError only when the file cannot be opened.
    """
    path = fs.fspath(path)
    shown = path if display is None else display
    verify_crc = verify_crc and (facts is None or facts.tensor_bytes)  # the reader's run pass reads metadata only
    rep = ZipReport()
    kept = None if facts is None else facts.kept
    s = sniff(path, kept=kept)
    if s.kind in ("empty", "all_zero"):
        rep.findings = generic_findings(s, shown)
        return rep
    pre: List[Finding] = []
    zip_like = s.kind in ("torch_zip", "zip", "npz")
    if not zip_like:
        pre = zeros.head(shown, s.detail.get("zero_head_bytes"), s.size_bytes) or generic_findings(s, shown)
    fh = ArchiveFile(path, window=REMOTE_WINDOW_BYTES, prefetch=REMOTE_PREFETCH,  # read now: benchmarks and tests set them
                     facts=facts, kept=kept, whole=verify_crc)  # every record checked: a small file read at once
    try:
        buf = bytearray(max(4096, chunk))
        # a local file read whole, with the hash stage's CRC-32s: a clean file of its layout may answer for its
        # records (zip/same_layout.py), compared where the check reads
        same = verify_crc and facts is not None and fh.whole_bytes() is not None
        fh.reads = [] if same else None
        cd = find_central_directory(fh, END_RECORD_ALONE if same else None)
        if isinstance(cd, dict):
            rep.has_central_directory = True
            _check_with_cd(fh, shown, cd, rep, verify_crc, chunk, buf, tensor_names, same)
            rep.findings[:0] = pre
        elif not zip_like:
            rep.findings = pre or [missing_record(
                shown, "end-of-central-directory",
                f"the file is not a zip archive at all: it is {s.kind!r} by its first bytes ({s.head[:8].hex(' ')})")]
        else:
            _check_without_cd(fh, shown, rep, verify_crc, chunk, buf, cd, tensor_names)
            rep.findings[:0] = [p for p in pre if p.kind == "zero_filled_head"]
    finally:
        fh.close()
    return rep


# ------------------------------------------------------ findings of the checks


def _names(rep: ZipReport, tensor_names: Optional[TensorNames]) -> Mapping[str, Sequence[str]]:
    """{storage key: tensor names} from data.pkl, for the CRC findings ({} without it or without a walker)."""
    if tensor_names is None or rep.data_pkl is None:
        return {}
    return tensor_names(rep.data_pkl, len(rep.members))


def _check_with_cd(fh: ArchiveFile, display: str, cd: dict, rep: ZipReport, verify_crc: bool, chunk: int,
                   buf: bytearray, tensor_names: Optional[TensorNames], same: bool = False) -> None:
    """Check every central-directory entry (local header, data descriptor, CRC), load data.pkl, then
    build the findings in archive order.  ``same``: a clean file of the same layout may answer for the records
    (:mod:`.zip.same_layout`; ``fh.reads`` logs the reads), and a clean file is kept as one."""
    from .zip import same_layout

    cd_start = cd["cd_offset"]
    problems: List[str] = []
    checked, problem, overlap = [], None, None
    if not (same and same_layout.follow(fh, rep)):
        if fh.fd is None:  # remote: every local header is fetched in batches first (needs every entry)
            entries, problem = parse_central(fh, cd)
            prefetch_headers(fh, entries, cd_start)
        else:  # local: one entry at a time (a 200,000-member archive holds no list of entries)
            entries, problem = iter_central(fh, cd, problems), None
        checked = _check_entries(fh, entries, rep, cd_start, verify_crc, chunk, buf)
        del entries
        problem = problem or (problems[0] if problems else None)
        # overlapping records (a damaged central directory entry pointing into another record)
        overlap = overlapping_records(rep.members)
        if same:
            same_layout.keep(fh, cd_start, fh.reads, rep, not (problem or checked or overlap))
    fh.reads = None
    rep.intact_members = rep.members.names_where(rep.members.intact_rows())
    load_data_pkl(fh, rep, MAX_DATA_PKL_BYTES)
    names = _names(rep, tensor_names)

    out = rep.findings
    if problem:
        out.append(cd_corrupted(display, cd["cd_offset"], problem, cd_bytes=cd["cd_size"]))
    out.extend(_member_findings(display, checked, rep.prefix, names))
    if overlap:
        a, b = overlap
        out.append(cd_corrupted(display, cd["cd_offset"], f"records {a.name!r} and {b.name!r} overlap",
                                cd_bytes=cd["cd_size"]))
    f = missing_data_pkl(display, rep.members.names, rep.prefix)
    if f is not None:
        out.append(f)


def _check_entries(fh: ArchiveFile, entries, rep: ZipReport, cd_start: int, verify_crc: bool, chunk: int,
                   buf: bytearray) -> list:
    """Each central-directory entry as a record of ``rep.members``, its local header and (with ``verify_crc``) its
    CRC checked first (the :class:`Member` is added once they set its fields); returns ``(member, why its header is damaged, CRC result of
    :func:`_verify_member`)`` of the damaged records only."""
    checked = []
    for e in entries:
        if not rep.members:
            rep.prefix = e["name"].split("/", 1)[0] if "/" in e["name"] else ""
        m = Member(name=e["name"], header_offset=e["lho"], data_offset=-1, size_bytes=e["usize"], crc32=e["crc"],
                   crc_ok=None, compressed_size_bytes=e["csize"], method=e["method"], flags=e["flags"])
        why = header_problem(fh, e, m, cd_start)
        if why:
            m.header_ok = False
            m.complete = m.data_offset >= 0
        crc = _verify_member(fh, m, chunk, buf) if verify_crc and m.data_offset >= 0 else None
        rep.members.append(m)
        if why or crc is not None:
            checked.append((m, why, crc))
    return checked


def _member_findings(display: str, checked: list, prefix: str, names: Mapping[str, Sequence[str]]) -> List:
    """Findings of the damaged records, in archive order: a damaged local header (the first 20 named) and a
    record's CRC mismatch (with its longest NUL run as a fact to compare: zeros may be genuine values)."""
    out = []
    n_hdr_findings = 0
    for m, why, crc in checked:
        if why:
            if n_hdr_findings < 20:
                out.append(member_header_corrupted(display, m.name, m.header_offset, why))
            n_hdr_findings += 1
        if crc is not None:
            actual, span = crc  # a zero run inside a record whose CRC fails is told with the CRC, not as a cause
            nul = span if span and span[1] >= MIN_ZERO_SPAN_BYTES else None
            out.append(crc_mismatch(display, m.name, hex32(m.crc32), actual, prefix, names, nul))
    return out


def _verify_member(fh: ArchiveFile, m: Member, chunk: int, buf: bytearray) -> Optional[Tuple[str, Optional[tuple]]]:
    """CRC32 of record ``m`` against the stored one (sets ``m.crc_ok``).  None when it matches or cannot be
    checked; for a mismatch ``(computed CRC text, (offset, length) of the longest NUL run in it or None)``."""
    got = member_crc(fh, m, chunk, buf)
    if got is None:
        return None  # CRC not recorded, or a method other than stored/deflated: cannot verify
    crc, n = got
    if n is None:
        m.crc_ok = False
        return "(does not inflate)", None
    m.crc_ok = crc == m.crc32 and n == m.size_bytes
    if m.crc_ok:
        return None
    return hex32(crc), longest_zero_run(fh, m.data_offset, m.compressed_size_bytes, chunk)


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


def _check_without_cd(fh: ArchiveFile, display: str, rep: ZipReport, verify_crc: bool, chunk: int, buf: bytearray,
                      cd_problem: Optional[str], tensor_names: Optional[TensorNames]) -> None:
    sizes = _storage_sizes(fh)
    st = walk_local(fh, verify_crc, chunk, buf, expected_size=sizes)
    members: List[Member] = st["members"]
    rep.members = Records.of(members)
    first = members[0].name if members else (st["cut_member"] or "")
    rep.prefix = first.split("/", 1)[0] if "/" in first else ""
    rep.data_pkl = _walked_data_pkl(fh, members, rep.prefix)
    rep.intact_members = [m.name for m in members if m.complete and m.crc_ok is not False]
    storages = sizes.known[rep.prefix] if rep.prefix in sizes.known else _storages_from_pkl(rep.data_pkl)
    names = _names(rep, tensor_names)
    out = rep.findings
    for m in members:
        if m.crc_ok is False:
            out.append(crc_mismatch(display, m.name, hex32(m.crc32), hex32(m.crc_actual), rep.prefix, names))

    _cut_findings(fh, display, rep, st, storages, cd_problem, chunk)


def _storage_sizes(fh: ArchiveFile) -> Callable[[str, List[Member]], Optional[int]]:
    """The ``expected_size`` of :func:`walk_local` for a torch zip: a ``<prefix>/data/<key>`` record holds the
    bytes data.pkl declares for storage ``key`` (torch writes data.pkl first, so it is walked before them)."""
    known: Dict[str, Optional[Dict[str, int]]] = {}

    def expected(name: str, members: List[Member]) -> Optional[int]:
        prefix, sep, key = ("", "data/", name[5:]) if name.startswith("data/") else name.partition("/data/")
        if not sep or "/" in key:
            return None
        if prefix not in known:
            known[prefix] = _storages_from_pkl(_walked_data_pkl(fh, members, prefix))
        sizes = known[prefix]
        return sizes.get(key) if sizes else None
    expected.known = known  # type: ignore[attr-defined]  # the walks of data.pkl, for the caller to reuse
    return expected


def _walked_data_pkl(fh: ArchiveFile, members: List[Member], prefix: str) -> Optional[bytes]:
    """data.pkl's bytes when the walk found its record whole, stored and within :data:`MAX_DATA_PKL_BYTES`."""
    pkl_name = f"{prefix}/data.pkl" if prefix else "data.pkl"
    pkl = next((m for m in members if m.name == pkl_name), None)
    if pkl is None or pkl.crc_ok is False or pkl.size_bytes > MAX_DATA_PKL_BYTES:
        return None
    raw = fh.pread(pkl.data_offset, pkl.size_bytes)
    return raw if len(raw) == pkl.size_bytes and pkl.method == 0 else None


def _cut_findings(fh: ArchiveFile, display: str, rep: ZipReport, st: dict, storages, cd_problem: Optional[str],
                  chunk: int) -> None:
    """Where and how the archive without a usable central directory ends (``st``: :func:`walk_local`'s):
    a damaged end record, a zero-filled tail, or a cut; into ``rep.findings`` and ``rep.cut_offset``."""
    out, size, members = rep.findings, fh.size, st["members"]
    stop = st["stop"]
    zstart = trailing_zero_start(fh, chunk)
    zlen = size - zstart
    stop_at = st["stop_at"]
    # (1) the whole record area walked, the central directory present, the end record damaged
    if st["reached_cd"] and st["cd_entries"] == len(members) and stop == "eocd_inconsistent":
        out.append(cd_corrupted(display, stop_at, cd_problem or "the end-of-central-directory record is inconsistent"))
        rep.cut_offset = stop_at
        return
    zero_fill, definite = decide_tail(st, storages, rep.prefix, zstart, zlen, size, MIN_ZERO_TAIL_BYTES)
    intact_text, missing_text = describe_cut(st, members, rep.prefix, storages, size, zero_fill, zstart)
    if zero_fill:
        rep.cut_offset = zstart
        out.insert(0, zeros.tail(display, zlen, zstart, intact_text=intact_text,
                                 evidence="definite" if definite else "heuristic"))
        if definite:
            return
    else:
        rep.cut_offset = size
    if stop in ("nul", "garbage") and not zero_fill and not st["reached_cd"]:
        what = "NUL bytes" if stop == "nul" else f"bytes {fh.pread(stop_at, 4).hex(' ')}"
        intact_text += f" The bytes at offset {stop_at}, where the next record header should be, are {what}."
    out.append(truncated(display, size, missing_text, intact_text, len(rep.intact_members)))
