"""A zip's records as columns (issue 45): one typed array per :class:`Member` field and the names in one buffer.

A torch zip holds a record per tensor storage; a :class:`Member` object each cost ~400 bytes with its name and
ints (~119 MiB at 300,000 tensors).  :class:`Records` keeps the same facts in ``array`` columns (8 bytes a value)
and every name, UTF-8 encoded, in one ``bytearray`` with their end offsets, and hands out a :class:`Member` only
for the record asked for (a copy: changing it leaves the record as it was).
"""

from __future__ import annotations

import bisect
from array import array
from typing import Iterable, Iterator, List, Optional, Sequence, Union, overload

from .reader import Member

#: Integer fields of :class:`Member` and the ``array`` type code of their column: offsets and sizes come from
#: 64-bit zip fields that a damaged entry may fill with any value (unsigned), the two data offsets are -1 when
#: unknown, ``crc_actual`` is -1 for None.
_INTS = {"header_offset": "Q", "data_offset": "q", "size_bytes": "Q", "crc32": "Q", "compressed_size_bytes": "Q",
         "method": "H", "flags": "H", "loose_data_offset": "q", "crc_actual": "q"}
#: an archive of at most this many records looks names up in a dict of them (:func:`rows_in`; one pyarrow lookup
#: cost ~70 µs, and a small unit's scan asks three times, its hash plan twice)
DICT_ROWS = 4096
#: Fields that are True / False (``crc_ok`` also None): one signed byte each, -1 for None.
_FLAGS = ("crc_ok", "header_ok", "complete")
_TEXT = "utf-8"
_ERRORS = "surrogatepass"


