"""What a load child reports about the object ``torch.load(weights_only=True)`` gave back.

Run in the forked load child, after the load, by :func:`ckptaudit.stages.load.loadtest.load_in_child` and
:func:`ckptaudit.stages.load.child.batched_loads` alike.  ``n_top_level_keys`` is the top-level dict's length
(-1 for any other type); ``n_tensors`` counts the distinct ``torch.Tensor`` objects reachable through
dict values, lists, tuples and sets (``obj`` itself may be one).

The count is what the verdict falls back on when the static pickle walk gave up on a file
(``pickle_too_complex``): the walk's partial tree cannot say whether the file holds weights, the loaded
object can (:mod:`ckptaudit.cut_walk`).  Containers are visited once each (by ``id``), so a pickle of
shared lists with 2**35 paths costs its 35 lists, and the walk stops after :data:`MAX_NODES`
containers and elements, reporting ``n_tensors`` as ``None`` (unknown), never a partial count.
"""

from __future__ import annotations

from typing import Optional

#: Elements examined at most (dict values, list/tuple/set items): a few seconds in the child at this size,
#: against ~10**6 for a 100,000-tensor training checkpoint with its optimizer state.
MAX_NODES = 50_000_000


def count_tensors(obj, max_nodes: int = MAX_NODES) -> Optional[int]:
    """Distinct tensors reachable from ``obj`` (dict values, list/tuple/set items), or ``None`` past
    ``max_nodes`` examined elements.  Iterative: a 100,000-deep nesting costs no recursion."""
    import torch

    kinds = (torch.Tensor, dict, list, tuple, set, frozenset)
    seen, n, examined = set(), 0, 0
    todo = [obj]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            n += 1
            continue
        items = x.values() if isinstance(x, dict) else x
        examined += len(items)
        if examined > max_nodes:
            return None
        if any(issubclass(t, kinds) for t in set(map(type, items))):  # a C-speed pass over plain scalars
            todo.extend(v for v in items if isinstance(v, kinds))
    return n


def summary(obj) -> dict:
    """``{"status": "ok", "n_top_level_keys": …, "n_tensors": …}`` for a loaded object."""
    return {"status": "ok", "n_top_level_keys": len(obj) if isinstance(obj, dict) else -1,
            "n_tensors": count_tensors(obj)}
