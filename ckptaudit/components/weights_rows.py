"""The model weights of a unit, complete: from the tensors table where the scan tree was cut.

A scan tree keeps :data:`ckptaudit.layouts.tree.TREE_MAX_ITEMS` (4,096) entries of a dict (a pickled
state_dict) or of a safetensors header, so that no later stage decodes a 100,000-entry tree; the tensors
table holds every tensor.  :func:`complete` gives the structure layer (key sets against a reference, shapes,
the structure hash) and the reference builder every weight, not the first 4,096.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable

from .. import components as C


def complete(c: C.Components, facts: Dict[str, Any], tensors: Iterable[dict]) -> Dict[str, dict]:
    """``{name relative to its component: {"__tensor__": dtype, "shape": [...]}}`` of every weight tensor.

    ``c.weights`` when no chosen weights node was pruned; else, for each pruned ``(file key, dotted prefix)``
    of ``c.weights_cut_at``, the tensors table rows (``file``, ``name``, ``dtype``, ``shape``) of that file
    whose name starts with the prefix, the prefix removed (a safetensors file's prefix is "": its names
    are the header's keys).  ``facts["tree_files"]`` maps a tree's file key to the table's ``file`` where they
    differ (otherwise, and in scan rows written before it existed: the key itself, or any file of the unit for
    ``"root"``).  The
    unpruned nodes' entries come from ``c.weights`` as before."""
    weights = dict(c.weights or {})
    if not c.weights_cut_at:
        return weights
    files = facts.get("tree_files") or {}
    wanted = {}
    for fkey, path in c.weights_cut_at:
        rel = files.get(fkey, None if fkey == "root" else fkey)
        wanted.setdefault(rel, []).append(f"{path}." if path else "")
    shared: Dict[tuple, dict] = {}  # one value dict per (dtype, shape): 1,000,000 one-element tensors share one
    for t in tensors:
        heads = wanted.get(t["file"]) or wanted.get(None) or ()
        name = t["name"]
        for head in heads:
            if name.startswith(head):
                weights[name[len(head):]] = _shared_value(shared, t.get("dtype"), t.get("shape"))
                break
    return weights


def _shared_value(shared: Dict[tuple, dict], dtype, shape) -> dict:
    """The value ``{"__tensor__": dtype, "shape": [...]}`` of a weight, one object per distinct (dtype, shape) in
    ``shared``: a dict per tensor is ~300 bytes (~300 MiB at 1,000,000 tensors, issue 45), and no consumer of
    :func:`complete` changes a value in place."""
    dims = tuple(shape or ())
    v = shared.get((dtype, dims))
    if v is None:
        v = shared[(dtype, dims)] = {"__tensor__": dtype, "shape": list(dims)}
    return v
