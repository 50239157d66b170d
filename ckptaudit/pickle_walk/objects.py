"""Object builders: what persistent ids, calls, instances and container opcodes make, symbolically.

:class:`ObjectOps` is a mixin of the walk's ``WalkState``; torch's rebuild calls become :class:`TensorMeta`.
"""

from __future__ import annotations

from typing import Any, Optional

from .dtypes import DTYPE_ALIASES, dtype_of_storage_type
from .model import AttrDict, Call, GlobalRef, Instance, PersistentRef, StorageRef, TensorMeta
from .names import (KNOWN_CLASSES, PARAMETER_CLASSES, R_FROM_TYPE, R_PARAM, R_PARAM_STATE, R_QTENSOR,
                    R_TENSOR, R_TENSOR_V2, R_TENSOR_V3, TENSOR_REBUILDS, normalize_global)
from .reader import MISSING, int_tuple, safe_key, short_repr
from .salvage import literal_call


def _as_args(args: Any) -> tuple:
    """A call's arguments as the tuple the call would get (a list becomes a tuple, one value a 1-tuple)."""
    t = type(args)
    return args if t is tuple else tuple(args) if t is list else (args,)


def _as_parameter(args: tuple) -> Optional[TensorMeta]:
    """``_rebuild_parameter(data, requires_grad, …)``: the tensor ``data``, marked a parameter."""
    if not args or type(args[0]) is not TensorMeta:
        return None
    t = args[0]
    t.requires_grad = args[1] if len(args) > 1 and type(args[1]) is bool else True
    t.is_parameter = True
    return t


