"""A pickle the static walk could not finish: the one builder of ``pickle_unreadable`` and ``pickle_too_complex``.

The zip scanner (:mod:`ckptaudit.layouts.base`: data.pkl and the described tree) and the legacy
checker (:mod:`.legacy`: its five pickles) decide that a walk stopped or a tree ran out of budget;
the findings are built here, naming ``display`` (the file as it sits in the run folder).
"""

from __future__ import annotations

from typing import Any, Iterable

from .. import findings
from ..findings import Finding

#: ``detail["cut"]`` of a ``pickle_too_complex``: the walk itself stopped at its work budget (the tensors it named
#: are only those before the cut), or the walk finished and only the described tree was cut (every tensor named).
CUT_WALK, CUT_TREE = "walk", "tree"


def unreadable(display: str, member: str, why: str) -> Finding:
    """``pickle_unreadable``: the pickle in ``member`` is damaged (``why``)."""
    return findings.make("pickle_unreadable", path=display, member=member, why=why)


def walk_problem(res: Any, display: str, member: str) -> Finding:
    """The finding for a walk (:class:`ckptaudit.pickle_walk.WalkResult`) that stopped before ``STOP``:
    ``pickle_too_complex`` when only the work budget ran out (the bytes may be fine), ``pickle_unreadable``
    for damage."""
    if not res.budget_exhausted:
        return unreadable(display, member, res.error)
    if res.imports_complete:
        imports = "every import was still listed and checked"
    else:
        imports = (f"imports were checked up to byte {res.imports_end} only, the rest was not scanned: treat the "
                   f"file as untrusted")
    return findings.make("pickle_too_complex", path=display, member=member, why=res.error, imports=imports,
                         cut=CUT_WALK)


def tree_too_complex(display: str, node_budget: int) -> Finding:
    """``pickle_too_complex`` for a walked object whose described tree expands past ``node_budget`` nodes
    (``layouts.tree.PRUNE_NODE_BUDGET``)."""
    return findings.make("pickle_too_complex", path=display,
                         why=f"its object tree expands past {node_budget} nodes, as shared containers "
                             f"re-expanded (a list appended to itself) do",
                         imports="every import was checked", cut=CUT_TREE)


def tree_shared_cut(display: str, n_cut: int, repeat_nodes: int) -> Finding:
    """``pickle_too_complex`` for a walked object whose shared containers (memoised and referenced again: a DAG of
    dicts or lists) would rebuild a tree larger than the ``repeat_nodes`` nodes
    (``layouts.tree.SHARED_REPEAT_NODES``) the description spends on them: ``n_cut`` references were described
    once only."""
    return findings.make("pickle_too_complex", path=display,
                         why=f"its containers are shared so often that rebuilding it would expand them past "
                             f"{repeat_nodes:,} more nodes (a DAG of dicts or lists referencing each other); "
                             f"{n_cut:,} shared references are described once only",
                         imports="every import was checked", cut=CUT_TREE)


def _kind_and_detail(f: Any) -> tuple:
    if isinstance(f, dict):
        return f.get("kind"), f.get("detail") or {}
    return getattr(f, "kind", None), getattr(f, "detail", None) or {}


def too_complex(found: Iterable[Any]) -> bool:
    """Whether any of ``found`` (:class:`Finding` values or their dicts) is a ``pickle_too_complex``: the walk or
    the described tree was cut, so the tree is partial."""
    return any(_kind_and_detail(f)[0] == "pickle_too_complex" for f in found)


def walk_cut(found: Iterable[Any]) -> bool:
    """Whether a ``pickle_too_complex`` of ``found`` says the walk itself stopped at its budget
    (``detail["cut"] == "walk"``): the tensors it named are only those before the cut.  A cut of the described
    tree alone leaves every tensor named."""
    return any(kind == "pickle_too_complex" and detail.get("cut") == CUT_WALK
               for kind, detail in map(_kind_and_detail, found))
