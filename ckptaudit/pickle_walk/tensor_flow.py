"""Whether a pickle's storages and tensors go only where a load does not read their bytes.

``torch.load(weights_only=True, mmap=True)`` maps a storage's record and never reads it while it rebuilds a dense
tensor (torch/serialization.py ``_load``; torch/_utils.py ``_rebuild_tensor_v2``: ``set_`` on the storage, with
offset, sizes and strides from the pickle).  A storage or tensor handed to anything else may be read: ``torch.Size``
of an int tensor reads its values, a ``BUILD`` on a tensor calls ``set_`` with its state, a class's
``__setitem__`` runs with it.  :func:`only_rebuilt` walks the pickle once (statically, as :func:`.walk` does) and
answers True only when every storage goes to a tensor rebuild as its first argument and every tensor only into
plain containers or a parameter's rebuild; :mod:`ckptaudit.stages.load.equivalent` lets two files' tensor bytes
differ only then.
"""

from __future__ import annotations

import io
from typing import Any, List

from .model import AttrDict, GlobalRef, StorageRef, TensorMeta, WalkResult
from .names import R_PARAM, R_PARAM_STATE, R_TENSOR, R_TENSOR_V2, normalize_global

_STORAGE_FIRST = (R_TENSOR_V2, R_TENSOR)
_TENSOR_FIRST = (R_PARAM, R_PARAM_STATE)
_PARAMETERS = ("torch.nn.parameter.Parameter", "torch.nn.Parameter")


def only_rebuilt(pkl: bytes, max_ops: int) -> bool:
    """True when the walk of ``pkl`` ends cleanly and no storage or tensor of it reaches a call, an object or a
    ``BUILD`` except as the first argument of its own rebuild (``_rebuild_tensor_v2``/``_rebuild_tensor`` take the
    storage, ``_rebuild_parameter``/``_rebuild_parameter_with_state`` and ``Parameter`` the tensor), nor is set into
    anything but a plain dict or list."""
    from .machine import WalkState
    from .streams import walk

    seen: List[str] = []

    def read(what: Any, where: str) -> None:
        if _holds_tensor(what):
            seen.append(where)

    class Flow(WalkState):
        def reduce(self, func: Any, args: Any, pos: int) -> Any:
            args = tuple(args) if type(args) in (tuple, list) else (args,)
            full = _name(func)
            if full in _STORAGE_FIRST and args and type(args[0]) is StorageRef:
                read(args[1:], full)
            elif full in _TENSOR_FIRST and args and type(args[0]) is TensorMeta:
                read(args[1:], full)
            else:
                read(args, full or "a computed call")
            return super().reduce(func, args, pos)

        def newobj(self, cls: Any, args: Any, kwargs: Any, pos: int, opname: str) -> Any:
            args = tuple(args) if type(args) in (tuple, list) else (args,)
            if _name(cls) in _PARAMETERS and args and type(args[0]) is TensorMeta:
                read((args[1:], kwargs), opname)
            else:
                read((args, kwargs), opname)
            return super().newobj(cls, args, kwargs, pos, opname)

        def build(self, inst: Any, st: Any, pos: int) -> None:  # a tensor's state goes to set_(), any to setstate
            read(st if type(inst) not in (StorageRef, TensorMeta) else inst, "BUILD")
            super().build(inst, st, pos)

        def setitems(self, target: Any, items: Any, pos: int, opname: str) -> None:
            if type(target) not in (dict, AttrDict):
                read(list(items), opname)
            super().setitems(target, items, pos, opname)

        def appends(self, target: Any, items: Any, pos: int, opname: str) -> None:
            if type(target) is not list:
                read(list(items), opname)
            super().appends(target, items, pos, opname)

    res = WalkResult(obj=None, end=0)
    state = Flow(res, pkl, "torch", 0, max_ops, None, walker=walk)
    state.tensor_paths = False
    state.run(io.BytesIO(pkl), 0)
    return res.error is None and not res.tricks and not res.budget_exhausted and not seen


def _name(func: Any) -> str:
    if type(func) is not GlobalRef:
        return ""
    return "%s.%s" % normalize_global(func.module, func.name)


def _holds_tensor(x: Any) -> bool:
    """Whether a storage or a tensor is anywhere under ``x`` (plain containers, objects' fields)."""
    from .templates import held_values

    seen, todo = set(), [x]
    while todo:
        o = todo.pop()
        t = type(o)
        if t is StorageRef or t is TensorMeta:
            return True
        if t in (str, bytes, bool, int, float, type(None), GlobalRef) or id(o) in seen:
            continue
        seen.add(id(o))
        todo.extend(held_values(o))
    return False