class ObjectOps:
    """``WalkState`` methods that build the symbolic objects (``persistent_load``, ``reduce``, ``build`` ...)."""

    __slots__ = ()

    # -- persistent ids
    def persistent_load(self, pid: Any, pos: int) -> Any:
        if self.persistent != "torch":
            return PersistentRef(pid)
        if type(pid) is not tuple or len(pid) < 5:
            return PersistentRef(pid)
        tag = pid[0].decode("ascii", "replace") if type(pid[0]) is bytes else pid[0]
        if tag != "storage":
            return PersistentRef(pid)
        stype, key, location, numel = pid[1], pid[2], pid[3], pid[4]
        key_s = key.decode("ascii", "replace") if type(key) is bytes else str(key) \
            if type(key) in (str, int) else short_repr(key)
        if type(location) is bytes:
            location = location.decode("ascii", "replace")
        elif type(location) is not str:
            location = short_repr(location)
        existing = self.res.storages.get(key_s)
        if existing is not None:
            return existing
        if type(stype) is GlobalRef:
            try:
                dtype, itemsize = dtype_of_storage_type(stype.name)
            except KeyError:
                dtype, itemsize = f"unknown({stype})", 0
        else:
            dtype, itemsize = f"unknown({short_repr(stype)})", 0
        s = StorageRef(key_s, dtype, location, numel if type(numel) is int else None, itemsize)
        self.res.storages[key_s] = s
        return s

    # -- calls
    def reduce(self, func: Any, args: Any, pos: int) -> Any:
        args = _as_args(args)
        if type(func) is not GlobalRef:
            self.trick(f"REDUCE at byte {pos} calls a computed value ({short_repr(func)}), "
                       "not a named import")
            return Call(func, args)
        full = self.full_name(func)
        name = func.name
        if full in TENSOR_REBUILDS:
            t = self.rebuild(full, args)
            if t is not None:
                return t
            return Call(func, args)
        if full == "collections.OrderedDict":
            return self._ordered_dict(args, pos)
        if full == "torch.Size" and len(args) == 1 and int_tuple(args[0]) is not None:
            return tuple(args[0])
        lit = literal_call(full, args)
        if lit is not MISSING:
            if type(lit) is bytes and lit[:1] == b"\x80":
                self.maybe_nested(lit, pos, "_codecs.encode")
            return lit
        if full in KNOWN_CLASSES or name.rsplit(".", 1)[-1][:1].isupper():
            return Instance(func, args)
        return Call(func, args)

    def full_name(self, func: GlobalRef) -> str:
        """``module.name`` of an import, normalised (Python 2 names), kept per object for the walk."""
        hit = self.names.get(id(func))
        if hit is not None and hit[0] is func:
            return hit[1]
        full = "%s.%s" % normalize_global(func.module, func.name)
        self.names[id(func)] = (func, full)
        return full

    def _ordered_dict(self, args: tuple, pos: int) -> AttrDict:
        """``collections.OrderedDict(pairs)``: the pairs that are ``(key, value)``."""
        d = AttrDict()
        if args and type(args[0]) in (list, tuple):
            for kv in args[0]:
                if type(kv) in (list, tuple) and len(kv) == 2:
                    self.setitems(d, kv, pos, "OrderedDict")
        return d

    def newobj(self, cls: Any, args: Any, kwargs: Any, pos: int, opname: str) -> Any:
        args = _as_args(args)
        if kwargs:
            args = args + (kwargs,)
        if type(cls) is not GlobalRef:
            self.trick(f"{opname} at byte {pos} instantiates a computed class ({short_repr(cls)})")
            return Instance(cls, args)
        mod, name = normalize_global(cls.module, cls.name)
        full = f"{mod}.{name}"
        if full in PARAMETER_CLASSES and args and type(args[0]) is TensorMeta:
            t = args[0]
            t.requires_grad = args[1] if len(args) > 1 and type(args[1]) is bool else True
            t.is_parameter = True
            return t
        if full == "collections.OrderedDict" and not args:
            return AttrDict()
        return Instance(cls, args)

    def rebuild(self, full: str, args: tuple) -> Optional[TensorMeta]:
        """TensorMeta for a recognised torch rebuild call with well-formed args, else None."""
        if full in (R_TENSOR_V2, R_TENSOR, R_TENSOR_V3, R_QTENSOR):
            return self._rebuild_tensor(full, args)
        if full in (R_PARAM, R_PARAM_STATE):
            return _as_parameter(args)
        if full == R_FROM_TYPE:
            return self._rebuild_from_type(args)
        return None

    def _rebuild_tensor(self, full: str, args: tuple) -> Optional[TensorMeta]:
        """``_rebuild_tensor[_v2|_v3]`` / ``_rebuild_qtensor``: ``(storage, offset, size, stride, …)``, with
        ``requires_grad`` and (v3) the dtype at the positions torch/_utils.py gives them."""
        if len(args) < 4:
            return None
        storage, offset, size, stride = args[0], args[1], int_tuple(args[2]), int_tuple(args[3])
        if type(storage) is not StorageRef or type(offset) is not int or size is None or stride is None:
            return None
        dtype = storage.dtype
        rg = False
        if full == R_TENSOR_V2 and len(args) >= 5:
            rg = args[4] is True
        elif full == R_TENSOR_V3 and len(args) >= 7:
            rg = args[4] is True
            dt = args[6]
            if type(dt) is GlobalRef and dt.module == "torch":
                dtype = DTYPE_ALIASES.get(dt.name, dt.name)
        elif full == R_QTENSOR and len(args) >= 6:
            rg = args[5] is True
        shapes = self.shapes  # one tuple per distinct shape or stride: most of a checkpoint's repeat
        t = TensorMeta(storage, offset, shapes.setdefault(size, size), shapes.setdefault(stride, stride), dtype, rg,
                       False)
        self.tensors_built.append(t)
        return t

    def _rebuild_from_type(self, args: tuple) -> Optional[TensorMeta]:
        """``_rebuild_from_type_v2(func, new_type, args, state)``: the inner rebuild's tensor, a parameter when
        ``new_type`` is a parameter class."""
        if len(args) < 3 or type(args[0]) is not GlobalRef:
            return None
        inner = "%s.%s" % normalize_global(args[0].module, args[0].name)
        if inner not in TENSOR_REBUILDS or inner == R_FROM_TYPE:
            return None
        inner_args = args[2] if type(args[2]) is tuple else tuple(args[2]) if type(args[2]) is list else None
        if inner_args is None:
            return None
        t = self.rebuild(inner, inner_args)
        if t is None:
            return None
        nt = args[1]
        if type(nt) is GlobalRef and "%s.%s" % normalize_global(nt.module, nt.name) in PARAMETER_CLASSES:
            t.is_parameter = True
        return t

    # -- container mutation
    def setitems(self, target: Any, items: Any, pos: int, opname: str) -> None:
        t = type(target)
        if t is dict or t is AttrDict:
            for i in range(0, len(items) - 1, 2):
                k = items[i]
                tk = type(k)
                if not (tk is str or tk is int):
                    k = safe_key(k)
                target[k] = items[i + 1]
            return
        if t is Instance or t is Call:
            if type(target.items) is not dict:
                target.items = {}
            self.setitems(target.items, items, pos, opname)
            return
        if t is GlobalRef:
            self.trick(f"{opname} at byte {pos} writes items into the imported object {target} "
                       "(e.g. patching a module-level dict)")

    def appends(self, target: Any, items: Any, pos: int, opname: str) -> None:
        t = type(target)
        if t is list:
            target.extend(items)
            return
        if t is Instance or t is Call:
            if type(target.items) is not list:
                target.items = []
            target.items.extend(items)
            return
        if t is GlobalRef:
            self.trick(f"{opname} at byte {pos} appends into the imported object {target}")

    def build(self, inst: Any, st: Any, pos: int) -> None:
        t = type(inst)
        if t is AttrDict:
            if type(st) is tuple and len(st) == 2:
                for part in st:
                    if isinstance(part, dict):
                        inst.attrs.update(part)
            elif isinstance(st, dict):
                inst.attrs.update(st)
            return
        if t is Instance or t is Call:
            inst.state = st
            return
        if t is GlobalRef:
            self.trick(f"BUILD at byte {pos} sets attributes on the imported object {inst} "
                       "(overwriting a module or class attribute)")
