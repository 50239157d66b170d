"""The import lines a printed Python repair needs, computed from the dotted names it uses.

A repair is printed to be pasted and run as it is (``docs/findings.md``).  Python repairs name library objects
by their full dotted path (``torch.serialization.add_safe_globals([numpy._core.multiarray._reconstruct, …])``,
``safetensors.torch.load_model(model, …)``), which fails in a fresh interpreter with ``NameError`` unless the
modules are imported first.  :func:`with_imports` puts ``import <module>`` lines before such a repair: for each
dotted name rooted at a name the code neither binds nor may assume (:data:`RESUME_OBJECTS`, builtins), the path
less its last part (``numpy.dtypes.UInt32DType`` → ``import numpy.dtypes``; ``numpy.dtype`` → ``import
numpy``).  Importing a submodule binds its package too, so ``import numpy`` is left out where ``import
numpy.dtypes`` is printed.  A name written as a string (``(dict, "pytorch_lightning…AttributeDict")``) needs no
import; a repair that imports its root itself (``import torch`` then ``torch.nn.Module``) is left as written.

Nothing is imported here: the module of a dotted name is its path less the last part, which holds for every
name a repair prints (a module's function or class, never a nested class); ``tests/test_repairs_run.py`` runs
each printed repair in a fresh interpreter.
"""

from __future__ import annotations

import ast
import builtins
from typing import List, Optional, Set

__all__ = ["RESUME_OBJECTS", "is_python", "needed_imports", "with_imports"]

#: What a resume script holds when it runs a repair, by the names repairs use for them: ``ckpt`` (the
#: checkpoint as the resume loads it, ``torch.load(unit, weights_only=True)`` for a file), ``state_dict`` (the
#: model's weights taken from it), ``model``, ``optimizer`` and ``scheduler`` (built as the training code
#: builds them).  A repair may use these without defining them; any other name it must define or import.
RESUME_OBJECTS = frozenset({"ckpt", "state_dict", "model", "optimizer", "scheduler"})

_BUILTINS = frozenset(dir(builtins))


def is_python(code: str) -> bool:
    """True when ``code`` parses as Python (a shell repair such as ``cp a b && truncate …`` does not)."""
    return _parse(code) is not None


def needed_imports(code: str) -> List[str]:
    """The modules ``code`` uses by dotted name without importing them, sorted, a package left out where one of
    its submodules is listed; [] for code that is not Python."""
    tree = _parse(code)
    if tree is None:
        return []
    bound = _bound(tree)
    mods: Set[str] = set()
    for chain in _chains(tree):
        if len(chain) >= 2 and chain[0] not in bound and chain[0] not in RESUME_OBJECTS \
                and chain[0] not in _BUILTINS:
            mods.add(".".join(chain[:-1]))
    return sorted(m for m in mods if not any(o.startswith(m + ".") for o in mods))


def with_imports(code: str) -> str:
    """``code`` with one ``import <module>`` line per module of :func:`needed_imports` put before it."""
    mods = needed_imports(code) if code else []
    return "".join(f"import {m}\n" for m in mods) + code


def _parse(code: str) -> Optional[ast.Module]:
    if not code.strip():
        return None
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def _bound(tree: ast.Module) -> Set[str]:
    """Names the code binds: assignment, loop and comprehension targets, imports, arguments, defs."""
    out: Set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
    return out


def _chains(tree: ast.Module) -> List[List[str]]:
    """Every longest dotted name ``a.b.c`` read in the code (an attribute chain down to a plain name)."""
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and id(n) not in inner:
            parts, x = [], n
            while isinstance(x, ast.Attribute):
                parts.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name):
                out.append([x.id] + parts[::-1])
    return out
