"""Reading the stream: walk errors, the memoryview reader, raw GLOBAL operands and bounded value helpers."""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple

from . import budgets
from .model import Call, GlobalRef, Instance, PersistentRef, StorageRef, TensorMeta

#: What a literal call that cannot be evaluated returns (None is a value).
MISSING = object()

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(s: str) -> str:
    """``s`` with every lone surrogate replaced by U+FFFD (pickle strings are decoded with
    ``surrogatepass``, and such a name cannot be written as UTF-8 to the tables or the report)."""
    return _LONE_SURROGATE.sub("\ufffd", s)


class WalkError(Exception):
    """The stream cannot be walked on here (damage or a construct the walk refuses); its message says why."""


class BudgetError(WalkError):
    """The walk's work budget ran out (not damage: the stream may be fine, only too large to describe)."""


def short_repr(obj: Any, limit: int = 60) -> str:
    """A bounded description of a symbolic value (never recurses deeply)."""
    t = type(obj)
    if t in (str, bytes, bytearray, int, float, bool) or obj is None:
        r = repr(obj)
    elif t is GlobalRef:
        r = str(obj)
    elif t is Call:
        r = f"{short_repr(obj.func, 40)}(...)"
    elif t is Instance:
        r = f"<{short_repr(obj.cls, 40)} instance>"
    elif t is TensorMeta:
        r = f"<tensor {obj.dtype}{list(obj.shape)}>"
    elif t is StorageRef:
        r = f"<storage {obj.key}>"
    elif t is PersistentRef:
        r = f"<persistent id {short_repr(obj.pid, 40)}>"
    elif isinstance(obj, (tuple, list)):
        r = f"<{t.__name__} of {len(obj)}>"
    elif isinstance(obj, dict):
        r = f"<dict of {len(obj)}>"
    else:
        r = f"<{t.__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


#: Key types hashed by value without recursion (``Instance`` is hashed by identity: eq=False).
_FLAT_KEY_TYPES = frozenset({str, int, float, bool, bytes, type(None), GlobalRef, complex})


def safe_key(k: Any) -> Any:
    """``k`` if it is safely hashable, else a repr-string stand-in.

    Tuples/frozensets are checked to be shallow and small first, so hashing
    cannot recurse through a hostile million-level nesting.
    """
    t = type(k)
    if t in _FLAT_KEY_TYPES or t is Instance:  # an Instance: a dataclass key such as DCP's MetadataIndex
        return k
    if (t is tuple or t is frozenset) and _shallow_key(k):
        return k
    return "<key " + short_repr(k) + ">"


def _shallow_key(k: Any) -> bool:
    """A tuple or frozenset key nested at most 32 deep, of at most ``budgets._MAX_KEY_NODES`` parts, all of
    :data:`_FLAT_KEY_TYPES` or themselves tuples or frozensets."""
    todo = [(k, 0)]
    max_nodes = budgets._MAX_KEY_NODES
    seen = 0
    while todo:
        x, d = todo.pop()
        seen += 1
        if d > 32 or seen > max_nodes:
            return False
        tx = type(x)
        if tx is tuple or tx is frozenset:
            todo.extend((y, d + 1) for y in x)
        elif tx not in _FLAT_KEY_TYPES:
            return False
    return True


def int_tuple(x: Any) -> Optional[Tuple[int, ...]]:
    """``x`` as a tuple when it is a tuple or list of ints (a shape or stride), else None."""
    if type(x) not in (tuple, list):
        return None
    for v in x:
        if type(v) is not int:
            return None
    return tuple(x)


class MVReader:
    """Minimal file-like reader over a memoryview (no copy of the whole buffer)."""

    __slots__ = ("mv", "p", "n")

    def __init__(self, mv: memoryview, start: int) -> None:
        self.mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
        self.p = start
        self.n = len(self.mv)

    def read(self, k: int = -1) -> bytes:
        p = self.p
        e = self.n if k is None or k < 0 else min(self.n, p + k)
        self.p = e
        return bytes(self.mv[p:e])

    def readline(self) -> bytes:
        p = self.p
        step = 256
        while True:
            e = min(self.n, p + step)
            chunk = bytes(self.mv[self.p:e])
            i = chunk.find(b"\n")
            if i >= 0:
                self.p += i + 1
                return chunk[: i + 1]
            if e >= self.n:
                self.p = self.n
                return chunk
            step *= 4

    def tell(self) -> int:
        return self.p

    def seek(self, p: int) -> int:
        self.p = p
        return p


def raw_line_pair(data: Any, pos: int) -> Tuple[str, str]:
    """Read the two newline-terminated operands of GLOBAL/INST at ``pos`` from the raw bytes.

    The stdlib unpickler decodes them as raw UTF-8 lines (``load_global``);
    ``pickletools`` undoes backslash escapes, which would misname a crafted
    import, so the names are taken from the bytes directly.
    """
    window = bytes(data[pos + 1: pos + 1 + 4096])
    a = window.find(b"\n")
    b = window.find(b"\n", a + 1)
    if a < 0 or b < 0:
        raise WalkError(f"GLOBAL operands at byte {pos} longer than 4096 bytes")
    mod = window[:a].decode("utf-8", "backslashreplace")
    name = window[a + 1: b].decode("utf-8", "backslashreplace")
    return mod, name
