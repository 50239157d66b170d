"""The pickles of a tar archive: torch's oldest ``torch.save`` format, and any ``.tar`` a run holds.

``torch.load`` still reads the legacy tar format (torch/serialization.py ``_legacy_load.legacy_load``,
``tarfile.open(mode="r:")``): with ``weights_only=True`` it raises ("Cannot use ``weights_only=True`` with
files saved in the legacy .tar format") before it unpickles anything; with ``weights_only=False`` it
unpickles, with no allowlist, the records of three members:

* ``storages``: a pickle of the storage count, then per storage a pickle ``(key, location, storage_type)``
  followed by an int64 element count and that many elements (``UntypedStorage._new_with_file``), then a
  pickle of the storage views;
* ``tensors``: a pickle of the tensor count, then per tensor a pickle ``(key, storage_id, tensor_type)``
  followed by int32 ndim, 4 bytes, ndim int64 sizes, ndim int64 strides and an int64 offset;
* ``pickle``: the saved object.

Every other member that is a pickle (:func:`ckptaudit.layouts.archive_pickles.is_pickle`) is walked too and
judged as a record no loader reads.  Members are read from the archive (``TarFile.extractfile``), never
extracted to disk; at most :data:`MAX_MEMBERS` members, :data:`MAX_RECORDS` records of one legacy member and
:data:`ckptaudit.layouts.scan_file.SWEEP_BYTES` bytes of pickles in all are read.
"""

from __future__ import annotations

import struct
import tarfile
import time
from pathlib import Path
from typing import List, Optional

from .. import fs, security
from ..security import resume as security_resume
from ..pickle_walk import GlobalRef, WalkResult, walk
from ..pickle_walk.dtypes import dtype_of_storage_type
from ..security.resume import ResumeLoad
from .archive_pickles import HEAD_BYTES, NOT_LOADED, MAX_MEMBERS, is_pickle, judge
from .result import UnitScan

__all__ = ["LEGACY_MEMBERS", "MAX_RECORDS", "TAR_REFUSED", "is_tar", "scan_tar"]

#: Members torch's legacy tar loader unpickles.
LEGACY_MEMBERS = ("storages", "tensors", "pickle")
#: Records (pickles) of one ``storages``/``tensors`` member walked, at most.
MAX_RECORDS = 10_000
#: How a resume that loads with ``weights_only=True`` meets a legacy tar file: refused before any unpickling.
TAR_REFUSED = ResumeLoad("torch.load(weights_only=True) refuses the legacy .tar format before it unpickles "
                         "anything (torch/serialization.py legacy_load)", never=True)
_WINDOW = 1 << 16


