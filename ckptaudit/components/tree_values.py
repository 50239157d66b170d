"""Reading values out of a scan tree: tensor descriptions, wrapped object state, group sizes, finite scalars.

A scan tree is the pruned, JSON-safe description of a pickle that :mod:`ckptaudit.layouts` writes
(``tree_json``): tensors are ``{"__tensor__": dtype, "shape": [...]}``, objects rebuilt by the
pickle are ``{"__class__": ..., "state": ...}``.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any, Dict, Optional, Tuple

from .. import recognise as R


def is_tensor(x: Any) -> bool:
    return R.is_tensor(x)


def state_of(x: Any) -> Any:
    """The attribute dict of a pruned instance (argparse.Namespace, AttributeDict…), else ``x``."""
    if isinstance(x, dict) and "__instance__" in x:
        f = R._fields(x)
        return f if isinstance(f, dict) else {}
    return x


def tensor_map(d: Any, prefix: str = "") -> Dict[str, dict]:
    """Flatten nested mappings of tensors into {"a.b.c": tensor-desc}.

    Of a whole ``torch.nn.Module`` pickled as an object (:func:`ckptaudit.recognise.is_module`) only the fields
    its ``state_dict()`` is made of (``_parameters``, ``_buffers``, ``_modules``): a tensor kept as a plain
    attribute (ultralytics' ``Detect.anchors``, ``DetectionModel.stride``) is neither a parameter nor a buffer."""
    out: Dict[str, dict] = {}
    module = R.is_module(d)
    d = R._fields(d) if isinstance(d, dict) else None
    if not d:
        return out
    for k, v in d.items():
        if k == "__truncated__" or (module and k not in R.MODULE_FIELDS):
            continue
        name = f"{prefix}{k}"
        if R.is_tensor(v):
            out[name] = v
        elif isinstance(v, dict) and "__tensor__" not in v:
            out.update(tensor_map(v, name + "."))
    return out


#: The key :func:`ckptaudit.layouts.tree.prune` adds to a dict it cut, holding the dict's full length.
TRUNCATED = "__truncated__"


def is_cut(node: Any) -> bool:
    """Whether pruning cut ``node`` or a mapping under it (a ``"__truncated__"`` key at any depth)."""
    if not isinstance(node, dict):
        return False
    return TRUNCATED in node or any(is_cut(v) for v in node.values() if isinstance(v, dict) and "__tensor__" not in v)


def n_entries(d: dict) -> int:
    """Entries of a pruned dict: its full length where pruning cut it (``d["__truncated__"]``), else ``len(d)``."""
    n = d.get(TRUNCATED)
    return n if isinstance(n, int) and not isinstance(n, bool) else len(d)


def group_size(group: Any) -> Optional[int]:
    """Number of parameter ids in an optimizer param group (long id lists are pruned
    to ``{"__list__": n}`` in the scan tree)."""
    if not isinstance(group, dict):
        return None
    p = group.get("params")
    if isinstance(p, list):
        return len(p)
    if isinstance(p, dict) and isinstance(p.get("__list__"), int):
        return p["__list__"]
    return None


def scalar(x: Any) -> Optional[float]:
    """A number stored as a Python number or a one-element tensor whose value was read.

    Only finite numbers count: every caller reads a counter (step, epoch, last_epoch), and
    ``inf``/``nan`` (a JSON ``1e999999``, a pickled ``float("inf")``) or an integer beyond float range
    counts nothing (``int(inf)`` raised OverflowError in the structure, configdiff and state stages)."""
    if isinstance(x, bool):
        return None
    if is_tensor(x):
        x = x.get("value")
        if isinstance(x, bool):
            return None
    if isinstance(x, (int, float)):
        try:
            return x if math.isfinite(x) else None
        except OverflowError:  # an int too large for a float
            return None
    return None


def lookup(tree: Dict[str, Any], spec: str) -> Tuple[Optional[Any], str]:
    """The value at ``"file pattern:dotted.path"`` in a unit's tree, and where it was found."""
    pat, _, dotted = spec.partition(":")
    for fkey, sub in tree.items():
        base = fkey.rsplit("/", 1)[-1]
        if pat != "*" and not fnmatch.fnmatch(base, pat):
            continue
        node = sub
        for part in dotted.split("."):
            node = dict(R.children(node)).get(part) if isinstance(node, (dict, list)) else None
            if node is None:
                break
        if node is not None:
            return node, f"{fkey}:{dotted}"
    return None, ""
