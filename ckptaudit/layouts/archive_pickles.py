"""The pickles in every record of a zip archive, not only its data.pkl: found by their bytes, walked, judged.

``torch.load`` unpickles only ``<folder>/data.pkl`` of a zip (torch/serialization.py ``_load``), but an archive
can carry more pickles: a ``.pkl`` beside data.pkl, ``extra/…`` files, a pickle under any name, a second
folder; a TorchScript archive holds ``constants.pkl`` and ``code/**.debug_pkl``.  Tools that extract an
archive and unpickle its records would run them, so picklescan and modelscan look at them too.  Here a record
is a pickle when its name ends in ``.pkl``/``.pickle`` or its bytes start with the protocol opcode
(``\\x80`` + protocol 2..5, pickle.py ``PROTO``); it is read from the archive (stored or deflated, never
extracted to disk), walked statically (:func:`ckptaudit.pickle_walk.walk`, every stream) and judged by the
loader that reads it (:func:`judge`):

* a TorchScript archive's data.pkl, constants.pkl and ``.debug_pkl`` records: by
  :func:`ckptaudit.security.torchscript.scan` (the C++ unpickler imports no Python global);
* the data.pkl ``torch.load`` reads: by :func:`ckptaudit.security.scan` under the producer's resume loader
  (:func:`ckptaudit.security.resume.resume_load`);
* any other record: no loader the audit knows unpickles it (:data:`NOT_LOADED`): a dangerous import is still
  ``malicious_pickle_code_exec``, an unknown one a warning, as for NumPy object arrays.

Bounds: at most :data:`MAX_MEMBERS` records of one archive are looked at (:data:`HEAD_BYTES` each), at most
:data:`ckptaudit.layouts.scan_file.SWEEP_BYTES` of pickle bytes are read from one archive in all, and the
storage records ``<folder>/data/<n>`` of a torch archive are skipped by name: torch reads them as raw tensor
bytes (``get_storage_from_record``), never as a pickle, and float bytes may start like one.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Collection, List, Optional

from .. import security
from ..security import resume as security_resume, torchscript as security_torchscript
from ..pickle_walk import WalkResult, walk
from ..security.resume import ResumeLoad
from .result import UnitScan

__all__ = ["HEAD_BYTES", "MAX_MEMBERS", "NOT_LOADED", "is_pickle", "judge", "scan_zip_members", "torchscript_of"]

#: Records of one archive looked at, at most.
MAX_MEMBERS = 10_000
#: Bytes of a record's head read (inflated, for a deflated record) to tell whether it is a pickle.
HEAD_BYTES = 64
#: How a record nobody unpickles is judged: dangerous imports stay errors, unknown ones warnings.
NOT_LOADED = ResumeLoad("no loader the audit knows unpickles this record: torch.load reads only the archive's "
                        "data.pkl, torch.jit.load only data.pkl, constants.pkl and code/**.debug_pkl", never=True)
_STORAGE_RECORD = re.compile(r"^(?:[^/]+/)?data/\d+$")


def is_pickle(name: str, head: bytes) -> bool:
    """Whether record ``name`` whose first bytes are ``head`` is taken for a pickle: a ``.pkl``/``.pickle``
    name (any protocol), or a protocol 2..5 header ``\\x80 <protocol>`` (pickle.py ``PROTO``, as
    :func:`ckptaudit.formats.sniff.sniff` tells a pickle file)."""
    if name.lower().endswith((".pkl", ".pickle")):
        return True
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def judge(scan: UnitScan, rel: str, member: str, streams: WalkResult, allowed: List[str], *, prefix: str,
          torchscript: Optional[Collection[str]], data_pkl: bool) -> None:
    """Judge the walked pickle of record ``member`` of archive ``rel`` (``streams``: every stream, as
    :func:`ckptaudit.security.streams` returns) by the loader that reads it; add its findings and one import
    row per distinct import to ``scan``.  ``torchscript`` is the archive's TorchScript code modules
    (:func:`ckptaudit.security.torchscript.code_modules`) or None for a torch.save archive; ``data_pkl``
    says ``member`` is the data.pkl ``torch.load`` reads."""
    if torchscript is not None and security_torchscript.read_by_jit(member, prefix):
        verdicts, sec = security_torchscript.scan(streams, path=rel, member=member, code=torchscript)
    else:
        resume = security_resume.resume_load(scan.layout, rel) if data_pkl else NOT_LOADED
        verdicts, sec = security.scan(streams, path=rel, member=member, extra_allowed=allowed, resume=resume)
    scan.add(sec)
    scan.imports.extend({"file": rel, "member": member, **asdict(v)} for v in verdicts)


def torchscript_of(rep) -> Optional[Collection[str]]:
    """The code modules of a TorchScript archive (:func:`ckptaudit.security.torchscript.code_modules`) whose
    :class:`ckptaudit.formats.torchzip.ZipReport` is ``rep``, or None when it is no TorchScript archive."""
    names = rep.members.names
    return (security_torchscript.code_modules(names, rep.prefix)
            if security_torchscript.is_torchscript(names, rep.prefix) else None)


def scan_zip_members(path: Path, rel: str, scan: UnitScan, allowed: List[str], rep, *,
                     torchscript: Optional[Collection[str]], done: Collection[str] = (), kept=None) -> None:
    """Walk and judge every pickle record of the zip at ``path`` (``rep``: the
    :class:`ckptaudit.formats.torchzip.ZipReport` of its structure check) except those in ``done`` (already
    judged by the caller); ``torchscript``: :func:`torchscript_of` ``rep``.  Records whose data cannot be located, or whose method is neither stored nor
    deflated, are skipped (the structure check reports damaged records).  Reads at most :data:`MAX_MEMBERS`
    heads and :data:`ckptaudit.layouts.scan_file.SWEEP_BYTES` bytes in all (``kept``: bytes of a remote object
    already read, :class:`ckptaudit.fs.kept.KeptBytes`, answered from memory); raises only ``OSError`` when
    the file cannot be opened."""
    from ..formats import torchzip
    from ..formats.zip.reader import ArchiveFile
    from .scan_file import SWEEP_BYTES

    ts = torchscript
    named = [i for i, n in enumerate(rep.members.name_list(MAX_MEMBERS))
             if n not in done and not _STORAGE_RECORD.match(n)]  # a record object only for these
    todo = [m for m in (rep.members[i] for i in named)
            if m.method in (0, 8) and (m.data_offset >= 0 or m.loose_data_offset >= 0)]
    if not todo:
        return
    t0 = time.perf_counter()
    left = SWEEP_BYTES
    fh = ArchiveFile(str(path), window=torchzip.REMOTE_WINDOW_BYTES, prefetch=False, kept=kept)
    try:
        for m in todo:
            if left <= 0:
                break
            if not is_pickle(m.name, _read(fh, m, HEAD_BYTES)):
                continue
            data = _read(fh, m, min(left, m.size_bytes))
            left -= len(data)
            if not data:
                continue
            scan.pickle_bytes += len(data)
            data_pkl = m.name == (f"{rep.prefix}/data.pkl" if rep.prefix else "data.pkl")
            judge(scan, rel, m.name, security.streams(data, walk(data)), allowed, prefix=rep.prefix,
                  torchscript=ts, data_pkl=data_pkl and ts is None)
    finally:
        fh.close()
        scan.walk_seconds += time.perf_counter() - t0


def _read(fh, m, limit: int) -> bytes:
    """Up to ``limit`` bytes of record ``m``'s data (inflated when deflated), as far as they read."""
    start = m.data_offset if m.data_offset >= 0 else m.loose_data_offset
    if m.method == 0:
        return fh.pread(start, min(limit, m.compressed_size_bytes))
    d = zlib.decompressobj(-15)
    out = bytearray()
    off, left = start, m.compressed_size_bytes
    try:
        while left > 0 and len(out) < limit:
            raw = fh.pread(off, min(left, max(HEAD_BYTES * 16, min(limit, 1 << 20))))
            if not raw:
                break
            off += len(raw)
            left -= len(raw)
            out += d.decompress(raw, limit - len(out))
    except zlib.error:
        pass
    return bytes(out[:limit])
