"""The described tree of a walked pickle: bounded pruning (PruneBudget, prune) and small tensor values decoded from bytes.

Nothing is unpickled: :func:`prune` turns the symbolic objects of :mod:`ckptaudit.pickle_walk` into
JSON-able nodes; :func:`decode_small` reads a tensor of at most 8 elements from its little-endian bytes.
"""

from __future__ import annotations

import itertools
import struct
from typing import Any, Dict, List, Optional, Union

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
#: full length under ``"__truncated__"``, :data:`ckptaudit.components.tree_values.TRUNCATED`).
TREE_MAX_ITEMS = 4096
#: Nodes one file's tree may spend describing containers again that it has described already (a pickle memoises a
#: dict or list met twice and rebuilds one object: ``{"a": d, "b": d}``).  A shared container whose expansion
#: does not fit what is left is written as :data:`SHARED` once it has been described: a DAG of shared dicts or
#: lists (``d1 = {"a": d0, "b": d0}``, ``d2 = {"a": d1, "b": d1}``, …, 2**40 paths in a few hundred bytes) is
#: then a tree of at most this many nodes more than it has distinct containers.
SHARED_REPEAT_NODES = 100_000
#: The described tree's leaf for a shared container not described again (its first place describes it).
SHARED = "<shared>"
#: The described tree's leaves for a container that holds itself, and for a description cut by the budget.
CYCLE, OVER_BUDGET, DEEP = "<cycle>", "<budget>", "<deep>"
_MAX_DEPTH = 40
#: Characters of a string (a dict key, a value) that cost one node of the budgets (:func:`text_nodes`): the
#: tree's JSON stays within about this many bytes a node, whatever lengths of text the pickle shares.
CHARS_PER_NODE = 64


class PruneBudget:
    """Work bound of :func:`prune`: nodes left, the containers on the current path (cycles), the containers
    described already (by ``id``: the walk's objects live as long as the walk's result), the nodes left for
    describing shared ones again, whether the node budget ran out (``exhausted``) and how many shared
    containers were written as :data:`SHARED` (``shared_cut``)."""

    def __init__(self, nodes: int = PRUNE_NODE_BUDGET, repeat_nodes: int = SHARED_REPEAT_NODES) -> None:
        self.left = nodes
        self.path: set = set()
        self.exhausted = False
        self.described: set = set()
        self.repeat_left = repeat_nodes
        self.repeating = 0  # > 0 while describing a shared container again (paid for as a whole)
        self.shared_cut = 0
        self._sizes: Dict[tuple, int] = {}

    def again(self, obj: Any, depth: int) -> bool:
        """Whether shared container ``obj`` (described already), met at ``depth``, is described again: while its
        expansion there (:func:`expanded_nodes`) fits the nodes left for repeats, which it then spends."""
        n = expanded_nodes(obj, self.repeat_left, self._sizes, depth)
        if n > self.repeat_left:
            self.shared_cut += 1
            return False
        self.repeat_left -= n
        return True


class ShownValues:
    """The small tensors a described tree shows, gathered while :func:`prune` builds it (given as its
    ``values``): each tensor's :class:`TensorMeta` with the tree node that describes it, whose ``"value"``
    :meth:`fill` sets once the bytes were read.  A tree shows at most :data:`TREE_MAX_ITEMS` entries of a
    container, so a file's reader decodes those, not every small tensor it holds (issue 45: 300,000 optimizer
    scalars held as values by ``id`` were ~26 MiB at the scan job's peak)."""

    def __init__(self) -> None:
        #: shown tensors of ≤ :data:`SMALL_TENSOR_NUMEL` elements of a decodable dtype, and their nodes, in order
        self.tensors: List[TensorMeta] = []
        self.nodes: List[Dict[str, Any]] = []

    def want(self, tm: TensorMeta, node: Dict[str, Any]) -> None:
        """Note that ``node`` describes ``tm`` (kept only when its value could be decoded)."""
        if tm.numel <= SMALL_TENSOR_NUMEL and small_nbytes(tm.dtype, tm.numel):
            self.tensors.append(tm)
            self.nodes.append(node)

    def fill(self, values: Dict[int, Any]) -> None:
        """Set ``"value"`` of each node whose tensor has one in ``values`` (by ``id(TensorMeta)``)."""
        for tm, node in zip(self.tensors, self.nodes):
            if id(tm) in values:
                node["value"] = values[id(tm)]