class Records(Sequence[Member]):
    """The records of one zip archive, in archive order, as columns.

    A sequence of :class:`Member`: ``len``, iteration and ``records[i]`` build the member asked for (a slice, a
    list of them).  :meth:`find` (:meth:`row`) is the first record of a name, :meth:`rows_of` the last record of each of many
    names (as a dict by name kept it), :meth:`column` one field as a numpy array and :attr:`names` the names as a
    sequence of ``str`` made one at a time.  Memory: ~9 × 8 bytes plus the UTF-8 name per record.
    """

    def __init__(self) -> None:
        self._rows_by_name = None  # (records then, {name: last row}) of a small archive, made by rows_of
        self._text = bytearray()
        self._ends = array("q")
        self._ints = {k: array(code) for k, code in _INTS.items()}
        self._flags = {k: array("b") for k in _FLAGS}

    @classmethod
    def of(cls, members: Iterable[Member]) -> "Records":
        """The records of ``members`` (in their order)."""
        out = cls()
        for m in members:
            out.append(m)
        return out

    def append(self, m: Member) -> None:
        """Add the facts of record ``m`` (``m`` itself is not kept)."""
        self._text += m.name.encode(_TEXT, _ERRORS)
        self._ends.append(len(self._text))
        for k, col in self._ints.items():
            v = getattr(m, k)
            col.append(-1 if v is None else v)
        for k, col in self._flags.items():
            v = getattr(m, k)
            col.append(-1 if v is None else int(v))

    def of_another_file(self, crc32, old_folder: bytes, new_folder: bytes) -> "Records":
        """These records as another file of the same layout holds them (:mod:`ckptaudit.onepass.zip_layouts`): a
        copy with ``crc32`` (one per record, in order) and, in every name, archive folder ``new_folder`` (of the
        same length: ASCII bytes) where ``old_folder`` stands, each name beginning with it and ``/``."""
        out = Records()
        out._ends = array("q", self._ends)
        out._ints = {k: array(col.typecode, col) for k, col in self._ints.items()}
        out._ints["crc32"] = array(self._ints["crc32"].typecode, (int(c) for c in crc32))
        out._flags = {k: array("b", col) for k, col in self._flags.items()}
        out._text = bytearray(self._text)
        if new_folder != old_folder:
            for start in (0, *self._ends[:-1]):
                out._text[start:start + len(old_folder)] = new_folder
        return out

    def __len__(self) -> int:
        return len(self._ends)

    def _start(self, i: int) -> int:
        return self._ends[i - 1] if i else 0

    def name(self, i: int) -> str:
        """The name of record ``i``."""
        return self._text[self._start(i): self._ends[i]].decode(_TEXT, _ERRORS)

    def name_list(self, first: Optional[int] = None) -> List[str]:
        """The names of the first ``first`` records (None: every record), in archive order, as a list (an ASCII
        buffer is decoded once, not a name at a time)."""
        n = len(self) if first is None else min(first, len(self))
        ends = self._ends[:n]
        text = self._text[:ends[-1]] if n else b""
        if not text.isascii():
            return [self.name(i) for i in range(n)]
        text = text.decode("ascii")
        return [text[a:b] for a, b in zip((0, *ends[:-1]), ends)]

    def _member(self, i: int) -> Member:
        ints = {k: col[i] for k, col in self._ints.items()}
        if ints["crc_actual"] < 0:
            ints["crc_actual"] = None
        flags = {k: (None if col[i] < 0 else bool(col[i])) for k, col in self._flags.items()}
        return Member(name=self.name(i), **ints, **flags)

    @overload
    def __getitem__(self, i: int) -> Member: ...

    @overload
    def __getitem__(self, i: slice) -> List[Member]: ...

    def __getitem__(self, i: Union[int, slice]):
        if isinstance(i, slice):
            return [self._member(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record {i} of {n}")
        return self._member(i % n)

    def __iter__(self) -> Iterator[Member]:
        for i in range(len(self)):
            yield self._member(i)

    def __eq__(self, other) -> bool:
        return isinstance(other, Records) and (self._text, self._ends, self._ints, self._flags) == (
            other._text, other._ends, other._ints, other._flags)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list is

    def __repr__(self) -> str:
        return f"Records({len(self)} records)"

    @property
    def names(self) -> "Names":
        """Every record's name, in archive order."""
        return Names(self, None)

    def names_where(self, rows: Sequence[int]) -> "Names":
        """The names of the records at ``rows`` (row numbers), in their order."""
        return Names(self, rows)

    def intact_rows(self) -> Sequence[int]:
        """The rows whose local header agrees with the central directory and whose CRC did not fail (an
        ``array`` of int64: no numpy, as the file layer imports none)."""
        ok, crc = self._flags["header_ok"], self._flags["crc_ok"]
        return array("q", (i for i in range(len(self)) if ok[i] == 1 and crc[i] != 0))

    def int_column(self, field: str) -> Sequence[int]:
        """Integer field ``field`` of :class:`Member` of every record (the column itself, an ``array``: read only;
        -1 for None in ``crc_actual``)."""
        return self._ints[field]

    def column(self, field: str):
        """Field ``field`` of :class:`Member` of every record as a numpy array (int64 or uint64 for the ints,
        int8 with -1 for None for ``crc_ok``/``header_ok``/``complete``; a copy)."""
        import numpy as np

        col = self._ints.get(field, self._flags.get(field))
        if col is None:
            raise KeyError(field)
        return np.array(col, dtype=np.dtype(col.typecode if col.typecode != "b" else "i1"))

    def row(self, name: str) -> int:
        """Row of the first record named ``name``, or -1 (the names' buffer is searched, no name is built)."""
        b = name.encode(_TEXT, _ERRORS)
        text, ends = self._text, self._ends
        if not b:
            return next((i for i in range(len(self)) if ends[i] == self._start(i)), -1)
        j = text.find(b)
        while j >= 0:
            i = bisect.bisect_right(ends, j)  # the record whose name holds byte j
            if self._start(i) == j and ends[i] == j + len(b):
                return i
            j = text.find(b, j + 1)
        return -1

    def find(self, name: str) -> Optional[Member]:
        """The first record named ``name`` (as ``next(m for m in records if m.name == name)``), or None."""
        i = self.row(name)
        return None if i < 0 else self._member(i)

    def __contains__(self, m) -> bool:
        return isinstance(m, Member) and any(x == m for x in self)

    def rows_of(self, names):
        """Row of the last record of each of ``names`` (a sequence of ``str`` or a pyarrow string array), -1
        where none: what ``{m.name: m for m in records}`` would answer, as an int64 numpy array, without a
        name object per record (pyarrow's hash lookup over the names' buffer)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(self)
        if n <= DICT_ROWS:  # a small archive: a dict of its names (kept until a record is added) answers
            if self._rows_by_name is None or self._rows_by_name[0] != n:
                self._rows_by_name = (n, {name: i for i, name in enumerate(self.name_list())})
            return rows_in(self._rows_by_name[1], names)
        want = (names if isinstance(names, (pa.Array, pa.ChunkedArray)) else pa.array(list(names), pa.string())
                ).cast(pa.large_string())
        if n == 0 or len(want) == 0:
            return np.full(len(want), -1, np.int64)
        backwards = pc.take(self._names_array(), pa.array(np.arange(n - 1, -1, -1)))  # the last of equal names first
        hit = pc.fill_null(pc.index_in(want, value_set=backwards), -1).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.where(hit >= 0, n - 1 - hit, -1)

    def _names_array(self):
        """The names as one pyarrow string array over the names' buffer (no copy of it)."""
        import numpy as np
        import pyarrow as pa

        offsets = np.zeros(len(self) + 1, np.int64)
        offsets[1:] = np.frombuffer(self._ends, np.int64)
        # the buffer itself (no copy): the array lives only while a lookup runs, and no name is appended meanwhile
        return pa.LargeStringArray.from_buffers(len(self), pa.py_buffer(offsets), pa.py_buffer(self._text))


def rows_in(by_name: dict, names) -> "np.ndarray":  # noqa: F821 - numpy is imported inside, when called
    """The row ``by_name`` (``{name: row}``) gives each of ``names`` (a sequence of ``str`` or a pyarrow string
    array), -1 where none, as an int64 numpy array."""
    import numpy as np
    import pyarrow as pa

    asked = names.to_pylist() if isinstance(names, (pa.Array, pa.ChunkedArray)) else list(names)
    return np.fromiter((by_name.get(k, -1) for k in asked), np.int64, len(asked))


class Names(Sequence[str]):
    """Record names of a :class:`Records` (all, or those at ``rows``), each made when asked for; ``name in names``
    searches the names' buffer."""

    def __init__(self, records: Records, rows) -> None:
        self._records = records
        self._rows = rows

    def __len__(self) -> int:
        return len(self._records) if self._rows is None else len(self._rows)

    def _row(self, i: int) -> int:
        return i if self._rows is None else int(self._rows[i])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"name {i} of {n}")
        return self._records.name(self._row(i % n))

    def __iter__(self) -> Iterator[str]:
        if self._rows is None and len(self) <= DICT_ROWS:  # a small archive's names decoded at once
            yield from self._records.name_list()
            return
        for i in range(len(self)):
            yield self._records.name(self._row(i))

    def __contains__(self, name) -> bool:
        if not isinstance(name, str):
            return False
        if self._rows is None:
            return self._records.row(name) >= 0
        if self._records.row(name) < 0:
            return False
        return any(self._records.name(int(r)) == name for r in self._rows)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))
