"""The facts one pass leaves for later stages: rows of the internal ``bytefacts`` table and their lookups.

The hash stage writes, for each file it read, one row per:

* zip record CRC32 (``kind`` "crc") and longest NUL run (``kind`` "nul_run": what
  :func:`ckptaudit.formats.zip.crc._longest_zero_run` asks of a record that fails its CRC);
* safetensors data area scanned for NUL runs (``kind`` "nul_scan", its runs ``kind`` "nul_scan_run");
* tensor value range (``kind`` "values") and range of bytes that only hold tensor data (``kind`` "tensor_data");
* of a remote object, piece of the bytes later stages read again (``kind`` "bytes", served by
  :mod:`ckptaudit.fs.kept` instead of a second GET).

The scan stage (CRC32 of every record, zero spans), the state stage (non-finite counts and norms) and the load
stage (which bytes a remote object's sparse copy may leave out) :func:`load` the rows of their part and ask
:func:`crc_of`, :func:`nul_run_of`, :func:`nul_runs_in`, :func:`values_of` and :func:`tensor_data_of` before
reading any bytes.  A fact is keyed by the file and the exact byte range, so a question the pass did not answer
(a damaged archive, a view into a storage) reads bytes as before.  Facts of a file whose size or version (ETag;
local mtime and inode: :func:`ckptaudit.fs.version`) changed since the pass are dropped.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .. import fs

_CRC: Dict[Tuple[str, int, int], Tuple[int, int]] = {}
_VALUES: Dict[Tuple[str, int, int, str], Tuple[int, float, int]] = {}
_TENSOR_DATA: Dict[str, List[Tuple[int, int]]] = {}
_NUL_RUN: Dict[Tuple[str, int, int], Optional[Tuple[int, int]]] = {}
_NUL_SCAN: Dict[Tuple[str, int, int], Tuple[int, List[Tuple[int, int]]]] = {}  # -> (min_run, runs)


def rows_of(unit: str, rel: str, ff) -> List[dict]:
    """Rows of the ``bytefacts`` table for file ``rel`` of ``unit`` from a :class:`~.filepass.FileFacts`, each
    with the file's ``version`` at the pass (:func:`ckptaudit.fs.version`)."""
    return [{**r, "version": ff.version} for r in _rows(unit, rel, ff)]


def _rows(unit: str, rel: str, ff) -> List[dict]:
    rows = [{"unit": unit, "file": rel, "kind": "crc", "member": m, "data_offset": o, "length_bytes": n,
             "crc32": crc, "seen_bytes": seen, "size_bytes": ff.size_bytes}
            for (m, o, n), (crc, seen) in ff.crc.items()]
    rows += [{"unit": unit, "file": rel, "kind": "nul_run", "member": m, "data_offset": o, "length_bytes": n,
              "zero_offset": run[0] if run else -1, "zero_bytes": run[1] if run else 0, "size_bytes": ff.size_bytes}
             for (m, o, n), run in ff.nul_runs.items()]
    for (o, n, m), runs in ff.nul_scans.items():  # a scan row (zero_bytes: the shortest run looked for), then its runs
        rows.append({"unit": unit, "file": rel, "kind": "nul_scan", "data_offset": o, "length_bytes": n,
                     "zero_bytes": m, "seen_bytes": -1 if runs is None else len(runs), "size_bytes": ff.size_bytes})
        rows += [{"unit": unit, "file": rel, "kind": "nul_scan_run", "data_offset": o, "length_bytes": n,
                  "zero_offset": ro, "zero_bytes": rn, "size_bytes": ff.size_bytes} for ro, rn in runs or []]
    rows += [{"unit": unit, "file": rel, "kind": "values", "data_offset": o, "length_bytes": n, "dtype": dt,
              "nonfinite": bad, "sum_squares": sq, "seen_bytes": seen, "size_bytes": ff.size_bytes}
             for (o, n, dt), (bad, sq, seen) in ff.values.items()]
    rows += [{"unit": unit, "file": rel, "kind": "tensor_data", "data_offset": o, "length_bytes": n,
              "size_bytes": ff.size_bytes} for o, n in ff.tensor_data]
    rows += [{"unit": unit, "file": rel, "kind": "bytes", "data_offset": o + k, "length_bytes": len(b[k:k + _PIECE]),
              "data": b[k:k + _PIECE], "size_bytes": ff.size_bytes}
             for o, b in ff.kept for k in range(0, len(b), _PIECE)]
    return rows


#: Bytes per "bytes" row (a kept piece of a remote object is split so no Parquet cell grows large).
_PIECE = 4 << 20


