"""Value statistics of tensor bytes: non-finite count and sum of squares of one buffer, by dtype.

NaN/Inf tests follow IEEE 754 bit patterns (all exponent bits set); bfloat16 is the upper half of a
float32 (torch docs, "torch.bfloat16"); float8 e4m3fn has no Inf and NaN = ``S.1111.111``, e5m2
follows IEEE (PyTorch RFC "float8 types").  numpy only; torch is not imported.
"""

from __future__ import annotations

from typing import Tuple

FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
#: The same, in a fixed order: a value range's dtype is stored as its index here (plan and bytefacts columns).
DTYPES = tuple(sorted(FLOAT_DTYPES))


def itemsize(dtype: str) -> int:
    """Bytes per element of a float dtype of :data:`FLOAT_DTYPES`."""
    return 1 if dtype.startswith("float8") else {"float64": 8, "float32": 4}.get(dtype, 2)


def np_view(buf, dtype: str):
    """A numpy view of ``buf`` (no copy) whose elements the value statistics read: ``bfloat16`` as uint16,
    ``float8_*`` as uint8 (bit patterns, decoded by :func:`chunk_stats`), other dtypes as themselves."""
    import numpy as np

    if dtype == "bfloat16":
        return np.frombuffer(buf, dtype=np.uint16)
    if dtype.startswith("float8"):
        return np.frombuffer(buf, dtype=np.uint8)
    return np.frombuffer(buf, dtype={"float32": np.float32, "float64": np.float64, "float16": np.float16}[dtype])


def chunk_stats(a, dtype: str) -> Tuple[int, float]:
    """(non-finite count, sum of squares of the finite values) of one chunk."""
    import numpy as np

    if dtype == "float8_e4m3fn":
        return int(np.count_nonzero((a & 0x7F) == 0x7F)), 0.0
    if dtype == "float8_e5m2":
        return int(np.count_nonzero((a & 0x7C) == 0x7C)), 0.0
    f = (a.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else a  # bf16: the upper half
    return _blocks(f)


#: Elements per block of the value statistics: a range's sums are taken a block at a time (float64: all at once).
VALUE_BLOCK = 1 << 16


def _blocks(f) -> Tuple[int, float]:
    """(non-finite count, Σx² of the finite values) of float array ``f``: float32 dot products over
    64 Ki-element blocks (float16 blocks widened to float32 first), added in float64.

    A NaN or ±Inf element makes its block's dot product non-finite (squares are ≥ 0, so no Inf − Inf
    cancels it), so a block whose sum is finite holds only finite values and is not tested element by
    element; only a non-finite block (a NaN/Inf in it, or squares past float32's range) is counted with
    ``isfinite`` and summed again over its finite values, in float64."""
    import numpy as np

    if f.size == 0:
        return 0, 0.0
    bad, total = 0, 0.0
    step = f.size if f.dtype == np.float64 else VALUE_BLOCK
    with np.errstate(over="ignore", invalid="ignore"):  # a non-finite block is redone below
        for i in range(0, f.size, step):
            b = f[i:i + step]
            if b.dtype not in (np.float32, np.float64):
                b = b.astype(np.float32)
            q = float(np.dot(b, b))
            if q != q or q in (float("inf"), float("-inf")):
                ok = np.isfinite(b)
                n_ok = int(np.count_nonzero(ok))
                bad += b.size - n_ok
                g = (b if n_ok == b.size else b[ok]).astype(np.float64)
                q = float(np.dot(g, g))
            total += q
    return bad, total


def _sum_squares(f) -> float:
    """Σx² of the finite values of float array ``f`` (see :func:`_blocks`)."""
    return _blocks(f)[1]


def buffer_stats(buf, dtype: str) -> Tuple[int, float]:
    """(non-finite count, Σx² of the finite values) of the whole elements of ``buf`` read as ``dtype``."""
    return chunk_stats(np_view(buf, dtype), dtype)