def prune(obj: Any, values: Union[Dict[int, Any], ShownValues], depth: int = 0, max_items: int = TREE_MAX_ITEMS,
          budget: Optional[PruneBudget] = None) -> Any:
    """A JSON-able description of a walked pickle object.

    Tensors become ``{"__tensor__": dtype, "shape": [...], "value": x}``
    (``value`` only for tensors of ≤ 8 elements whose bytes were readable);
    symbolic instances keep their class name and state.  ``values`` maps
    ``id(TensorMeta)`` to decoded small values, or is a :class:`ShownValues` that gathers the small tensors
    shown, for their values to be read and set afterwards.  A container met again (the pickle shares it) is described
    again while :data:`SHARED_REPEAT_NODES` allow, else it is :data:`SHARED`; text costs a node per
    :data:`CHARS_PER_NODE` characters: the tree is at most ``budget``'s nodes, whatever the pickle's sharing
    would rebuild.
    """
    if budget is None:
        budget = PruneBudget()
    if depth > _MAX_DEPTH:
        return DEEP
    budget.left -= 1 + text_nodes(obj)
    if budget.left < 0:  # a tree that re-expands shared containers (a list appended to itself) ends here
        budget.exhausted = True
        return OVER_BUDGET
    if isinstance(obj, (dict, list, tuple)) and not obj:  # `()` is one object wherever it appears: never "shared"
        return {} if isinstance(obj, dict) else []
    if isinstance(obj, (dict, list, tuple, Instance, Call)):
        key = id(obj)
        if key in budget.path:
            return CYCLE
        repeat = key in budget.described and not budget.repeating
        if repeat and not budget.again(obj, depth):
            return SHARED
        budget.described.add(key)
        budget.path.add(key)
        budget.repeating += repeat
        try:
            return _prune_container(obj, values, depth, max_items, budget)
        finally:
            budget.path.discard(key)
            budget.repeating -= repeat
    return _prune_leaf(obj, values)


def _prune_container(obj: Any, values: Union[Dict[int, Any], ShownValues], depth: int, max_items: int, budget: "PruneBudget") -> Any:
    if isinstance(obj, dict):
        out = {}
        for i, (k, v) in enumerate(obj.items()):
            if i >= max_items:
                out["__truncated__"] = len(obj)
                break
            ks = str(k)
            budget.left -= text_nodes(ks)
            out[ks if budget.left >= 0 else ks[:200]] = prune(v, values, depth + 1, max_items, budget)
        return out
    if isinstance(obj, (list, tuple)):
        if _numbers(obj):
            return {"__list__": len(obj)}
        return [prune(v, values, depth + 1, max_items, budget) for v in obj[:max_items]]
    if isinstance(obj, Instance):
        cls = obj.cls
        name = f"{cls.module}.{cls.name}" if isinstance(cls, GlobalRef) else str(cls)
        d: Dict[str, Any] = {"__instance__": name}
        if obj.args:
            d["args"] = prune(_seq(obj.args), values, depth + 1, max_items, budget)
        if obj.state is not None:
            d["state"] = prune(obj.state, values, depth + 1, max_items, budget)
        if obj.items:
            d["items"] = prune(obj.items, values, depth + 1, max_items, budget)
        return d
    f = obj.func  # Call
    name = f"{f.module}.{f.name}" if isinstance(f, GlobalRef) else "<computed>"
    return {"__call__": name, "args": prune(_seq(obj.args), values, depth + 1, max_items, budget)}


