"""CRC-32 of zip records and the combination of two CRCs, both from ISA-L (python-isal, a dependency).

The zip format's CRC-32 is the ISO 3309 / ITU-T V.42 one (reflected polynomial 0xEDB88320, initial and final
XOR 0xFFFFFFFF; PKWARE APPNOTE 4.4.7), the same as :func:`zlib.crc32`.

* :func:`crc32` ``(data, value=0)``: ISA-L's folding implementation (PCLMULQDQ/VPCLMULQDQ; releases the GIL);
  on this project's 2-core VM it ran at 9.7 GiB/s and zlib 1.2.13 at 1.9 GiB/s on buffers of 8 MiB out of
  cache (``benchmarks/bench_onepass.py``, history in docs/benchmarks-history.md).
* :func:`crc32_combine` ``(crc1, crc2, len2)``: CRC-32 of ``A + B`` from ``crc1`` = CRC32(A), ``crc2`` =
  CRC32(B) and ``len2`` = len(B) in bytes, ``len2`` ≥ 0 and any size (zlib's ``crc32_combine``, which
  Python's zlib does not expose; ISA-L's is ~20× faster than the GF(2) matrix squaring in pure Python that
  this module held before, 0.13 against 3.0 µs a call at ``len2`` = 1 GiB).
"""

from __future__ import annotations

from isal.isal_zlib import crc32, crc32_combine

__all__ = ["crc32", "crc32_combine"]
