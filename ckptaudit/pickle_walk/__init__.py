"""A static, symbolic pickle interpreter: describe a pickle without unpickling it.

The audit must never run what it audits, so this module never calls an
unpickler's ``load``, never subclasses the standard ``Unpickler`` and never
imports torch.  It drives a stack machine over the standard library's opcode
decoder, :func:`pickletools.genops` (see the ``pickletools`` documentation and
the opcode table in ``Lib/pickletools.py``), as :func:`.opcodes.genops` runs it
from the buffer (same results, half the cost), and interprets every opcode of
protocols 0-5 *symbolically*: a ``GLOBAL`` becomes a :class:`GlobalRef`, a
``REDUCE`` becomes a :class:`Call` or :class:`Instance`, and torch's tensor
rebuild calls become :class:`TensorMeta` records.  Nothing is imported,
looked up or called; the only values computed are plain literals (``_codecs``
bytes, ``builtins.set`` and friends with literal arguments).

Torch format facts used here, and where they come from (torch 2.13):

* new zip format (``torch/serialization.py``, ``_save`` → ``persistent_id``):
  each storage is the persistent id
  ``('storage', storage_type, key, location, numel)`` where ``storage_type``
  is a legacy typed-storage class such as ``torch.FloatStorage`` (or
  ``torch.UntypedStorage`` for byte storages), ``key`` is the archive member
  name under ``data/`` and ``numel`` counts *elements* of ``storage_type``;
  the reader (``_load`` → ``persistent_load``) computes
  ``nbytes = numel * element_size(dtype)``;
* legacy format (``_legacy_save`` → ``persistent_id``):
  ``('storage', storage_type, root_key, location, numel, view_metadata)``;
  the file is several pickles back to back (magic number, protocol version,
  sys info, the object, the storage keys) followed by raw storage bytes, so
  :func:`walk` reports ``end`` for the caller to walk the next one;
* tensors (``torch/_tensor.py`` ``_reduce_ex_internal`` and
  ``torch/_utils.py``): ``_rebuild_tensor_v2(storage, storage_offset, size,
  stride, requires_grad, backward_hooks[, metadata])``; dtypes without a
  legacy storage class (float8, uint16, ... — ``torch/storage.py``
  ``_new_dtypes``) use ``_rebuild_tensor_v3(..., dtype, metadata)`` over an
  ``UntypedStorage``; parameters wrap a tensor in
  ``_rebuild_parameter(data, requires_grad, backward_hooks)`` or
  ``_rebuild_parameter_with_state``; tensors with Python state or subclasses
  go through ``torch._tensor._rebuild_from_type_v2(func, new_type, args,
  state)``.

All sizes are element counts (``numel``) or bytes (``nbytes``/``itemsize``)
as the names say; offsets (``pos``, ``end``) are byte offsets into the buffer
given to :func:`walk`.

This package is a face over its modules: :mod:`.model` (the result types), :mod:`.dtypes`, :mod:`.names`,
:mod:`.budgets`, :mod:`.reader`, :mod:`.streams` (:func:`walk`, :func:`walk_streams`), :mod:`.machine`
(the opcode loop), :mod:`.hidden` and :mod:`.objects` (its handlers) and :mod:`.salvage`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from . import budgets
from .dtypes import dtype_itemsize, dtype_of_storage_type
from .model import AttrDict, Call, GlobalImport, GlobalRef, Instance, PersistentRef, StorageRef, TensorMeta, WalkResult
from .names import normalize_global
from .reader import clean_text, short_repr  # noqa: F401 - re-exported
from .streams import walk, walk_streams


__all__ = [
    "AttrDict",
    "Call",
    "GlobalImport",
    "GlobalRef",
    "Instance",
    "PersistentRef",
    "StorageRef",
    "TensorMeta",
    "WalkResult",
    "dtype_of_storage_type",
    "dtype_itemsize",
    "normalize_global",
    "walk",
    "walk_streams",
]

#: names of the walk's budgets (``MAX_OPS``, ``_MAX_NESTED_DEPTH`` ...), which live in :mod:`.budgets`
_BUDGET_NAMES = frozenset(n for n in vars(budgets) if n.lstrip("_")[:1].isupper())
globals().update({n: getattr(budgets, n) for n in _BUDGET_NAMES})  # copies, so vars() shows them too


class _Face(types.ModuleType):
    """This package as a module.  A budget (``MAX_OPS``, ``MAX_WALK_BLOCKS``, ``_MAX_NESTED_DEPTH`` ...)
    read here is read from :mod:`.budgets`, where the walk reads it, and one set or deleted here is set
    or deleted there as well, so ``monkeypatch.setattr(pickle_walk, "MAX_WALK_BLOCKS", n)`` takes effect."""

    def __getattribute__(self, name: str) -> Any:
        if name in _BUDGET_NAMES:
            return getattr(budgets, name)
        return super().__getattribute__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _BUDGET_NAMES:
            setattr(budgets, name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if name in _BUDGET_NAMES:
            delattr(budgets, name)
        super().__delattr__(name)


sys.modules[__name__].__class__ = _Face
