"""CRC-32 of zip records: the fast implementation when installed, and the combination of two CRCs.

The zip format's CRC-32 is the ISO 3309 / ITU-T V.42 one (reflected polynomial 0xEDB88320, initial and final
XOR 0xFFFFFFFF; PKWARE APPNOTE 4.4.7), the same as :func:`zlib.crc32`.  :func:`crc32` is ISA-L's folding
implementation (PCLMULQDQ/VPCLMULQDQ, python-isal's ``isal_zlib.crc32``, which releases the GIL) when the
``isal`` package is installed, else :func:`zlib.crc32`; on this project's 2-core VM ISA-L ran at 9.7 GiB/s
and zlib 1.2.13 at 1.9 GiB/s on buffers of 8 MiB out of cache (``benchmarks/bench_onepass.py``, history in
docs/benchmarks-history.md).  Both take ``(data, value=0)`` and return the same unsigned 32-bit integer.
"""

from __future__ import annotations

from typing import List

try:  # the one pass feeds every byte of a zip checkpoint to this
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel falls back
    from zlib import crc32

__all__ = ["crc32", "crc32_combine"]


def _gf2_times(mat: List[int], vec: int) -> int:
    s, i = 0, 0
    while vec:
        if vec & 1:
            s ^= mat[i]
        vec >>= 1
        i += 1
    return s


def _gf2_square(mat: List[int]) -> List[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


_ZERO_OPS: List[List[int]] = []  # _ZERO_OPS[k]: the operator that advances the register over 2**k zero bytes


def _zero_op(k: int) -> List[int]:
    if not _ZERO_OPS:
        op = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
        for _ in range(3):
            op = _gf2_square(op)  # ... for 2, 4, then 8 zero bits: one zero byte
        _ZERO_OPS.append(op)
    while len(_ZERO_OPS) <= k:
        _ZERO_OPS.append(_gf2_square(_ZERO_OPS[-1]))
    return _ZERO_OPS[k]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32 of ``A + B`` from ``crc1`` = CRC32(A), ``crc2`` = CRC32(B) and ``len2`` = len(B) in bytes
    (zlib's ``crc32_combine``: the CRC register advanced over ``len2`` zero bytes by GF(2) matrix squaring;
    the operators for 2**k zero bytes are computed once per process).  ``crc1`` 0 (A empty) gives ``crc2``."""
    if len2 <= 0:
        return crc1
    if crc1 == 0:  # the register of an empty prefix stays 0 over zero bytes
        return crc2
    k = 0
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(_zero_op(k), crc1)
        len2 >>= 1
        k += 1
    return crc1 ^ crc2
