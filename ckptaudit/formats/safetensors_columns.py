"""A safetensors header as columns: one array per fact (names, dtype codes, shapes, data offsets), not a dict per tensor.

A header of 1,000,000 entries parsed by ``json.loads`` is ~1 GiB of dicts, lists and ints (issue 45: the scan job
held 1,398 MiB; a 1,250,000-entry header was killed at 1 GiB).  :func:`parse` reads the entries one at a time
(:func:`ckptaudit.formats.safetensors_check.iter_header`, the standard ``json`` decoder on each value), checks each
as it goes (:func:`~ckptaudit.formats.safetensors_check.entry_problem`) and keeps per entry a few bytes in arrays:

* ``names``: the names, UTF-8, end to end in one buffer (``name_ends``: each name's end, bytes);
* ``dtype_code``: index into :data:`DTYPES` (-1: the entry is not well formed, ``valid`` 0);
* ``dims`` / ``dim_ends``: every shape's dimensions end to end, and each shape's end in ``dims``;
* ``begin`` / ``end``: ``data_offsets`` (bytes, relative to the data buffer);
* ``need_bytes``: the bytes ``prod(shape) * dtype bits / 8`` that the span must hold (-1: not whole bytes).

Headers the columns cannot hold exactly fall back to ``json.loads`` as before (:func:`from_dict`): a duplicate
key, a ``\\u`` escape (lone surrogates are cleaned over the parsed object), an integer beyond int64, a JSON
syntax error (its message is ``json``'s own).  Those are damaged or hostile headers, which the check calls
errors anyway.
"""

from __future__ import annotations

import math
from array import array
from typing import Dict, Iterator, List, Optional, Tuple

__all__ = ["DTYPES", "HeaderColumns", "parse", "from_dict"]

#: The safetensors dtype names a ``dtype_code`` indexes (safetensors ``Dtype``; bits in ``DTYPE_BITS``).
DTYPES = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "E8M0", "F4",
          "F6_E2M3", "F6_E3M2", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "I64", "U64", "F64", "C64")
_CODE = {d: i for i, d in enumerate(DTYPES)}
_INT64_MAX = (1 << 63) - 1


