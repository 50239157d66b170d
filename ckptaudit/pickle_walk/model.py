"""The walk's result model: the symbolic values a pickle is described by, and :class:`WalkResult`.

Nothing here is ever imported from the pickle: a :class:`GlobalRef` only names ``module.name``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .dtypes import dtype_itemsize


class _Dotted:
    """``module.name`` as text: the ``__str__`` that :class:`GlobalRef` and :class:`GlobalImport` share."""

    __slots__ = ()

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class GlobalRef(_Dotted):
    """A symbolic reference to ``module.name`` as named in the pickle (never imported)."""

    module: str
    name: str


@dataclass(frozen=True)
class GlobalImport(_Dotted):
    """One import the pickle asks for.

    ``opcode`` is ``GLOBAL``, ``STACK_GLOBAL``, ``INST`` or ``EXT1/2/4``;
    ``pos`` is the byte offset of that opcode.  ``literal`` is False when the
    names were not plain strings in the stream (``STACK_GLOBAL`` operands that
    were computed, or an extension-registry code), in which case ``module`` and
    ``name`` are short descriptions, not real names.
    """

    module: str
    name: str
    opcode: str
    pos: int
    literal: bool


@dataclass(slots=True)
class StorageRef:
    """One torch storage named by a persistent id.

    ``key`` is the storage key (``data/<key>`` in a zip checkpoint; a
    ``_cdata`` number in the legacy format).  ``numel`` is the number of
    *elements* of ``dtype`` the persistent id declares (None if it was not an
    int); ``itemsize`` is bytes per element (0 when the storage type is
    unknown).  ``nbytes`` is therefore ``numel * itemsize``.
    """

    key: str
    dtype: str
    location: str
    numel: Optional[int]
    itemsize: int

    @property
    def nbytes(self) -> Optional[int]:
        return None if self.numel is None else self.numel * self.itemsize


@dataclass(slots=True)
class TensorMeta:
    """A tensor as described by its rebuild call: a view into ``storage``.

    ``storage_offset`` is in elements; ``shape``/``stride`` in elements per
    dimension.  ``dtype`` is the tensor's dtype name (``"float32"`` ...).
    """

    storage: StorageRef
    storage_offset: int
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: str
    requires_grad: bool = False
    is_parameter: bool = False

    @property
    def numel(self) -> int:
        """Number of elements (product of ``shape``; 1 for a scalar)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's own elements (``numel * itemsize``)."""
        return self.numel * dtype_itemsize(self.dtype, self.storage.itemsize)


@dataclass(slots=True, eq=False)
class Instance:
    """An object built from a class-like global.

    Made by ``NEWOBJ``/``NEWOBJ_EX``/``INST``/``OBJ``, or by ``REDUCE`` of a
    global whose name looks like a class.  ``state`` is what ``BUILD`` would
    pass to ``__setstate__``; ``items`` collects ``SETITEM(S)`` (dict) or
    ``APPEND(S)`` (list) applied to it.  For ``NEWOBJ_EX`` a non-empty kwargs
    dict is appended as the last element of ``args``.
    """

    cls: Any
    args: tuple
    state: Any = None
    items: Any = None


@dataclass(slots=True)
class Call:
    """A call that stays symbolic: ``func(*args)``.

    ``func`` is a :class:`GlobalRef`, or — when the pickle calls something it
    computed (an obfuscation trick) — any symbolic value.  ``state``/``items``
    record ``BUILD`` and ``SETITEM(S)``/``APPEND(S)`` applied to the result.
    """

    func: Any
    args: tuple
    state: Any = None
    items: Any = None


@dataclass
class PersistentRef:
    """A persistent id that is not a torch storage (or ``persistent="raw"``)."""

    pid: Any


class AttrDict(dict):
    """A dict (from ``collections.OrderedDict()``) that may also receive ``BUILD`` state.

    torch's ``state_dict()`` stores ``_metadata`` this way: the state is kept
    in ``.attrs`` (a plain dict, empty when there was no ``BUILD``), the items
    stay the dict's own.
    """

    __slots__ = ("_attrs",)

    @property
    def attrs(self) -> Dict[str, Any]:
        try:
            return self._attrs
        except AttributeError:
            self._attrs: Dict[str, Any] = {}
            return self._attrs


@dataclass
class WalkResult:
    """What :func:`walk` found.  See :mod:`ckptaudit.pickle_walk` for the format facts."""

    obj: Any
    globals: List[GlobalImport] = field(default_factory=list)
    storages: Dict[str, StorageRef] = field(default_factory=dict)
    tensors: List[Tuple[str, TensorMeta]] = field(default_factory=list)
    tricks: List[str] = field(default_factory=list)
    nested: List["WalkResult"] = field(default_factory=list)
    error: Optional[str] = None
    end: int = 0
    n_ops: int = 0
    protocol: Optional[int] = None
    #: the walk ran out of its work budget (opcodes or objects held) before STOP; ``globals`` still lists
    #: every import up to ``imports_end`` (the rest of the stream is scanned for imports without building)
    budget_exhausted: bool = False
    #: offset up to which imports are known (``end`` unless the imports scan also ran out)
    imports_end: int = 0
    #: every import of the stream is in ``globals`` (False only when the imports-only scan stopped early)
    imports_complete: bool = True

    def all_globals(self) -> List[GlobalImport]:
        """Imports of this pickle and of every nested one, in order."""
        out = list(self.globals)
        for sub in self.nested:
            out.extend(sub.all_globals())
        return out

    def distinct_globals(self) -> List[GlobalImport]:
        """:meth:`all_globals`, each ``(module, name, literal)`` once, in order of first appearance: the imports
        the security layer judges (:func:`ckptaudit.security.scan`, :func:`ckptaudit.security.torchscript.scan`)."""
        seen, out = set(), []
        for g in self.all_globals():
            key = (g.module, g.name, g.literal)
            if key not in seen:
                seen.add(key)
                out.append(g)
        return out

    def all_tricks(self) -> List[str]:
        out = list(self.tricks)
        for sub in self.nested:
            out.extend(sub.all_tricks())
        return out



def instance_fields(obj):
    """The attribute dict of a walked dataclass instance (its ``BUILD`` state, a ``(dict, slots)`` pair merged;
    ``{"args": [...]}`` when it was built from arguments alone; ``{}`` otherwise), or ``obj`` itself when it is
    no :class:`Instance`: how DCP's ``Metadata`` and ``_StorageInfo`` read without unpickling."""
    if isinstance(obj, Instance):
        st = obj.state
        if isinstance(st, tuple) and len(st) == 2 and isinstance(st[1], dict):  # (dict, slots)
            st = {**(st[0] or {}), **st[1]}
        if isinstance(st, dict):
            return st
        if obj.args:
            return {"args": list(obj.args)}
        return {}
    return obj
