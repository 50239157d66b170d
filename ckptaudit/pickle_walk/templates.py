"""Pickles of one shape: one walk, and the walks of the others as copies with their own numbers in place.

A run's checkpoints of one model come from one ``torch.save`` call site: their data.pkl files hold the same
opcodes, byte for byte, except for the numbers stored as literal operands (the step, the loss, a learning rate).
Two pickles *match* when they have the same length and differ only inside the operands of ``BININT``,
``BININT1``, ``BININT2`` and ``BINFLOAT`` (fixed-width operands, so both decode to the same opcodes at the same
offsets: operand layout from ``Lib/pickletools.py``).  :func:`.number_operands.free_bytes` marks those operands.

What a match does not tell is where a differing number goes: into a tensor's size, a dict key, a call's argument
— or only into a container, as a value.  :class:`WalkTemplates` learns it once per shape by walking the first
pickle twice, once as :func:`.walk` does and once with each literal number tagged with its offset
(:func:`literal_places`), and keeps a number *loose* only when its tagged value is found exactly once in the
result, as a value of a plain ``dict`` or an item of a plain ``list`` or ``tuple``, on a path from the root whose
every container is reached once (no memo ``GET`` shares it) and where the plain walk holds that same number.  A
later pickle that matches and differs only in loose numbers gets the template's result with copies of the
containers on those paths, its own numbers in them; any other pickle is walked.  A walk of that pickle gives the
same result: the same opcodes run the same handlers on the same objects, and a loose number is only stored,
never read by a handler.  A number is bound as soon as its tagged value reaches anything but a plain container's
value: a call, an object, a set, a persistent id, a ``BUILD`` state, a dict key, or a memo ``GET`` (which shares
it with such a place); a tagged number the walk converts or drops is not found, and a shared container fails the
count.  Tagging changes the walk's own ``type(x) is int`` tests, so a number is kept loose only where the plain
walk holds the same number on the same path of plain containers.  A template is made only from a walk without
error, trick or nested pickle, of a pickle that binds no memo slot twice (a rebinding is a trick whose text
depends on the values).
"""

from __future__ import annotations

import dataclasses
import io
import struct
import threading
from typing import Any, Dict, List, Optional, Tuple

from .model import GlobalRef, WalkResult
from .number_operands import FREE, FREE_AT, changed_numbers, free_bytes

_NO_PLAIN = object()  # literal_places without the plain walk's tree


class _TagInt(int):
    pos: int


class _TagFloat(float):
    pos: int


def _tagged(value: Any, pos: int) -> Any:
    out = (_TagInt if type(value) is int else _TagFloat)(value)
    out.pos = pos
    return out


