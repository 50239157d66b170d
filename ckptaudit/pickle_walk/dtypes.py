"""Storage dtype tables: torch's storage classes and dtype names, with their bytes per element."""

from __future__ import annotations

from typing import Dict, Tuple

# Legacy typed-storage class name -> (dtype name, bytes per element).
# Source: torch/storage.py ``_dtype_to_storage_type_map`` (the map torch uses
# to pickle TypedStorage) and torch/_utils.py ``_element_size``; UntypedStorage
# is serialised as bytes (torch/serialization.py ``persistent_load``: "if
# storage_type is torch.UntypedStorage: dtype = torch.uint8").  Float8/float4,
# uint16/32/64 and bits* have no storage class: torch saves them as
# UntypedStorage + ``_rebuild_tensor_v3(..., dtype)`` (``_new_dtypes``).
_STORAGE_DTYPES: Dict[str, Tuple[str, int]] = {
    "DoubleStorage": ("float64", 8),
    "FloatStorage": ("float32", 4),
    "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2),
    "CharStorage": ("int8", 1),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
    "ComplexDoubleStorage": ("complex128", 16),
    "ComplexFloatStorage": ("complex64", 8),
    "QInt8Storage": ("qint8", 1),
    "QInt32Storage": ("qint32", 4),
    "QUInt8Storage": ("quint8", 1),
    "QUInt4x2Storage": ("quint4x2", 1),
    "QUInt2x4Storage": ("quint2x4", 1),
    "UntypedStorage": ("uint8", 1),
}

# torch dtype name (as in ``torch.<name>`` globals) -> bytes per element.
# Source: ``torch.<dtype>.itemsize`` for every dtype of torch 2.13 (sub-byte
# int1..int7/uint1..uint7 report 1).  Aliases (float, half, long, ...) map to
# the canonical name in DTYPE_ALIASES.
_DTYPE_ITEMSIZE: Dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "qint8": 1, "qint32": 4, "quint8": 1, "quint4x2": 1, "quint2x4": 1,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{f"int{i}": 1 for i in range(1, 8)},
    **{f"uint{i}": 1 for i in range(1, 8)},
}
#: torch's alternative dtype names (``torch.float`` is ``torch.float32`` ...) -> the canonical name.
DTYPE_ALIASES: Dict[str, str] = {
    "double": "float64", "float": "float32", "half": "float16", "long": "int64",
    "int": "int32", "short": "int16", "cdouble": "complex128", "cfloat": "complex64",
    "chalf": "complex32", "bit": "uint1",
}


def dtype_of_storage_type(name: str) -> Tuple[str, int]:
    """``"FloatStorage"`` → ``("float32", 4)``: dtype name and bytes per element.

    Accepts a bare class name or a dotted one (``"torch.cuda.HalfStorage"``,
    ``"torch.storage.UntypedStorage"``).  Raises ``KeyError`` for a name that
    is no torch storage class (the table and its sources are above).
    """
    short = name.rsplit(".", 1)[-1]
    try:
        return _STORAGE_DTYPES[short]
    except KeyError:
        raise KeyError(f"{name!r} is not a torch storage type; known: {sorted(_STORAGE_DTYPES)}") from None


def dtype_itemsize(dtype: str, default: int = 0) -> int:
    """Bytes per element of a torch dtype name (``"bfloat16"`` → 2), or ``default``."""
    return _DTYPE_ITEMSIZE.get(DTYPE_ALIASES.get(dtype, dtype), default)
