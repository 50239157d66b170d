"""The pickles inside NumPy files: an object array in a ``.npy`` (or in any ``.npy`` member of a ``.npz``) is a pickle.

``numpy.save`` writes an array of ``dtype=object`` as the ``.npy`` header followed by ``pickle.dump`` of the
array (numpy/lib/format.py ``write_array``); ``numpy.load(allow_pickle=True)`` unpickles it without any
allowlist.  picklescan and modelscan both scan these; so does the audit: the header is parsed with numpy's own
``numpy.lib.format`` readers (no pickle involved), and for an object dtype the bytes after it are walked
statically and judged by :func:`ckptaudit.security.scan` like any other pickle.  ``numpy.load``'s default
(``allow_pickle=False``, since NumPy 1.16.3) refuses to unpickle, so the loader is "never" unless the
training code opts in: a dangerous import is still ``malicious_pickle_code_exec``; an unknown one is a
warning.  A member of a ``.npz`` that is no ``.npy`` but a pickle (``numpy.load`` hands it out as bytes,
numpy/lib/_npyio_impl.py ``NpzFile.__getitem__``) is judged as a record no loader reads
(:func:`ckptaudit.layouts.archive_pickles.judge`).  At most :data:`MAX_MEMBERS` members of a ``.npz`` and
:data:`ckptaudit.layouts.scan_file.SWEEP_BYTES` of each pickle are read.
"""

from __future__ import annotations

import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO, List

from .. import fs
from ..security.resume import ResumeLoad
from .result import UnitScan

#: Members of one ``.npz`` looked at, at most.
MAX_MEMBERS = 10_000
#: How a resume reads a NumPy file unless the training code passes ``allow_pickle=True``.
NUMPY_LOAD = ResumeLoad("numpy.load(allow_pickle=False), NumPy's default, which refuses object arrays", never=True)


def _object_pickle(f: BinaryIO) -> bytes:
    """The pickle bytes after a ``.npy`` header when its dtype holds Python objects, else b"".  Raises
    ``ValueError`` for a header numpy's readers refuse."""
    import numpy.lib.format as npf

    version = npf.read_magic(f)
    if version == (1, 0):
        _shape, _fortran, dtype = npf.read_array_header_1_0(f)
    elif version in ((2, 0), (3, 0)):  # 3.0 differs only in the header's text encoding (utf8)
        _shape, _fortran, dtype = npf.read_array_header_2_0(f)
    else:
        raise ValueError(f"unknown .npy format version {version}")
    if not dtype.hasobject:
        return b""
    from .scan_file import SWEEP_BYTES

    return f.read(SWEEP_BYTES)


def scan_numpy(path: Path, rel: str, kind: str, scan: UnitScan, allowed: List[str], kept=None) -> None:
    """Walk the object-array pickle of an ``npy`` file, or of every ``.npy`` member of an ``npz`` (and every
    other member of it that is a pickle); add their
    security findings and import rows to ``scan``.  A header numpy refuses is skipped (the file layer already
    says the file is no checkpoint).  ``kept``: bytes of a remote object already read
    (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
    from .. import security
    from ..pickle_walk import walk

    from .archive_pickles import HEAD_BYTES, is_pickle, judge
    from .scan_file import SWEEP_BYTES

    t0 = time.perf_counter()
    blobs, other = [], []
    left = SWEEP_BYTES
    try:
        with fs.open_binary(path, kept=kept) as fh:
            if kind == "npy":
                blobs.append(("(npy object array)", _object_pickle(fh)))
            else:
                with zipfile.ZipFile(fh) as z:
                    for info in z.infolist()[:MAX_MEMBERS]:
                        with z.open(info) as m:
                            try:
                                head = m.read(HEAD_BYTES)
                                if head.startswith(b"\x93NUMPY"):  # read by numpy.lib.format.read_array
                                    m.seek(0)
                                    blobs.append((info.filename, _object_pickle(m)))
                                elif is_pickle(info.filename, head) and left > 0:  # SWEEP_BYTES in all
                                    other.append((info.filename, head + m.read(max(0, left - len(head)))))
                                    left -= len(other[-1][1])
                            except (ValueError, OSError, EOFError, zipfile.BadZipFile):
                                continue
    except (ValueError, OSError, EOFError, zipfile.BadZipFile):
        return
    for member, data in blobs:
        if not data:
            continue
        res = security.streams(data, walk(data), expected=1)
        scan.pickle_bytes += len(data)
        verdicts, sec = security.scan(res, path=rel, member=member, extra_allowed=allowed, resume=NUMPY_LOAD)
        scan.add(sec)
        scan.imports.extend({"file": rel, "member": member, **asdict(v)} for v in verdicts)
    for member, data in other:  # a pickle in a member that is no .npy: NpzFile hands it out as bytes
        scan.pickle_bytes += len(data)
        judge(scan, rel, member, security.streams(data, walk(data)), allowed, prefix="", torchscript=None,
              data_pkl=False)
    scan.walk_seconds += time.perf_counter() - t0


__all__ = ["scan_numpy", "NUMPY_LOAD", "MAX_MEMBERS"]
