"""Describing the result: literal builtin calls, salvage of a cut-short pickle, and tensor paths."""

from __future__ import annotations

from typing import Any, List, Tuple

from .model import AttrDict, Call, Instance, TensorMeta
from .names import LITERAL_ENCODINGS
from .reader import MISSING, safe_key

def literal_call(full: str, args: tuple) -> Any:
    """Value of a harmless builtin called with literal arguments, else MISSING."""
    make = _LITERAL_CALLS.get(full)
    if make is None:
        return MISSING
    try:
        return make(full, args)
    except (ValueError, TypeError, OverflowError, UnicodeError):
        return MISSING


def _named_encoding(args: tuple) -> bool:
    """``(str, encoding)`` with an encoding of :data:`LITERAL_ENCODINGS`."""
    return len(args) == 2 and type(args[0]) is str and type(args[1]) is str and args[1].lower() in LITERAL_ENCODINGS


def _encode(full: str, args: tuple) -> Any:
    if _named_encoding(args):
        return args[0].encode(args[1])
    if len(args) == 1 and type(args[0]) is str:
        return args[0].encode("utf-8")
    return MISSING


def _set(full: str, args: tuple) -> Any:
    kind = set if full == "builtins.set" else frozenset
    if not args:
        return kind()
    if len(args) == 1 and type(args[0]) in (list, tuple, set, frozenset):
        return kind([safe_key(x) for x in args[0]])
    return MISSING


def _bytearray(full: str, args: tuple) -> Any:
    if not args:
        return bytearray()
    if len(args) == 1 and type(args[0]) in (bytes, bytearray):
        return bytearray(args[0])
    if _named_encoding(args):
        return bytearray(args[0], args[1])
    return MISSING


def _complex(full: str, args: tuple) -> Any:
    return complex(*args) if 1 <= len(args) <= 2 and all(type(a) in (int, float) for a in args) else MISSING


def _slice(full: str, args: tuple) -> Any:
    return slice(*args) if 1 <= len(args) <= 3 and all(a is None or type(a) is int for a in args) else MISSING


#: The builtins whose call on literal arguments the walk evaluates (their value is data, never code).
_LITERAL_CALLS = {"_codecs.encode": _encode, "builtins.set": _set, "builtins.frozenset": _set,
                  "builtins.bytearray": _bytearray, "builtins.complex": _complex, "builtins.slice": _slice}


def fold_unfinished(stack: List[Any], metastack: List[List[Any]], st: Any) -> Any:
    """Fold the frames of an unfinished pickle into their containers and return the root.

    A cut-short ``EMPTY_DICT MARK k v k v ...`` keeps its pairs on the inner
    frame until ``SETITEMS``; folding them shows how far the pickle got.
    """
    frames = metastack + [stack]
    for i in range(len(frames) - 1, 0, -1):
        items, below = frames[i], frames[i - 1]
        if not below:
            continue
        target = below[-1]
        tt = type(target)
        if tt is dict or tt is AttrDict or tt is Instance or tt is Call:
            st.setitems(target, items[: len(items) - len(items) % 2], -1, "salvage")
        elif tt is list:
            target.extend(items)
    for fr in frames:
        if fr:
            return fr[0]
    return None


def tensor_paths(root: Any, built: List[TensorMeta], max_nodes: int = 5_000_000,
                 max_depth: int = 1000) -> List[Tuple[str, TensorMeta]]:
    """Dotted paths of every TensorMeta reachable from ``root``, depth-first in insertion order.

    A tensor reachable twice (tied weights) is listed under each path; a
    container is expanded once (cycles and shared sub-trees stop there).
    Tensors that were built but are not reached (a cut-short pickle, or
    nesting deeper than ``max_depth`` containers) are listed as
    ``<unreached>.N``.
    """
    return _paths(root, built, max_nodes, max_depth, _dotted)


def tensor_key_paths(root: Any, built: List[TensorMeta], max_nodes: int = 5_000_000,
                     max_depth: int = 1000) -> List[Tuple[Tuple[Any, ...], TensorMeta]]:
    """What :func:`tensor_paths` lists, in the same order, each path as its components (a dict key as it is,
    ``"a.b"`` one component; a list index as an int; ``"<arg0>"``, ``"<state>"`` for an object's parts): the
    dotted path joins them with ``.`` and cannot tell ``{"a.b": t}`` from ``{"a": {"b": t}}``; these can."""
    return _paths(root, built, max_nodes, max_depth, _tupled)


def _dotted(path: str, k: Any) -> str:
    return f"{path}.{k}" if path else str(k)


def _tupled(path: tuple, k: Any) -> tuple:
    return path + (k,)


def _paths(root: Any, built: List[TensorMeta], max_nodes: int, max_depth: int, step) -> List[Tuple[Any, TensorMeta]]:
    out: List[Tuple[Any, TensorMeta]] = []
    seen_containers = set()
    reached = set()
    empty = "" if step is _dotted else ()
    todo: List[Tuple[Any, Any, int]] = [(root, empty, 0)]
    visited = 0
    branch = _BRANCH
    while todo and visited < max_nodes:
        obj, path, depth = todo.pop()
        visited += 1
        t = type(obj)
        if t is TensorMeta:
            out.append((path, obj))
            reached.add(id(obj))
            continue
        if t not in branch or id(obj) in seen_containers or depth >= max_depth:
            continue
        seen_containers.add(id(obj))
        d = depth + 1
        if t is dict or t is AttrDict:
            kids = [(v, step(path, k), d) for k, v in obj.items() if type(v) in branch]
        elif t is list or t is tuple:
            kids = [(v, step(path, i), d) for i, v in enumerate(obj) if type(v) in branch]
        else:  # Instance / Call
            kids = _object_kids(obj, path, d, step)
        kids.reverse()
        todo.extend(kids)
    n = 0
    for t in built:
        if id(t) not in reached:
            out.append((step(step(empty, "<unreached>"), n), t))
            n += 1
    return out


def _object_kids(obj: Any, path: Any, d: int, step) -> List[Tuple[Any, Any, int]]:
    """The children of an :class:`Instance` or :class:`Call` that may hold tensors, as ``(child, path,
    depth)``: its arguments, its state (a dict, or the first of a ``(dict, slots)`` pair) and its items."""
    branch = _BRANCH
    kids = [(a, step(path, f"<arg{i}>"), d) for i, a in enumerate(obj.args) if type(a) in branch]
    s = obj.state
    if type(s) is tuple and len(s) == 2 and isinstance(s[0], dict):
        s = s[0]
    if isinstance(s, dict):
        kids.extend((v, step(path, k), d) for k, v in s.items() if type(v) in branch)
    elif type(s) in branch:
        kids.append((s, step(path, "<state>"), d))
    it = obj.items
    if isinstance(it, dict):
        kids.extend((v, step(path, k), d) for k, v in it.items() if type(v) in branch)
    elif isinstance(it, list):
        kids.extend((v, step(path, i), d) for i, v in enumerate(it) if type(v) in branch)
    return kids


# types tensor_paths descends into (everything else is a leaf without tensors)
_BRANCH = frozenset({TensorMeta, dict, AttrDict, list, tuple, Instance, Call})
