"""Judging a pickle's imports by how it uses them, not by name alone: the second look of :mod:`ckptaudit.security`.

A name's tier by its name (:func:`ckptaudit.security.classify_import`) changes when the pickle uses it
as no data class is used: a call whose result is called again, a ``defaultdict`` whose factory is code, a
data class built from a computed value (:func:`judge_usage`).  :func:`numpy_dtype_classes` lists the
``numpy.dtypes`` classes torch's weights-only loader meets for the ``numpy.dtype`` objects of a pickle.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

from ..pickle_walk import Call, GlobalRef, Instance, WalkResult, normalize_global
from .tiers import NUMPY_DTYPE_CLASS, NUMPY_DTYPE_PREFIX, BENIGN, WEIGHTS_ONLY_GLOBALS


def nodes(obj: Any, max_nodes: int = 2_000_000) -> Iterator[Any]:
    """Every value reachable from ``obj`` (each container once), bounded."""
    todo = [obj]
    seen = set()
    n = 0
    while todo and n < max_nodes:
        x = todo.pop()
        n += 1
        yield x
        t = type(x)
        if t in (dict, list, tuple, set, frozenset) or isinstance(x, dict):
            if id(x) in seen:
                continue
            seen.add(id(x))
            if isinstance(x, dict):
                todo.extend(x.keys())
                todo.extend(x.values())
            else:
                todo.extend(x)
        elif t is Instance or t is Call:
            if id(x) in seen:
                continue
            seen.add(id(x))
            todo.append(x.cls if t is Instance else x.func)
            todo.extend(x.args)
            todo.append(x.state)
            todo.append(x.items)


def numpy_dtype_classes(result: WalkResult) -> List[str]:
    """numpy.dtypes.*DType classes that torch's BUILD check will meet for numpy.dtype objects."""
    out = set()
    results = [result]
    while results:
        r = results.pop()
        results.extend(r.nested)
        for x in nodes(r.obj):
            if type(x) is not Instance or type(x.cls) is not GlobalRef:
                continue
            if "%s.%s" % normalize_global(x.cls.module, x.cls.name) != "numpy.dtype":
                continue
            code = x.args[0] if x.args and type(x.args[0]) is str else None
            if code is None:
                continue
            cls = NUMPY_DTYPE_CLASS.get(code) or NUMPY_DTYPE_PREFIX.get(code[:1])
            if cls:
                out.add(f"numpy.dtypes.{cls}")
    return sorted(out)


def _ref_name(x: Any) -> Optional[str]:
    return "%s.%s" % normalize_global(x.module, x.name) if type(x) is GlobalRef else None


def _is_data_factory(x: Any) -> bool:
    """A defaultdict ``default_factory`` that is data: None or a built-in/allowlisted type."""
    if x is None:
        return True
    n = _ref_name(x)
    return n is not None and (n in WEIGHTS_ONLY_GLOBALS or n in BENIGN and n.startswith("builtins."))


def judge_usage(result: WalkResult, verdicts: list, unknown_src: str) -> None:
    """Move names between tiers by how the pickle uses them (in place; ``verdicts``: the
    :class:`ckptaudit.security.ImportVerdict` of each import; ``unknown_src``: the text of the unknown tier).

    * a call whose result is called again (``REDUCE`` whose callable is a
      call's result), on a benign or unknown name: dangerous — the name hands
      out callables;
    * ``collections.defaultdict`` whose ``default_factory`` is not a built-in
      type or None: dangerous — the factory is stored and called on each
      missing key;
    * a benign data class called with a computed argument (the result of
      another call): unknown — data classes are rebuilt from constants.
    """
    by_name: Dict[str, Any] = {}  # name -> its ImportVerdict
    for v in verdicts:
        by_name.setdefault("%s.%s" % normalize_global(v.module, v.name), v)
    results = [result]
    while results:
        r = results.pop()
        results.extend(r.nested)
        for x in nodes(r.obj):
            tx = type(x)
            if tx is Call or tx is Instance:
                _judge_call(x, tx, by_name, unknown_src)


def _judge_call(x: Any, tx: type, by_name: Dict[str, Any], unknown_src: str) -> None:
    """:func:`judge_usage` for one call or instance ``x`` of the pickle."""
    f = x.func if tx is Call else x.cls
    if tx is Call and type(f) in (Call, Instance):
        inner = _ref_name(f.func if type(f) is Call else f.cls)
        v = by_name.get(inner or "")
        if v is not None and v.category in ("benign", "unknown"):
            v.category, v.add_safe = "dangerous", ""
            v.source = "its call's result is called in turn (REDUCE on a computed callable)"
        return
    v = by_name.get(_ref_name(f) or "")
    if v is None or v.category != "benign":
        return
    if _ref_name(f) == "collections.defaultdict":
        if x.args and not _is_data_factory(x.args[0]):
            v.category, v.add_safe = "dangerous", ""
            v.source = (f"defaultdict with default_factory {x.args[0]!s:.60}: a callable stored and called "
                        "on every missing key")
        return
    if any(type(a) is Call for a in x.args):
        v.category, v.add_safe = "unknown", ""
        v.source = "a data class called with a computed argument (not rebuilt from constants); " + unknown_src