def clear() -> None:
    fs.kept.clear()
    _CRC.clear()
    _VALUES.clear()
    _TENSOR_DATA.clear()
    _NUL_RUN.clear()
    _NUL_SCAN.clear()


def _now(p) -> Optional[Tuple[int, str]]:
    try:
        return fs.version(p)
    except (OSError, ValueError):
        return None


def load(rows: List[dict], run_dir) -> int:
    """Make ``rows`` (of the ``bytefacts`` table, files relative to ``run_dir``) answer the lookups,
    in place of any loaded before; returns the facts kept."""
    clear()
    pieces = 0
    pending: List[Tuple[str, dict]] = []  # runs of a scan, added once its scan row is known
    now: Dict[str, Optional[Tuple[int, str]]] = {}
    for r in rows:
        p = run_dir / r["file"]
        key = fs.fspath(p)
        if key not in now:
            now[key] = _now(p)
        if now[key] is None or now[key][0] != r["size_bytes"] or (r.get("version") or "") != now[key][1]:
            continue  # gone, or rewritten since the pass: the later stage reads the file itself
        if r["kind"] == "crc":
            _CRC[(key, r["data_offset"], r["length_bytes"])] = (r["crc32"], r["seen_bytes"])
        elif r["kind"] == "values":
            _VALUES[(key, r["data_offset"], r["length_bytes"], r["dtype"])] = (
                r["nonfinite"], r["sum_squares"], r["seen_bytes"])
        elif r["kind"] == "nul_run":
            _NUL_RUN[(key, r["data_offset"], r["length_bytes"])] = (
                (r["zero_offset"], r["zero_bytes"]) if r["zero_bytes"] else None)
        elif r["kind"] == "nul_scan" and r["seen_bytes"] >= 0:
            _NUL_SCAN.setdefault((key, r["data_offset"], r["length_bytes"]), (r["zero_bytes"], []))
        elif r["kind"] == "nul_scan_run":
            pending.append((key, r))
        elif r["kind"] == "tensor_data":
            _TENSOR_DATA.setdefault(key, []).append((r["data_offset"], r["length_bytes"]))
        elif r["kind"] == "bytes" and r.get("data") is not None:
            fs.kept.put(key, r["data_offset"], r["data"], r["size_bytes"])
            pieces += 1
    for key, r in pending:
        scan = _NUL_SCAN.get((key, r["data_offset"], r["length_bytes"]))
        if scan is not None:
            scan[1].append((r["zero_offset"], r["zero_bytes"]))
    for _m, runs in _NUL_SCAN.values():
        runs.sort()
    return (len(_CRC) + len(_VALUES) + len(_NUL_RUN) + sum(map(len, _TENSOR_DATA.values())) + pieces
            + len(_NUL_SCAN) + sum(len(runs) for _m, runs in _NUL_SCAN.values()))


def crc_of(path: str, offset: int, length: int) -> Optional[Tuple[int, int]]:
    """``(crc32, bytes seen)`` of ``length`` bytes of ``path`` (``fs.fspath``) from ``offset``, or None."""
    return _CRC.get((path, offset, length)) if _CRC else None


def nul_run_of(path: str, offset: int, length: int) -> Tuple[bool, Optional[Tuple[int, int]]]:
    """``(known, run)``: whether the pass looked at ``length`` bytes of ``path`` (``fs.fspath``) from ``offset``,
    and the ``(offset, length)`` of the longest run of at least 64 NUL bytes it found there (None: none)."""
    key = (path, offset, length)
    return (True, _NUL_RUN[key]) if key in _NUL_RUN else (False, None)


def nul_runs_in(path: str, offset: int, length: int, min_run: int) -> Optional[List[Tuple[int, int]]]:
    """Every ``(offset, length)`` NUL run of at least ``min_run`` bytes the pass listed in ``length`` bytes of
    ``path`` (``fs.fspath``) from ``offset``, in order, or None when it did not list that range so."""
    scan = _NUL_SCAN.get((path, offset, length))
    return list(scan[1]) if scan is not None and scan[0] == min_run else None


def tensor_data_of(path: str) -> Optional[List[Tuple[int, int]]]:
    """``(offset, length)`` of the bytes of ``path`` (``fs.fspath``) that only hold tensor data, or None."""
    return _TENSOR_DATA.get(path)


def values_of(path: str, offset: int, nbytes: int, dtype: str) -> Optional[Tuple[int, float, int]]:
    """``(non-finite count, Σx², bytes seen)`` of a tensor's bytes of ``path`` (``fs.fspath``), or None."""
    return _VALUES.get((path, offset, nbytes, dtype)) if _VALUES else None