def literal_places(pkl: bytes, max_ops: int, plain: Any = _NO_PLAIN) -> Dict[int, tuple]:
    """{opcode offset: path}: the literal numbers of :data:`.number_operands.FREE` in ``pkl`` that are loose (see
    the module's docstring), each with its path (dict keys and sequence indexes from the root), from a walk of
    ``pkl`` with each such number tagged with its opcode's offset; numbers not in the map are bound.  A tagged
    number that reaches a call, an object, a frozenset or a set (which the walk may compute with: a
    ``builtins.set`` of literals drops equal ones), a persistent id (a storage's key and size), a ``BUILD`` state,
    a dict key, an item set into anything but a plain dict, or a memo ``GET`` (which shares it with a place the
    walk may convert, as a key is by ``safe_key``) is bound wherever it ends up; a key is set untagged, as the
    plain walk sets it, and a pickle whose key keeps a tag (deeper than 32) has no loose number.  With ``plain``
    (the plain walk's object), a number is loose only where every container on its path has the same type and
    keys (or length) in both walks and the plain walk holds the same number at its end: wherever the walker
    turns a tagged number into something else (a storage key's text, a stand-in key) the two trees part, and
    the path would name another entry."""
    from .machine import WalkState
    from .streams import walk

    bound: set = set()
    spoiled: List[int] = []  # a key still tagged after untagging: the walks may differ, no number is loose

    class Tagging(WalkState):
        def op_literal(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
            if op.name in FREE:
                stack.append(_tagged(arg, pos))
            else:
                super().op_literal(stack, arg, pos, op)

        def reduce(self, func: Any, args: Any, pos: int) -> Any:
            bound.update(_tags_in(args))
            args = args if type(args) is tuple else tuple(args) if type(args) is list else (args,)  # as the call
            if len(args) == 1 and type(args[0]) in (list, tuple) and \
                    type(func) is GlobalRef and self.full_name(func) in ("builtins.set", "builtins.frozenset"):
                args = ([_untagged(x) for x in args[0]],)  # its items become keys (safe_key), as in the plain walk
                spoiled.extend(_tags_in(args))
            return super().reduce(func, args, pos)

        def newobj(self, cls: Any, args: Any, kwargs: Any, pos: int, opname: str) -> Any:
            bound.update(_tags_in((args, kwargs)))
            return super().newobj(cls, args, kwargs, pos, opname)

        def op_frozenset(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # ``stack``: its items
            self.untag_items(stack)
            super().op_frozenset(stack, arg, pos, op)

        def op_additems(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
            self.untag_items(stack)
            super().op_additems(stack, arg, pos, op)

        def untag_items(self, items: List[Any]) -> None:
            """Set members become keys (``safe_key``): plain, as in the plain walk, and bound."""
            bound.update(_tags_in(items))
            items[:] = [_untagged(x) for x in items]
            spoiled.extend(_tags_in(items))

        def persistent_load(self, pid: Any, pos: int) -> Any:  # a storage's key, numel: torch reads them
            tags = _tags_in(pid)
            if tags:  # the storage the plain walk makes (a tagged key would become another text)
                bound.update(tags)
                pid = _untagged(pid)
                spoiled.extend(_tags_in(pid))
            return super().persistent_load(pid, pos)

        def build(self, inst: Any, st: Any, pos: int) -> None:  # BUILD: torch calls __setstate__ or set_()
            bound.update(_tags_in((inst, st)))
            super().build(inst, st, pos)

        def op_get(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # a memo GET shares it
            super().op_get(stack, arg, pos, op)
            bound.update(_tags_in(stack[-1]))

        def setitems(self, target: Any, items: Any, pos: int, opname: str) -> None:  # keys are hashed, merged
            keys = list(items[0::2])
            tags = _tags_in(keys)
            if tags:  # the key the plain walk makes: a tag would reach safe_key's text (its class name)
                bound.update(tags)
                keys = [_untagged(k) for k in keys]
                spoiled.extend(_tags_in(keys))
                items = [x for kv in zip(keys, items[1::2]) for x in kv]
            if type(target) is not dict:
                bound.update(_tags_in(list(items[1::2])))
            super().setitems(target, items, pos, opname)

    res = WalkResult(obj=None, end=0)
    state = Tagging(res, pkl, "torch", 0, max_ops, None, walker=walk)
    state.tensor_paths = False
    state.run(io.BytesIO(pkl), 0)
    if res.error is not None or res.tricks or spoiled:
        return {}
    places = {pos: path for pos, path in _loose(res.obj).items() if pos not in bound}
    if places and plain is not _NO_PLAIN:
        same = _SamePaths(res.obj, plain)
        places = {pos: path for pos, path in places.items() if same(path, _number_at(pkl, pos))}
    return places


def _untagged(k: Any, depth: int = 0) -> Any:
    """Key ``k`` with its tagged numbers (in tuples and frozensets, up to 32 deep) plain again."""
    t = type(k)
    if t is _TagInt:
        return int(k)
    if t is _TagFloat:
        return float(k)
    if (t is tuple or t is frozenset) and depth < 32:
        return t(_untagged(x, depth + 1) for x in k)
    return k


def _tags_in(x: Any) -> List[int]:
    """The offsets of the tagged numbers anywhere under ``x``."""
    out, seen, todo = [], set(), [x]
    while todo:
        o = todo.pop()
        t = type(o)
        if t is _TagInt or t is _TagFloat:
            out.append(o.pos)
        elif t not in (str, bytes, bool, int, float, type(None)) and id(o) not in seen:
            seen.add(id(o))
            todo.extend(held_values(o))
    return out


def _loose(root: Any) -> Dict[int, tuple]:
    """{offset: path} of the tagged numbers found once, loose, under ``root`` (a tagged walk's object)."""
    refs: Dict[int, int] = {}
    found: Dict[int, List[Optional[tuple]]] = {}
    todo: List[Tuple[Any, Optional[tuple]]] = [(root, ())]
    while todo:
        o, path = todo.pop()  # path None: under a bound place
        t = type(o)
        if t is _TagInt or t is _TagFloat:
            found.setdefault(o.pos, []).append(path)
            continue
        if t in (str, bytes, bool, int, float, type(None)):
            continue
        refs[id(o)] = refs.get(id(o), 0) + 1
        if refs[id(o)] > 1:
            continue
        if t is dict:
            for k, v in o.items():
                todo.append((k, None))
                todo.append((v, None if path is None else path + (k,)))
        elif t is list or t is tuple:
            todo.extend((v, None if path is None else path + (i,)) for i, v in enumerate(o))
        else:
            todo.extend((c, None) for c in held_values(o))
    out = {}
    for pos, paths in found.items():  # the root itself (a pickle of one number) has no container to patch
        if len(paths) == 1 and paths[0] and _unshared(root, paths[0], refs):
            out[pos] = paths[0]
    return out


def held_values(o: Any) -> List[Any]:
    """The values an object of the walk holds (any type but the plain containers and scalars)."""
    out: List[Any] = []
    if isinstance(o, dict):
        for k, v in o.items():
            out += (k, v)
        out.append(getattr(o, "attrs", None))
    elif isinstance(o, (list, tuple, set, frozenset)):
        out.extend(o)
    elif dataclasses.is_dataclass(o):
        out.extend(getattr(o, f.name) for f in dataclasses.fields(o))
    elif hasattr(o, "__dict__"):
        out.extend(vars(o).values())
    return out


def _unshared(root: Any, path: tuple, refs: Dict[int, int]) -> bool:
    node = root
    for step in path:
        if refs.get(id(node)) != 1:
            return False
        node = node[step]
    return True


@dataclasses.dataclass
class _Template:
    raw: Any  # numpy uint8: the pickle's bytes
    owner: Any  # free_bytes()
    loose: Dict[int, tuple]  # opcode offset → path in ``res.obj``
    res: WalkResult
    max_ops: int  # the budget it was walked with: a nested pickle's walk gets one as large (hidden.maybe_nested)


class TemplateShelf:
    """The templates one job holds, the most recently made first (thread-safe: a job's passes share it).
    ``hits``: walks saved; ``walks``: walks run."""

    #: templates held at once
    HELD = 4
    #: a pickle larger than this is walked every time (its walk is small beside the file it comes from)
    MAX_PICKLE_BYTES = 256 << 10

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: List[Any] = []
        self.hits = 0
        self.walks = 0

    def held(self) -> List[Any]:
        with self._lock:
            return list(self._held)

    def hit(self) -> None:
        with self._lock:
            self.hits += 1

    def walked(self, template: Any) -> None:
        """Count a walk run, and hold ``template`` (None: nothing to hold) first."""
        with self._lock:
            self.walks += 1
            if template is not None:
                self._held.insert(0, template)
                del self._held[self.HELD:]


class WalkTemplates(TemplateShelf):
    """The pickle shapes one job has walked, each as a walk's result and where its loose numbers are."""

    def walk(self, pkl: bytes, max_ops: int) -> WalkResult:
        """:func:`.walk` of ``pkl`` (``max_ops``, every tensor's path), or the same result made from a template."""
        import numpy as np

        from .streams import walk

        small = len(pkl) <= self.MAX_PICKLE_BYTES
        u = np.frombuffer(pkl, np.uint8) if small else None
        for t in self.held() if small else []:
            got = _from_template(t, pkl, u, max_ops)
            if got is not None:
                self.hit()
                return got
        res = walk(pkl, max_ops=max_ops)
        self.walked(_template(pkl, u, res, max_ops) if small else None)
        return res


def _template(pkl: bytes, u: Any, res: WalkResult, max_ops: int) -> Optional[_Template]:
    """A template of ``res`` (a plain walk of ``pkl``), or None when it may not be one."""
    if res.error is not None or res.budget_exhausted or res.tricks or res.nested or not res.imports_complete:
        return None
    owner = free_bytes(pkl)
    if owner is None:
        return None
    loose = literal_places(pkl, max_ops, res.obj)
    return _Template(u.copy(), owner, loose, _copy(res, res.obj), max_ops)


def loose_operand_bytes(pkl: bytes, max_ops: int) -> Optional[Tuple[WalkResult, Any]]:
    """``(walk, free)`` of ``pkl``: its plain :func:`.walk` (``max_ops``) and a numpy bool array over ``pkl``,
    True at each byte of a loose number's operand (the module's docstring: a number only stored in a plain
    container, never passed to a call); None when no template may be made of ``pkl`` (:class:`WalkTemplates`'
    rule: an error, a trick, a nested pickle, a memo slot bound twice, or more than
    :attr:`TemplateShelf.MAX_PICKLE_BYTES`)."""
    import numpy as np

    from .streams import walk

    if len(pkl) > TemplateShelf.MAX_PICKLE_BYTES:
        return None
    res = walk(pkl, max_ops=max_ops)
    t = _template(pkl, np.frombuffer(pkl, np.uint8), res, max_ops)
    if t is None:
        return None
    return res, np.isin(t.owner, np.fromiter(t.loose, np.int32, len(t.loose)))


def _number_at(pkl: bytes, pos: int) -> Any:
    """The literal number of the opcode at ``pos``."""
    fmt, _n = FREE_AT[pkl[pos]]
    return struct.unpack_from(fmt, pkl, pos + 1)[0]


class _SamePaths:
    """Whether a path names the same entry in the tagged walk's tree (``tagged``) and the plain walk's (``plain``),
    through plain containers of the same type with the same keys or length, and ends at ``want`` in the plain
    tree.  Each pair of containers is compared once."""

    def __init__(self, tagged: Any, plain: Any) -> None:
        self.roots, self.checked = (tagged, plain), set()

    def __call__(self, path: tuple, want: Any) -> bool:
        t, p = self.roots
        try:
            for step in path:
                kind = type(p)
                if kind not in (dict, list, tuple) or type(t) is not kind:
                    return False
                if (id(t), id(p)) not in self.checked:
                    if len(t) != len(p) or (kind is dict and list(t) != list(p)):
                        return False
                    self.checked.add((id(t), id(p)))
                t, p = t[step], p[step]
        except (KeyError, IndexError, TypeError):
            return False
        return type(p) is type(want) and (p == want or (p != p and want != want))


def _from_template(t: _Template, pkl: bytes, u: Any, max_ops: int) -> Optional[WalkResult]:
    """``t``'s result with ``pkl``'s own loose numbers in place, or None when ``pkl`` does not match ``t``."""
    changed = changed_numbers(t.raw, t.owner, u) if t.max_ops == max_ops else None
    if changed is None:
        return None
    if not changed:
        return _copy(t.res, t.res.obj)
    patch: Dict[Any, Any] = {}
    for pos in changed:
        path = t.loose.get(pos)
        if path is None:
            return None
        node = patch
        for step in path[:-1]:
            node = node.setdefault(step, {})
        node[path[-1]] = _Leaf(_number_at(pkl, pos))
    return _copy(t.res, _patched(t.res.obj, patch))


class _Leaf:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _patched(node: Any, patch: Dict[Any, Any]) -> Any:
    """A copy of ``node`` (a plain dict, list or tuple) with ``patch`` applied: nested patches to the containers
    under it, :class:`_Leaf` values in place."""
    items = dict(node) if type(node) is dict else list(node)
    for k, sub in patch.items():
        items[k] = sub.value if type(sub) is _Leaf else _patched(node[k], sub)
    return tuple(items) if type(node) is tuple else items


def _copy(res: WalkResult, obj: Any) -> WalkResult:
    """A result the caller may change (its lists and dict are its own; the objects in them are shared)."""
    return dataclasses.replace(res, obj=obj, globals=list(res.globals), storages=dict(res.storages),
                               tensors=list(res.tensors), tricks=[], nested=[])
