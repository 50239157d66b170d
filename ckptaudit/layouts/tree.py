"""The described tree of a walked pickle: bounded pruning (PruneBudget, prune) and small tensor values decoded from bytes.

Nothing is unpickled: :func:`prune` turns the symbolic objects of :mod:`ckptaudit.pickle_walk` into
JSON-able nodes; :func:`decode_small` reads a tensor of at most 8 elements from its little-endian bytes.
"""

from __future__ import annotations

import struct
from typing import Any, Dict, Optional

from ..pickle_walk import Call, GlobalRef, Instance, TensorMeta, short_repr

# Element formats for reading small tensors (scalars such as an optimizer's
# per-parameter ``step``) straight from the bytes, little-endian as torch writes
# them (torch/serialization.py records ``byteorder``).
_STRUCT = {
    "float64": "d", "float32": "f", "float16": "e", "int64": "q", "int32": "i",
    "int16": "h", "int8": "b", "uint8": "B", "bool": "?",
}
SMALL_TENSOR_NUMEL = 8


# ---------------------------------------------------------------- pruning
PRUNE_NODE_BUDGET = 1_000_000  # nodes described per file; a pickle whose tree is larger is a finding
#: Entries of one dict or list a described tree keeps; the tensors table has them all (a cut dict holds its
#: full length under ``"__truncated__"``, :data:`ckptaudit.tree_values.TRUNCATED`).
TREE_MAX_ITEMS = 4096


class PruneBudget:
    """Work bound of :func:`prune`: nodes left, the containers on the current path (cycles), and
    whether the budget ran out (``exhausted``)."""

    def __init__(self, nodes: int = PRUNE_NODE_BUDGET) -> None:
        self.left = nodes
        self.path: set = set()
        self.exhausted = False


def prune(obj: Any, values: Dict[int, Any], depth: int = 0, max_items: int = TREE_MAX_ITEMS,
          budget: Optional[PruneBudget] = None) -> Any:
    """A JSON-able description of a walked pickle object.

    Tensors become ``{"__tensor__": dtype, "shape": [...], "value": x}``
    (``value`` only for tensors of ≤ 8 elements whose bytes were readable);
    symbolic instances keep their class name and state.  ``values`` maps
    ``id(TensorMeta)`` to decoded small values.
    """
    if budget is None:
        budget = PruneBudget()
    if depth > 40:
        return "<deep>"
    budget.left -= 1
    if budget.left < 0:  # a tree that re-expands shared containers (a list appended to itself) ends here
        budget.exhausted = True
        return "<budget>"
    if isinstance(obj, (dict, list, tuple, Instance, Call)):
        if id(obj) in budget.path:
            return "<cycle>"
        budget.path.add(id(obj))
        try:
            return _prune_container(obj, values, depth, max_items, budget)
        finally:
            budget.path.discard(id(obj))
    return _prune_leaf(obj, values)


def _prune_container(obj: Any, values: Dict[int, Any], depth: int, max_items: int, budget: "PruneBudget") -> Any:
    if isinstance(obj, dict):
        out = {}
        for i, (k, v) in enumerate(obj.items()):
            if i >= max_items:
                out["__truncated__"] = len(obj)
                break
            out[str(k)] = prune(v, values, depth + 1, max_items, budget)
        return out
    if isinstance(obj, (list, tuple)):
        if len(obj) > 64 and all(isinstance(x, (int, float)) for x in obj[:64]):
            return {"__list__": len(obj)}
        return [prune(v, values, depth + 1, max_items, budget) for v in obj[:max_items]]
    if isinstance(obj, Instance):
        cls = obj.cls
        name = f"{cls.module}.{cls.name}" if isinstance(cls, GlobalRef) else str(cls)
        d: Dict[str, Any] = {"__instance__": name}
        if obj.args:
            d["args"] = prune(list(obj.args), values, depth + 1, max_items, budget)
        if obj.state is not None:
            d["state"] = prune(obj.state, values, depth + 1, max_items, budget)
        if obj.items:
            d["items"] = prune(obj.items, values, depth + 1, max_items, budget)
        return d
    f = obj.func  # Call
    name = f"{f.module}.{f.name}" if isinstance(f, GlobalRef) else "<computed>"
    return {"__call__": name, "args": prune(list(obj.args), values, depth + 1, max_items, budget)}


def cut(d: Dict[str, Any], max_items: int = TREE_MAX_ITEMS) -> Dict[str, Any]:
    """``d`` with at most ``max_items`` entries, cut as :func:`prune` cuts a dict (its full length under
    ``"__truncated__"``): a safetensors header of 1,000,000 entries is a tree of 4,096, not 52 MB of JSON that
    every later stage decodes."""
    if len(d) <= max_items:
        return d
    out = dict(zip(list(d)[:max_items], list(d.values())[:max_items]))
    out["__truncated__"] = len(d)
    return out


def _prune_leaf(obj: Any, values: Dict[int, Any]) -> Any:
    if isinstance(obj, TensorMeta):
        d = {"__tensor__": obj.dtype, "shape": list(obj.shape)}
        if id(obj) in values:
            d["value"] = values[id(obj)]
        return d
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": len(obj)}
    if isinstance(obj, GlobalRef):
        return {"__global__": f"{obj.module}.{obj.name}"}
    if isinstance(obj, (set, frozenset)):  # members are hashable scalars or nested (frozen)sets: one level shown
        return [v if isinstance(v, (str, int, float, bool)) or v is None else short_repr(v, 200)
                for v in list(obj)[:4096]]
    return short_repr(obj, 200)  # bounded: a 100,000-deep persistent id must not recurse


def small_nbytes(dtype: str, numel: int) -> Optional[int]:
    """Bytes of a tensor of ≤ 8 elements that :func:`decode_small` can decode, else None."""
    if numel > SMALL_TENSOR_NUMEL:
        return None
    if dtype == "bfloat16":
        return 2 * numel
    fmt = _STRUCT.get(dtype)
    return None if fmt is None else struct.calcsize(fmt) * numel


def decode_small(raw: bytes, dtype: str, numel: int):
    """The value(s) of a small tensor from its little-endian bytes; None when not decodable
    (short read, unknown dtype).  NaN/Inf become the strings ``"nan"``/``"inf"``."""
    n = small_nbytes(dtype, numel)
    if n is None or len(raw) != n:
        return None
    if dtype == "bfloat16":
        vals = [struct.unpack("<f", b"\x00\x00" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    else:
        vals = list(struct.unpack("<" + _STRUCT[dtype] * numel, raw))
    vals = [v if not isinstance(v, float) or v == v and abs(v) != float("inf") else str(v) for v in vals]
    return vals[0] if numel == 1 else vals


def read_small(fh, offset: int, dtype: str, numel: int):
    """Decode a tensor of ≤ 8 elements at ``offset`` of open file ``fh``; None when not decodable."""
    n = small_nbytes(dtype, numel)
    if n is None or offset < 0:
        return None
    fh.seek(offset)
    return decode_small(fh.read(n), dtype, numel)