def is_tar(path: Path, kept=None) -> bool:
    """Whether the file's first 512-byte block is a tar header: the ``ustar`` magic at byte 257 (POSIX.1-1988
    and GNU tar, which Python's ``tarfile`` and so torch's legacy writer use).  ``kept``: bytes of a remote
    object already read (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
    try:
        with fs.open_binary(path, exact=True, kept=kept) as fh:
            head = fh.read(512)
    except OSError:
        return False
    return len(head) == 512 and head[257:262] == b"ustar"


def scan_tar(path: Path, rel: str, scan: UnitScan, allowed: List[str], kept=None) -> None:
    """Walk and judge the pickles of the tar file at ``path``: the legacy torch members by the resume's loader
    (unrestricted when it passes ``weights_only=False``, else :data:`TAR_REFUSED`), any other pickle member as
    a record no loader reads.  A tar ``tarfile`` cannot read is left to the file layer's findings.  ``kept``:
    bytes of a remote object already read (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
    from .scan_file import SWEEP_BYTES

    resume = security_resume.resume_load(scan.layout, rel)
    legacy_load = resume if resume is not None and not resume.weights_only and not resume.never else TAR_REFUSED
    t0 = time.perf_counter()
    left = [SWEEP_BYTES]
    try:
        with fs.open_binary(path, kept=kept) as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            for n, ti in enumerate(tar):
                if n >= MAX_MEMBERS or left[0] <= 0:
                    break
                if not ti.isfile():
                    continue
                f = tar.extractfile(ti)
                if f is None:
                    continue
                before = left[0]
                if ti.name in ("storages", "tensors"):
                    res = _legacy_records(f, ti.size, ti.name, left)
                elif ti.name == "pickle" or is_pickle(ti.name, f.read(HEAD_BYTES)):
                    f.seek(0)
                    data = f.read(min(ti.size, left[0]))
                    left[0] -= len(data)
                    res = security.streams(data, walk(data))
                else:
                    continue
                scan.pickle_bytes += before - left[0]
                _judge(scan, rel, ti.name, res, allowed, legacy_load if ti.name in LEGACY_MEMBERS else NOT_LOADED)
    except (tarfile.TarError, OSError, EOFError, ValueError):
        pass
    scan.walk_seconds += time.perf_counter() - t0


def _judge(scan: UnitScan, rel: str, member: str, res: WalkResult, allowed: List[str], load: ResumeLoad) -> None:
    from dataclasses import asdict

    if load is NOT_LOADED:
        judge(scan, rel, member, res, allowed, prefix="", torchscript=None, data_pkl=False)
        return
    verdicts, sec = security.scan(res, path=rel, member=member, extra_allowed=allowed, resume=load)
    scan.add(sec)
    scan.imports.extend({"file": rel, "member": member, **asdict(v)} for v in verdicts)


def _walk_at(f, pos: int, left: List[int]) -> WalkResult:
    """Walk the pickle at ``pos`` of member file ``f``, reading a window that grows while the walk runs out of
    bytes (within ``left[0]``, decremented by what is read)."""
    n = _WINDOW
    while True:
        f.seek(pos)
        data = f.read(min(n, left[0]))
        r = walk(data)
        if not (r.error and r.error.startswith("truncated") and len(data) == n and n * 4 <= left[0]):
            left[0] -= len(data)
            r.end += pos
            return r
        n *= 4


def _legacy_records(f, size: int, kind: str, left: List[int]) -> WalkResult:
    """Every pickle record of a legacy ``storages`` or ``tensors`` member, skipping the raw bytes between
    them by the layout above; stops at the first record that does not fit it.  One result, records nested."""
    out: List[WalkResult] = []
    first = _walk_at(f, 0, left)
    out.append(first)
    count = first.obj if type(first.obj) is int and not first.error else 0
    pos = first.end
    for _ in range(min(count, MAX_RECORDS)):
        if pos >= size or left[0] <= 0:
            break
        r = _walk_at(f, pos, left)
        out.append(r)
        skip = None if r.error else _raw_after(f, r, kind)
        if skip is None:
            break
        pos = r.end + skip
    else:
        if kind == "storages" and pos < size and left[0] > 0:
            out.append(_walk_at(f, pos, left))  # the storage views
    return WalkResult(obj=first.obj, nested=out, protocol=first.protocol, n_ops=sum(r.n_ops for r in out),
                      end=out[-1].end)


def _raw_after(f, r: WalkResult, kind: str) -> Optional[int]:
    """Bytes of raw data after a record's pickle ``r`` (None: the record is not in the legacy layout)."""
    obj = r.obj
    if type(obj) is not tuple or len(obj) != 3:
        return None
    f.seek(r.end)
    if kind == "storages":
        t = obj[2]
        if type(t) is not GlobalRef:
            return None
        try:
            _dtype, itemsize = dtype_of_storage_type(t.name)
        except KeyError:
            return None
        raw = f.read(8)
        numel = struct.unpack("<q", raw)[0] if len(raw) == 8 else -1
        return 8 + numel * itemsize if numel >= 0 else None
    raw = f.read(4)
    if len(raw) != 4:
        return None
    ndim = struct.unpack("<i", raw)[0]
    return 8 + 16 * ndim + 8 if 0 <= ndim <= 64 else None
