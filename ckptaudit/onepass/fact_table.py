"""One file's ``bytefacts`` rows as one ``pyarrow`` table, built column by column (:func:`file_table`).

:func:`ckptaudit.onepass.facts.table_of` gathers a file's facts as parts (``(kind, n, columns)``); this module
lays them out as the rows of the table's schema: no Python object per row, one Arrow array per column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

if TYPE_CHECKING:
    import pyarrow as pa


def file_table(schema: "pa.Schema", same: dict, parts: List[Tuple[str, int, dict]]) -> "pa.Table":
    """The rows of one file's ``parts`` (``(kind, n, columns)``, in order) as one table of ``schema``: the values
    in ``same`` repeated on every row, ``kind`` per part, each part's columns where it has them, null elsewhere.
    Built column by column for the whole file (a small file's four kinds of fact cost one Arrow array per column,
    not one per kind and column: issue 45, ~70 Arrow calls per small unit before)."""
    import numpy as np
    import pyarrow as pa

    total = sum(n for _k, n, _c in parts)
    kinds = [k for k, _n, _c in parts]
    arrays = []
    for f in schema:
        if f.name in same and pa.types.is_string(f.type):  # a dictionary of one: 4 bytes a row, not the
            arrays.append(_repeated_string(same[f.name], total))           # string's (issue 45: 1,000,000 facts)
        elif f.name in same:
            arrays.append(pa.repeat(pa.scalar(same[f.name], f.type), total))  # one value, n rows (8× a take)
        elif f.name == "kind":  # a dictionary of the kinds, one code per row
            codes = np.repeat(np.arange(len(kinds), dtype=np.int32), [n for _k, n, _c in parts])
            arrays.append(pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(kinds, pa.string())))
        else:
            arrays.append(_column(f, parts, total))
    return pa.Table.from_arrays(arrays, names=schema.names)


def _column(f: "pa.Field", parts: List[Tuple[str, int, dict]], total: int) -> "pa.Array":
    """Column ``f`` of :func:`file_table`'s rows: each part's values, or nulls for a part without it."""
    import numpy as np
    import pyarrow as pa

    have = [f.name in cols for _k, _n, cols in parts]
    if not any(have):
        return pa.nulls(total, f.type)
    if all(have) and len(parts) == 1:
        return pa.array(parts[0][2][f.name], f.type)
    if pa.types.is_integer(f.type) or pa.types.is_floating(f.type):  # one array and one validity mask
        values = np.zeros(total, f.type.to_pandas_dtype())
        mask = np.ones(total, bool)
        at = 0
        for (_k, n, cols), h in zip(parts, have):
            if h:
                values[at:at + n] = cols[f.name]
                mask[at:at + n] = False
            at += n
        return pa.array(values, f.type, mask=mask)
    return pa.concat_arrays([pa.array(cols[f.name], f.type) if h else pa.nulls(n, f.type)
                             for (_k, n, cols), h in zip(parts, have)])


def _repeated_string(value: Optional[str], n: int) -> "pa.Array":
    """``n`` rows of string ``value`` as a dictionary array (``pyarrow``), which casts to the string column."""
    import numpy as np
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([value], pa.string()))