class HeaderColumns:
    """The entries of one safetensors header (``__metadata__`` apart), in file order, as columns (see the module).

    ``metadata``: the ``__metadata__`` value (None when absent); ``problem``: why the header breaks the format
    ("" when it does not), as the dict path of :mod:`.safetensors_check` says it.  Iterating
    gives the names (as a header dict's keys, ``__metadata__`` included when present); ``len()`` counts the
    tensor entries."""

    def __init__(self) -> None:
        self.names = bytearray()
        self.name_ends = array("q")
        self.dtype_code = array("b")
        self.valid = array("b")
        self.dims = array("q")
        self.dim_ends = array("q")
        self.begin = array("q")
        self.end = array("q")
        self.need_bytes = array("q")
        self.name_hash = array("q")  # ``hash()`` of each name: duplicates found without a set of names
        self.metadata = None
        self.has_metadata = False
        self.problem = ""
        self.source: Optional[dict] = None  # the header as ``json`` parsed it, where the columns fell back to it

    # -- reading
    def __len__(self) -> int:
        return len(self.name_ends)

    def name(self, i: int) -> str:
        """The name of entry ``i``."""
        a = self.name_ends[i - 1] if i else 0
        return self.names[a:self.name_ends[i]].decode("utf-8")

    def shape(self, i: int) -> List[int]:
        """The shape of entry ``i`` (``[]`` for an entry that is not well formed)."""
        a = self.dim_ends[i - 1] if i else 0
        return list(self.dims[a:self.dim_ends[i]])

    def dtype(self, i: int) -> Optional[str]:
        """The safetensors dtype name of entry ``i`` (None for an entry that is not well formed)."""
        c = self.dtype_code[i]
        return DTYPES[c] if c >= 0 else None

    def __iter__(self) -> Iterator[str]:
        if self.has_metadata:
            yield "__metadata__"
        for i in range(len(self)):
            yield self.name(i)

    def get(self, key: str, default=None):
        """``__metadata__`` as a header dict gives it (the only key callers look up)."""
        return self.metadata if key == "__metadata__" and self.has_metadata else default

    def __getitem__(self, key: str):
        if key == "__metadata__" and self.has_metadata:
            return self.metadata
        raise KeyError(key)

    def entry(self, i: int) -> dict:
        """Entry ``i`` as the header dict holds it (``dtype``, ``shape``, ``data_offsets``); valid entries only."""
        return {"dtype": self.dtype(i), "shape": self.shape(i), "data_offsets": [self.begin[i], self.end[i]]}

    def valid_indices(self) -> "np.ndarray":  # noqa: F821
        """Indices (int64) of the well-formed entries, in file order."""
        import numpy as np

        return np.flatnonzero(np.frombuffer(self.valid, np.int8)).astype(np.int64)

    def names_array(self):
        """Every entry's name as a ``pyarrow`` string array (no Python object per name)."""
        import numpy as np
        import pyarrow as pa

        offs = np.zeros(len(self) + 1, np.int64)
        offs[1:] = np.frombuffer(self.name_ends, np.int64)
        return pa.LargeStringArray.from_buffers(len(self), pa.py_buffer(offs), pa.py_buffer(bytes(self.names))
                                                ).cast(pa.string())

    # -- building
    def _add(self, name: str, e) -> None:
        self.names += name.encode("utf-8")
        self.name_ends.append(len(self.names))
        self.name_hash.append(hash(name))
        self.begin.append(0)
        self.end.append(0)
        self.need_bytes.append(-1)
        self.dtype_code.append(-1)
        self.valid.append(0)
        self.dim_ends.append(len(self.dims))

    def _set(self, i: int, e: dict) -> None:
        from .safetensors_header import DTYPE_BITS

        b, en = e["data_offsets"]
        shape = e["shape"]
        nbits = math.prod(shape) * DTYPE_BITS[e["dtype"]]
        if max(b, en, nbits // 8, *shape, 0) > _INT64_MAX:
            raise OverflowError("a header value beyond int64")
        self.begin[i], self.end[i] = b, en
        self.need_bytes[i] = -1 if nbits % 8 else nbits // 8
        self.dtype_code[i] = _CODE[e["dtype"]]
        self.valid[i] = 1
        self.dims.extend(shape)
        self.dim_ends[i] = len(self.dims)


def parse(text: str, nul_text: str = "") -> Tuple[Optional[HeaderColumns], str]:
    """``(columns, why)`` of a header's text (it starts with ``{``), as ``_parse_header`` gives ``(header, why)``:
    columns None when the text is no JSON object; ``why`` non-empty on any violation (``nul_text``: what a JSON
    error adds about NUL bytes in the header).  Memory: the text and
    the columns (~40 bytes per entry), one entry's parsed value at a time."""
    from .safetensors_header import content_problem, entry_problem, iter_header

    if "\\u" in text:
        return _via_dict(text, nul_text)
    cols, first = HeaderColumns(), ""
    try:
        for name, value in iter_header(text):
            if name == "__metadata__":
                if cols.has_metadata:
                    return _via_dict(text, nul_text)
                cols.metadata, cols.has_metadata = value, True
                continue
            cols._add(name, value)
            problem = entry_problem(name, value)
            if problem:
                first = first or problem
            else:
                cols._set(len(cols) - 1, value)
    except (ValueError, RecursionError, OverflowError):  # JSON's own message, a duplicate or a huge integer: json
        return _via_dict(text, nul_text)
    if _has_duplicates(cols):
        return _via_dict(text, nul_text)
    meta_problem = content_problem({"__metadata__": cols.metadata}) if cols.has_metadata else ""
    cols.problem = meta_problem or first
    return cols, cols.problem


def _has_duplicates(cols: HeaderColumns) -> bool:
    """Whether two entries share a name: equal hashes sorted together, their names then compared."""
    import numpy as np

    if len(cols) < 2:
        return False
    h = np.sort(np.frombuffer(cols.name_hash, np.int64))
    same = np.flatnonzero(h[1:] == h[:-1])
    if not len(same):
        return False
    suspects = set(h[same].tolist())
    seen = set()
    for i, x in enumerate(cols.name_hash):
        if x in suspects:
            name = cols.name(i)
            if name in seen:
                return True
            seen.add(name)
    return False


def _via_dict(text: str, nul_text: str) -> Tuple[Optional[HeaderColumns], str]:
    from .safetensors_header import parse_dict

    obj, why = parse_dict(text, nul_text)
    return (None if obj is None else from_dict(obj, why)), why


def from_dict(header: Dict[str, object], problem: str = "") -> HeaderColumns:
    """The columns of a header parsed by ``json`` (``problem``: why it breaks the format, "" when it does not).
    Values beyond int64 are saturated (such an entry's span is wrong whatever the saturated value)."""
    from .safetensors_header import DTYPE_BITS, entry_problem

    cols = HeaderColumns()
    cols.problem, cols.source = problem, header
    for name, e in header.items():
        if name == "__metadata__":
            cols.metadata, cols.has_metadata = e, True
            continue
        cols._add(name, e)
        if entry_problem(name, e):
            continue
        i = len(cols) - 1
        try:
            cols._set(i, e)
        except OverflowError:
            nbits = math.prod(e["shape"]) * DTYPE_BITS[e["dtype"]]
            cols.begin[i], cols.end[i] = (min(x, _INT64_MAX) for x in e["data_offsets"])
            cols.need_bytes[i] = -1 if nbits % 8 else min(nbits // 8, _INT64_MAX)
            cols.dtype_code[i], cols.valid[i] = _CODE[e["dtype"]], 1
            cols.dims.extend(min(d, _INT64_MAX) for d in e["shape"])
            cols.dim_ends[i] = len(cols.dims)
    return cols
