"""Value statistics of tensor bytes: non-finite count and sum of squares of one buffer, by dtype.

NaN/Inf tests follow IEEE 754 bit patterns (all exponent bits set); bfloat16 is the upper half of a
float32 (torch docs, "torch.bfloat16"); float8 e4m3fn has no Inf and NaN = ``S.1111.111``, e5m2
follows IEEE (PyTorch RFC "float8 types").  numpy only; torch is not imported.
"""

from __future__ import annotations

from typing import Tuple

FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


def itemsize(dtype: str) -> int:
    """Bytes per element of a float dtype of :data:`FLOAT_DTYPES`."""
    return 1 if dtype.startswith("float8") else {"float64": 8, "float32": 4}.get(dtype, 2)


def _np_view(buf, dtype: str):
    import numpy as np

    if dtype == "bfloat16":
        return np.frombuffer(buf, dtype=np.uint16)
    if dtype.startswith("float8"):
        return np.frombuffer(buf, dtype=np.uint8)
    return np.frombuffer(buf, dtype={"float32": np.float32, "float64": np.float64, "float16": np.float16}[dtype])


def _chunk_stats(a, dtype: str) -> Tuple[int, float]:
    """(non-finite count, sum of squares of the finite values) of one chunk."""
    import numpy as np

    if dtype == "float8_e4m3fn":
        return int(np.count_nonzero((a & 0x7F) == 0x7F)), 0.0
    if dtype == "float8_e5m2":
        return int(np.count_nonzero((a & 0x7C) == 0x7C)), 0.0
    if dtype == "bfloat16":
        bad = int(np.count_nonzero((a & 0x7F80) == 0x7F80))
        f = (a.astype(np.uint32) << 16).view(np.float32)
    else:
        f = a
        bad = f.size - int(np.count_nonzero(np.isfinite(f)))
    if bad:
        f = f[np.isfinite(f)]
    return bad, _sum_squares(f)


_BLOCK = 1 << 16


def _sum_squares(f) -> float:
    """Σx² of finite values: float32 dot products over 64 Ki-element blocks, added
    in float64 (no float64 copy of the chunk); recomputed in float64 only when a
    block overflows float32."""
    import numpy as np

    if f.size == 0:
        return 0.0
    if f.dtype == np.float64:
        return float(np.dot(f, f))
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing block is redone in float64 below
        for i in range(0, f.size, _BLOCK):
            b = f[i:i + _BLOCK]
            if b.dtype != np.float32:
                b = b.astype(np.float32)
            total += float(np.dot(b, b))
    if not np.isfinite(total):
        f64 = f.astype(np.float64)
        total = float(np.dot(f64, f64))
    return total


def buffer_stats(buf, dtype: str) -> Tuple[int, float]:
    """(non-finite count, Σx² of the finite values) of the whole elements of ``buf`` read as ``dtype``."""
    return _chunk_stats(_np_view(buf, dtype), dtype)
