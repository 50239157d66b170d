"""The pickles inside NumPy files: an object array in a ``.npy`` (or in any ``.npy`` member of a ``.npz``) is a pickle.

``numpy.save`` writes an array of ``dtype=object`` as the ``.npy`` header followed by ``pickle.dump`` of the
array (numpy/lib/format.py ``write_array``); ``numpy.load(allow_pickle=True)`` unpickles it without any
allowlist.  picklescan and modelscan both scan these; so does the audit: the header is parsed with numpy's own
``numpy.lib.format`` readers (no pickle involved), and for an object dtype the bytes after it are walked
statically and judged by :func:`ckptaudit.security.scan` like any other pickle.  ``numpy.load``'s default
(``allow_pickle=False``, since NumPy 1.16.3) refuses to unpickle, so the loader is "never" unless the
training code opts in: a dangerous import is still ``malicious_pickle_code_exec``; an unknown one is a
warning.  At most :data:`MAX_MEMBERS` members of a ``.npz`` and :data:`ckptaudit.layouts.scan_file.SWEEP_BYTES`
of each pickle are read.
"""

from __future__ import annotations

import time
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import BinaryIO, List

from .. import fs
from ..security_resume import ResumeLoad
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


def scan_numpy(path: Path, rel: str, kind: str, scan: UnitScan, allowed: List[str]) -> None:
    """Walk the object-array pickle of an ``npy`` file, or of every ``.npy`` member of an ``npz``; add their
    security findings and import rows to ``scan``.  A header numpy refuses is skipped (the file layer already
    says the file is no checkpoint)."""
    from .. import security
    from ..pickle_walk import walk

    t0 = time.perf_counter()
    blobs = []
    try:
        with fs.open_binary(path) as fh:
            if kind == "npy":
                blobs.append(("(npy object array)", _object_pickle(fh)))
            else:
                with zipfile.ZipFile(fh) as z:
                    for info in z.infolist()[:MAX_MEMBERS]:
                        if info.filename.endswith(".npy"):
                            with z.open(info) as m:
                                try:
                                    blobs.append((info.filename, _object_pickle(m)))
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
    scan.walk_seconds += time.perf_counter() - t0


__all__ = ["scan_numpy", "NUMPY_LOAD", "MAX_MEMBERS"]