def _seq(args: Any) -> Any:
    """An Instance's or Call's arguments as :func:`prune` describes them: the walk's own tuple (its ``id`` is
    stable, so sharing is seen), a list made of anything else."""
    return args if isinstance(args, (list, tuple)) else list(args)


def _numbers(seq: Any) -> bool:
    """A list or tuple :func:`prune` writes as its length alone: over 64 entries, the first 64 numbers."""
    return len(seq) > 64 and all(isinstance(x, (int, float)) for x in seq[:64])


def expanded_nodes(obj: Any, cap: int, sizes: Dict[tuple, int], depth: int = 0, path: Optional[set] = None) -> int:
    """Nodes :func:`prune` writes for ``obj`` at ``depth`` when it expands every shared container again, counted
    up to ``cap + 1`` (more is "over").  Linear in the distinct containers below ``obj``: each one's count at
    each depth is kept in ``sizes`` (by ``(id, depth)``, at most 41 depths), so a DAG whose expansion is 2**40
    nodes is counted in as many steps as it has containers.  Past depth 40 a node counts one, as :func:`prune`
    writes ``"<deep>"`` there; a container on the current ``path`` (a cycle) counts one, as :func:`prune`
    writes ``"<cycle>"``."""
    if depth > _MAX_DEPTH:
        return 1
    if not isinstance(obj, (dict, list, tuple, Instance, Call)):
        return 1 + text_nodes(obj)
    key = (id(obj), depth)
    if key in sizes:
        return sizes[key]
    path = set() if path is None else path
    if id(obj) in path:
        return 1
    path.add(id(obj))
    n = 1 + (sum(text_nodes(str(k)) for k in itertools.islice(obj, TREE_MAX_ITEMS)) if isinstance(obj, dict) else 0)
    try:
        for child in _children(obj):
            n += expanded_nodes(child, cap, sizes, depth + 1, path)
            if n > cap:
                n = cap + 1
                break
    finally:
        path.discard(id(obj))
    sizes[key] = n
    return n


def text_nodes(x: Any) -> int:
    """Nodes of the budget a string ``x`` costs beyond its own: one per :data:`CHARS_PER_NODE` characters, so a
    long string met many times (a shared key or value: one object in the pickle, written at every place) spends
    the budget as its JSON grows; 0 for anything else."""
    return len(x) // CHARS_PER_NODE if isinstance(x, str) else 0


def _children(obj: Any):
    """What :func:`prune` describes below container ``obj``, in its order and within its cuts."""
    if isinstance(obj, dict):
        return list(itertools.islice(obj.values(), TREE_MAX_ITEMS))
    if isinstance(obj, (list, tuple)):
        return [] if _numbers(obj) else obj[:TREE_MAX_ITEMS]
    kids = [_seq(obj.args)] if obj.args else []
    if isinstance(obj, Instance):
        if obj.state is not None:
            kids.append(obj.state)
        if obj.items:
            kids.append(obj.items)
    return kids


def cut(d: Dict[str, Any], max_items: int = TREE_MAX_ITEMS) -> Dict[str, Any]:
    """``d`` with at most ``max_items`` entries, cut as :func:`prune` cuts a dict (its full length under
    ``"__truncated__"``): a safetensors header of 1,000,000 entries is a tree of 4,096, not 52 MB of JSON that
    every later stage decodes."""
    if len(d) <= max_items:
        return d
    out = dict(zip(list(d)[:max_items], list(d.values())[:max_items]))
    out["__truncated__"] = len(d)
    return out


def _prune_leaf(obj: Any, values: Union[Dict[int, Any], ShownValues]) -> Any:
    if isinstance(obj, TensorMeta):
        d = {"__tensor__": obj.dtype, "shape": list(obj.shape)}
        if type(values) is ShownValues:
            values.want(obj, d)
        elif id(obj) in values:
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
