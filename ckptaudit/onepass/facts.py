"""The facts one pass leaves for later stages: rows of the internal ``bytefacts`` table and their lookups.

The hash stage writes one row per zip record CRC (``kind`` "crc"), per tensor value range
(``kind`` "values") and per range of bytes that only hold tensor data (``kind`` "tensor_data") of each
file it read; the scan stage (CRC32 of every record), the state stage (non-finite counts and norms) and
the load stage (which bytes a remote object's sparse copy may leave out) :func:`load` the rows of their
part and ask :func:`crc_of`, :func:`values_of` and :func:`tensor_data_of` before reading any bytes.  A fact is keyed by the file and the exact byte range,
so a question the pass did not answer (a damaged archive, a view into a storage) reads bytes as
before.  Facts of a file whose size changed since the pass are dropped.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

from .. import fs

_CRC: Dict[Tuple[str, int, int], Tuple[int, int]] = {}
_VALUES: Dict[Tuple[str, int, int, str], Tuple[int, float, int]] = {}
_TENSOR_DATA: Dict[str, List[Tuple[int, int]]] = {}


def rows_of(unit: str, rel: str, ff) -> List[dict]:
    """Rows of the ``bytefacts`` table for file ``rel`` of ``unit`` from a :class:`~.filepass.FileFacts`."""
    rows = [{"unit": unit, "file": rel, "kind": "crc", "member": m, "data_offset": o, "length_bytes": n,
             "crc32": crc, "seen_bytes": seen, "size_bytes": ff.size_bytes}
            for (m, o, n), (crc, seen) in ff.crc.items()]
    rows += [{"unit": unit, "file": rel, "kind": "values", "data_offset": o, "length_bytes": n, "dtype": dt,
              "nonfinite": bad, "sum_squares": sq, "seen_bytes": seen, "size_bytes": ff.size_bytes}
             for (o, n, dt), (bad, sq, seen) in ff.values.items()]
    rows += [{"unit": unit, "file": rel, "kind": "tensor_data", "data_offset": o, "length_bytes": n,
              "size_bytes": ff.size_bytes} for o, n in ff.tensor_data]
    return rows


def clear() -> None:
    _CRC.clear()
    _VALUES.clear()
    _TENSOR_DATA.clear()


def _size(p) -> Optional[int]:
    try:
        return fs.size(p) if fs.is_remote(p) else os.stat(fs.fspath(p)).st_size
    except OSError:
        return None


def load(rows: List[dict], run_dir) -> int:
    """Make ``rows`` (of the ``bytefacts`` table, files relative to ``run_dir``) answer the lookups,
    in place of any loaded before; returns the facts kept."""
    clear()
    sizes: Dict[str, Optional[int]] = {}
    for r in rows:
        p = run_dir / r["file"]
        key = fs.fspath(p)
        if key not in sizes:
            sizes[key] = _size(p)
        if sizes[key] is None or sizes[key] != r["size_bytes"]:
            continue
        if r["kind"] == "crc":
            _CRC[(key, r["data_offset"], r["length_bytes"])] = (r["crc32"], r["seen_bytes"])
        elif r["kind"] == "values":
            _VALUES[(key, r["data_offset"], r["length_bytes"], r["dtype"])] = (
                r["nonfinite"], r["sum_squares"], r["seen_bytes"])
        elif r["kind"] == "tensor_data":
            _TENSOR_DATA.setdefault(key, []).append((r["data_offset"], r["length_bytes"]))
    return len(_CRC) + len(_VALUES) + sum(map(len, _TENSOR_DATA.values()))


def crc_of(path: str, offset: int, length: int) -> Optional[Tuple[int, int]]:
    """``(crc32, bytes seen)`` of ``length`` bytes of ``path`` (``fs.fspath``) from ``offset``, or None."""
    return _CRC.get((path, offset, length)) if _CRC else None


def tensor_data_of(path: str) -> Optional[List[Tuple[int, int]]]:
    """``(offset, length)`` of the bytes of ``path`` (``fs.fspath``) that only hold tensor data, or None."""
    return _TENSOR_DATA.get(path)


def values_of(path: str, offset: int, nbytes: int, dtype: str) -> Optional[Tuple[int, float, int]]:
    """``(non-finite count, Σx², bytes seen)`` of a tensor's bytes of ``path`` (``fs.fspath``), or None."""
    return _VALUES.get((path, offset, nbytes, dtype)) if _VALUES else None
