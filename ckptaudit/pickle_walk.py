"""A static, symbolic pickle interpreter: describe a pickle without unpickling it.

The audit must never run what it audits, so this module never calls an
unpickler's ``load``, never subclasses the standard ``Unpickler`` and never
imports torch.  It drives a stack machine over :func:`pickletools.genops` (the
standard library's opcode decoder, see the ``pickletools`` documentation and
the opcode table in ``Lib/pickletools.py``) and interprets every opcode of
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
"""

from __future__ import annotations

import base64
import binascii
import bz2
import io
import itertools
import sys
import lzma
import math
import pickletools
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

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


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class GlobalRef:
    """A symbolic reference to ``module.name`` as named in the pickle (never imported)."""

    module: str
    name: str

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class GlobalImport:
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

    def __str__(self) -> str:
        return f"{self.module}.{self.name}"


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
    """What :func:`walk` found.  See the module docstring for the format facts."""

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

    def all_tricks(self) -> List[str]:
        out = list(self.tricks)
        for sub in self.nested:
            out.extend(sub.all_tricks())
        return out


# ---------------------------------------------------------------- dtype tables

# Legacy typed-storage class name -> (dtype name, bytes per element).
# Source: torch/storage.py ``_dtype_to_storage_type_map`` (the map torch uses
# to pickle TypedStorage) and torch/_utils.py ``_element_size``; UntypedStorage
# is serialised as bytes (torch/serialization.py ``persistent_load``: "if
# storage_type is torch.UntypedStorage: dtype = torch.uint8").  Float8/float4,
# uint16/32/64 and bits* have no storage class: torch saves them as
# UntypedStorage + ``_rebuild_tensor_v3(..., dtype)`` (``_new_dtypes``).
_STORAGE_DTYPES: Dict[str, Tuple[str, int]] = {
    "DoubleStorage": ("float64", 8),
    "FloatStorage": ("float32", 4),
    "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2),
    "CharStorage": ("int8", 1),
    "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
    "ComplexDoubleStorage": ("complex128", 16),
    "ComplexFloatStorage": ("complex64", 8),
    "QInt8Storage": ("qint8", 1),
    "QInt32Storage": ("qint32", 4),
    "QUInt8Storage": ("quint8", 1),
    "QUInt4x2Storage": ("quint4x2", 1),
    "QUInt2x4Storage": ("quint2x4", 1),
    "UntypedStorage": ("uint8", 1),
}

# torch dtype name (as in ``torch.<name>`` globals) -> bytes per element.
# Source: ``torch.<dtype>.itemsize`` for every dtype of torch 2.13 (sub-byte
# int1..int7/uint1..uint7 report 1).  Aliases (float, half, long, ...) map to
# the canonical name in _DTYPE_ALIASES.
_DTYPE_ITEMSIZE: Dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "qint8": 1, "qint32": 4, "quint8": 1, "quint4x2": 1, "quint2x4": 1,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    **{f"int{i}": 1 for i in range(1, 8)},
    **{f"uint{i}": 1 for i in range(1, 8)},
}
_DTYPE_ALIASES: Dict[str, str] = {
    "double": "float64", "float": "float32", "half": "float16", "long": "int64",
    "int": "int32", "short": "int16", "cdouble": "complex128", "cfloat": "complex64",
    "chalf": "complex32", "bit": "uint1",
}


def dtype_of_storage_type(name: str) -> Tuple[str, int]:
    """``"FloatStorage"`` → ``("float32", 4)``: dtype name and bytes per element.

    Accepts a bare class name or a dotted one (``"torch.cuda.HalfStorage"``,
    ``"torch.storage.UntypedStorage"``).  Raises ``KeyError`` for a name that
    is no torch storage class (the table and its sources are above).
    """
    short = name.rsplit(".", 1)[-1]
    try:
        return _STORAGE_DTYPES[short]
    except KeyError:
        raise KeyError(f"{name!r} is not a torch storage type; known: {sorted(_STORAGE_DTYPES)}") from None


def dtype_itemsize(dtype: str, default: int = 0) -> int:
    """Bytes per element of a torch dtype name (``"bfloat16"`` → 2), or ``default``."""
    return _DTYPE_ITEMSIZE.get(_DTYPE_ALIASES.get(dtype, dtype), default)


# Python 2 names that the stdlib unpickler rewrites for protocols < 3
# (``fix_imports``; Lib/_compat_pickle.py).  torch's weights-only unpickler
# applies the subset in torch/_utils.py (IMPORT_MAPPING / NAME_MAPPING).
try:  # the stdlib table, when present (CPython)
    import _compat_pickle as _cp

    _NAME_MAPPING: Dict[Tuple[str, str], Tuple[str, str]] = dict(_cp.NAME_MAPPING)
    _IMPORT_MAPPING: Dict[str, str] = dict(_cp.IMPORT_MAPPING)
except ImportError:  # pragma: no cover - other interpreters
    _NAME_MAPPING = {}
    _IMPORT_MAPPING = {"__builtin__": "builtins", "copy_reg": "copyreg"}


def normalize_global(module: str, name: str) -> Tuple[str, str]:
    """Map Python 2 spellings (``__builtin__``, ``copy_reg`` ...) to what would be imported."""
    key = (module, name)
    if key in _NAME_MAPPING:
        return _NAME_MAPPING[key]
    return _IMPORT_MAPPING.get(module, module), name


# ---------------------------------------------------------------- recognised globals

_R_TENSOR_V2 = "torch._utils._rebuild_tensor_v2"
_R_TENSOR = "torch._utils._rebuild_tensor"
_R_TENSOR_V3 = "torch._utils._rebuild_tensor_v3"
_R_QTENSOR = "torch._utils._rebuild_qtensor"
_R_PARAM = "torch._utils._rebuild_parameter"
_R_PARAM_STATE = "torch._utils._rebuild_parameter_with_state"
_R_FROM_TYPE = "torch._tensor._rebuild_from_type_v2"
_PARAMETER_CLASSES = {"torch.nn.parameter.Parameter", "torch.nn.Parameter"}
_TENSOR_REBUILDS = {_R_TENSOR_V2, _R_TENSOR, _R_TENSOR_V3, _R_QTENSOR, _R_PARAM, _R_PARAM_STATE, _R_FROM_TYPE}

# Lower-case globals that are classes anyway (so REDUCE of them is an Instance).
_KNOWN_CLASSES = {
    "numpy.dtype", "numpy.ndarray", "datetime.datetime", "datetime.date", "datetime.time",
    "datetime.timedelta", "datetime.timezone", "torch.device", "collections.defaultdict",
    "collections.deque", "collections.OrderedDict", "collections.Counter",
    *(f"builtins.{t}" for t in ("int", "float", "str", "bytes", "dict", "list", "tuple", "set",
                                "frozenset", "bytearray", "complex", "slice", "range", "object",
                                "type", "bool")),
}
_LITERAL_ENCODINGS = {"latin1", "latin-1", "iso-8859-1", "iso8859-1", "utf-8", "utf8", "ascii"}

_MISSING = object()

# opcode (pickletools.OpcodeInfo) -> handler group used by _State.run
_GROUP_CODES = [
    "qrp", "hjg", "KMJX\x8cG\x8aIL\x8bFV\x8d", "(", "\x86", "t", "\x89", "R", ")", "\x85", "Q", "u", "}", "]",
    "e", "N", "\x88", "s", "a", "\x87", "b", "\x94", "c", "\x93", "\x81", "\x92", "i", "o", "SUT",
    "BC\x8e", "\x96", "l", "d", "\x8f", "\x90", "\x91", "0", "1", "2", "\x82\x83\x84", "\x80", "\x95",
    "\x97", "\x98", "P", ".",
]
_GROUP = {pickletools.code2op[ch]: g for g, codes in enumerate(_GROUP_CODES) for ch in codes}
_MAX_NESTED_DEPTH = 4
_MIN_ENCODED_CHARS = 24  # shortest str/bytes operand tried as base64/hex/compressed pickle
_MAX_DECODED_BYTES = 16 << 20  # per decoded blob (decompression bombs stop here)
_MAX_DECODE_BUDGET = 64 << 20  # decoded bytes per top-level walk, all blobs together
_MAX_STREAMS = 64  # pickle streams walked back to back in one buffer
_B64 = re.compile(rb"[A-Za-z0-9+/\-_]+={0,2}")
_HEX = re.compile(rb"(?:[0-9a-fA-F]{2})+")
_MAX_TRICKS = 200
_MAX_KEY_NODES = 2000
# Work budget of one walk.  A torch.save state_dict costs about 30 opcodes and 7 retained objects per
# tensor (measured on a 40,000-tensor AdamW checkpoint: 1.19 M opcodes, 2.3 s), so these allow a single
# pickle of ~160,000 tensors while keeping a hostile stream (a list appended to itself, millions of
# memoised empty lists) under ~400 MiB and ~15 s.
MAX_OPS = 5_000_000
MAX_WALK_BLOCKS = 4_000_000  # interpreter memory blocks the walk may hold (sys.getallocatedblocks)
MAX_IMPORT_SCAN_OPS = 20_000_000  # opcodes scanned for imports only, after the walk's budget ran out
_BLOCK_CHECK_EVERY = 8192


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(s: str) -> str:
    """``s`` with every lone surrogate replaced by U+FFFD (pickle strings are decoded with
    ``surrogatepass``, and such a name cannot be written as UTF-8 to the tables or the report)."""
    return _LONE_SURROGATE.sub("\ufffd", s)


class _WalkError(Exception):
    pass


class _BudgetError(_WalkError):
    """The walk's work budget ran out (not damage: the stream may be fine, only too large to describe)."""


_CHECK_MASK = _BLOCK_CHECK_EVERY - 1


# ---------------------------------------------------------------- helpers


def _short_repr(obj: Any, limit: int = 60) -> str:
    """A bounded description of a symbolic value (never recurses deeply)."""
    t = type(obj)
    if t in (str, bytes, bytearray, int, float, bool) or obj is None:
        r = repr(obj)
    elif t is GlobalRef:
        r = str(obj)
    elif t is Call:
        r = f"{_short_repr(obj.func, 40)}(...)"
    elif t is Instance:
        r = f"<{_short_repr(obj.cls, 40)} instance>"
    elif t is TensorMeta:
        r = f"<tensor {obj.dtype}{list(obj.shape)}>"
    elif t is StorageRef:
        r = f"<storage {obj.key}>"
    elif t is PersistentRef:
        r = f"<persistent id {_short_repr(obj.pid, 40)}>"
    elif isinstance(obj, (tuple, list)):
        r = f"<{t.__name__} of {len(obj)}>"
    elif isinstance(obj, dict):
        r = f"<dict of {len(obj)}>"
    else:
        r = f"<{t.__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _safe_key(k: Any) -> Any:
    """``k`` if it is safely hashable, else a repr-string stand-in.

    Tuples/frozensets are checked to be shallow and small first, so hashing
    cannot recurse through a hostile million-level nesting.
    """
    t = type(k)
    if t is str or t is int or t is float or t is bool or t is bytes or k is None or t is GlobalRef:
        return k
    if t is Instance:  # hashed by identity (eq=False): a dataclass key such as DCP's MetadataIndex
        return k
    if t is tuple or t is frozenset:
        todo = [(k, 0)]
        seen = 0
        while todo:
            x, d = todo.pop()
            seen += 1
            if d > 32 or seen > _MAX_KEY_NODES:
                return "<key " + _short_repr(k) + ">"
            tx = type(x)
            if tx is tuple or tx is frozenset:
                todo.extend((y, d + 1) for y in x)
            elif not (tx is str or tx is int or tx is float or tx is bool or tx is bytes
                      or x is None or tx is GlobalRef or tx is complex):
                return "<key " + _short_repr(k) + ">"
        return k
    if t is complex:
        return k
    return "<key " + _short_repr(k) + ">"


def _int_tuple(x: Any) -> Optional[Tuple[int, ...]]:
    if type(x) not in (tuple, list):
        return None
    for v in x:
        if type(v) is not int:
            return None
    return tuple(x)


class _MVReader:
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


def _raw_line_pair(data: Any, pos: int) -> Tuple[str, str]:
    """Read the two newline-terminated operands of GLOBAL/INST at ``pos`` from the raw bytes.

    The stdlib unpickler decodes them as raw UTF-8 lines (``load_global``);
    ``pickletools`` undoes backslash escapes, which would misname a crafted
    import, so the names are taken from the bytes directly.
    """
    window = bytes(data[pos + 1: pos + 1 + 4096])
    a = window.find(b"\n")
    b = window.find(b"\n", a + 1)
    if a < 0 or b < 0:
        raise _WalkError(f"GLOBAL operands at byte {pos} longer than 4096 bytes")
    mod = window[:a].decode("utf-8", "backslashreplace")
    name = window[a + 1: b].decode("utf-8", "backslashreplace")
    return mod, name


# ---------------------------------------------------------------- the walker


def walk(data: bytes | bytearray | memoryview, start: int = 0, *, max_ops: int = MAX_OPS,
         persistent: str = "torch", _depth: int = 0, _budget: Optional[List[int]] = None) -> WalkResult:
    """Interpret the pickle that starts at byte ``start`` of ``data``, symbolically.

    Returns a :class:`WalkResult`; never raises on bad input (``error`` is set
    and everything built so far is kept: pending ``SETITEMS``/``APPENDS``
    frames of a cut-short pickle are folded into their containers, so a
    truncated checkpoint still names the tensors it got to).  ``end`` is the
    offset just after ``STOP`` (or where the walk stopped).  ``max_ops`` bounds
    the number of opcodes of this pickle, and :data:`MAX_WALK_BLOCKS` the
    objects it may hold (nested pickles found in bytes payloads share what is
    left; nesting stops 4 levels deep).  When either runs out the result has
    ``budget_exhausted`` and ``error`` set, and the rest of the stream is
    scanned for imports only (up to :data:`MAX_IMPORT_SCAN_OPS` opcodes, no
    objects built), so a payload hidden behind padding is still named;
    ``imports_end`` says how far that got.  ``persistent="torch"``
    decodes torch storage persistent ids into :class:`StorageRef`;
    ``"raw"`` keeps every persistent id as a :class:`PersistentRef`.

    The caller guarantees nothing about the bytes (random input is fine); a
    memoryview must be contiguous.  ``start`` outside ``data`` is an error
    result too.
    """
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    if not 0 <= start <= size:
        return WalkResult(obj=None, end=start, error=f"start offset {start} is outside the {size}-byte buffer")
    if isinstance(data, memoryview):
        if data.obj is not None and type(data.obj) is bytes and data.format == "B" and data.contiguous \
                and len(data) == len(data.obj):
            data = data.obj
            f: Any = io.BytesIO(data)
            f.seek(start)
        else:
            f = _MVReader(data, start)
            data = f.mv
    else:
        f = io.BytesIO(data)
        f.seek(start)
    res = WalkResult(obj=None, end=start)
    state = _State(res, data, persistent, _depth, max_ops, _budget)
    state.run(f, start)
    return res


def walk_streams(data: bytes | bytearray | memoryview, first: Optional[WalkResult] = None, *,
                 max_streams: int = _MAX_STREAMS, max_ops: int = MAX_OPS,
                 persistent: str = "torch") -> List[WalkResult]:
    """Walk every pickle stream stored back to back in ``data``, from byte 0 (``first``: the
    caller's walk of the first stream, not walked again).

    ``pickle.load`` in a loop (and torch's legacy ``_legacy_load``, which reads
    five pickles) runs each of them, so each is walked: after one stream's
    ``STOP`` the next byte starts another stream when it is a protocol header
    (``\\x80`` + 0..5) or a protocol-0/1 opcode that can open a pickle.  The
    walk stops at the first stream that fails, at ``max_streams``, and after the
    fifth stream of a legacy torch layout (second stream = 1001), whose
    storage bytes follow.  The streams share one ``max_ops`` budget.
    """
    size = data.nbytes if isinstance(data, memoryview) else len(data)
    out: List[WalkResult] = []
    pos = 0
    limit = max_streams
    if first is not None:
        out.append(first)
        if first.error or first.end <= 0:
            return out
        pos = first.end
    while pos < size and len(out) < limit:
        if out and not _stream_start(data, pos, size):
            break
        left = max_ops - sum(r.n_ops for r in out)
        if left <= 0:
            break
        r = walk(data, pos, max_ops=left, persistent=persistent)
        out.append(r)
        if r.error or r.end <= pos:
            break
        pos = r.end
        if len(out) == 2 and type(out[1].obj) is int and out[1].obj == 1001:
            limit = min(limit, 5)  # legacy torch.save: magic, 1001, sys info, object, keys, then raw bytes
    return out


_P0_STARTS = frozenset(b"(cIL}])NSVFdltiopgGJKMXUBCT\x8c\x8a")


def _stream_start(data: Any, pos: int, size: int) -> bool:
    b0 = data[pos]
    if b0 == 0x80:
        return pos + 1 < size and data[pos + 1] <= 5
    return b0 in _P0_STARTS


def _decode_layer(blob: bytes, budget: List[int]) -> Tuple[Optional[bytes], str]:
    """One decoding step of an operand that may hide a pickle: zlib/gzip, bz2, lzma, hex or
    base64.  Returns ``(decoded, how)`` or ``(None, "")``; output is capped at
    :data:`_MAX_DECODED_BYTES` and charged to ``budget[0]`` (bytes left for this walk)."""
    if budget[0] <= 0:
        return None, ""
    cap = min(_MAX_DECODED_BYTES, budget[0])
    out: Optional[bytes] = None
    how = ""
    try:
        if blob[:1] == b"\x78" and blob[1] in (0x01, 0x5E, 0x9C, 0xDA):
            out, how = zlib.decompressobj().decompress(blob, cap), "zlib"
        elif blob[:2] == b"\x1f\x8b":
            out, how = zlib.decompressobj(31).decompress(blob, cap), "gzip"
        elif blob[:3] == b"BZh":
            out, how = bz2.BZ2Decompressor().decompress(blob, cap), "bz2"
        elif blob[:6] == b"\xfd7zXZ\x00" or blob[:3] == b"\x5d\x00\x00":
            out, how = lzma.LZMADecompressor().decompress(blob, cap), "lzma"
        elif len(blob) >= _MIN_ENCODED_CHARS and len(blob) % 2 == 0 and _HEX.fullmatch(blob):
            out, how = binascii.unhexlify(blob), "hex"
        elif len(blob) >= _MIN_ENCODED_CHARS and len(blob) % 4 == 0 and _B64.fullmatch(blob):
            alt = b"-_" if (b"-" in blob or b"_" in blob) else None
            out, how = base64.b64decode(blob, altchars=alt, validate=True), "base64"
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError, binascii.Error):
        return None, ""
    if out is None:
        return None, ""
    budget[0] -= len(out)
    return out, how


class _State:
    __slots__ = ("res", "data", "persistent", "depth", "max_ops", "max_blocks", "n_tricks_dropped", "tensors_built", "names",
                 "budget")

    def __init__(self, res: WalkResult, data: Any, persistent: str, depth: int, max_ops: int,
                 budget: Optional[List[int]] = None) -> None:
        self.budget = budget if budget is not None else [_MAX_DECODE_BUDGET]
        self.res = res
        self.data = data
        self.persistent = persistent
        self.depth = depth
        self.max_ops = max_ops
        self.max_blocks = MAX_WALK_BLOCKS
        self.n_tricks_dropped = 0
        self.tensors_built: List[TensorMeta] = []
        self.names: Dict[int, Tuple[GlobalRef, str]] = {}  # id(GlobalRef) -> normalised "module.name"

    # -- bookkeeping
    def trick(self, text: str) -> None:
        if len(self.res.tricks) < _MAX_TRICKS:
            self.res.tricks.append(text)
        else:
            self.n_tricks_dropped += 1

    # -- main loop
    def run(self, f: Any, start: int) -> None:  # noqa: C901 - one opcode table, kept flat for speed
        res = self.res
        stack: List[Any] = []
        metastack: List[List[Any]] = []
        memo: Dict[int, Any] = {}
        push = stack.append
        group = _GROUP
        n = 0
        op = None
        pos = start
        stopped = False
        blocks0 = sys.getallocatedblocks()
        max_blocks = self.max_blocks
        try:
            ops = itertools.islice(pickletools.genops(f), self.max_ops)
            for n, (op, arg, pos) in enumerate(ops, 1):
                if not n & _CHECK_MASK and sys.getallocatedblocks() - blocks0 > max_blocks:
                    raise _BudgetError(f"gave up after {n} opcodes at byte {pos}: the object tree holds more "
                                       f"than {max_blocks} interpreter objects")
                g = group[op]
                # groups are numbered by how often torch pickles use them
                if g == 0:  # BINPUT / LONG_BINPUT / PUT
                    if not stack:
                        raise IndexError
                    top = stack[-1]
                    if arg in memo and memo[arg] is not top:
                        self.trick(f"memo slot {arg} rebound at byte {pos} ({op.name}): was "
                                   f"{_short_repr(memo[arg])}, now {_short_repr(top)}")
                    memo[arg] = top
                elif g == 1:  # BINGET / LONG_BINGET / GET
                    try:
                        push(memo[arg])
                    except KeyError:
                        raise _WalkError(f"memo key {arg} not defined at byte {pos} ({op.name})") from None
                elif g == 2:  # ints, floats, str: genops decoded the operand
                    if type(arg) is str:
                        if not arg.isascii():  # genops decodes with surrogatepass: no lone surrogate goes on
                            arg = clean_text(arg)
                        push(arg)
                        if len(arg) >= _MIN_ENCODED_CHARS and arg[:1] != "\x80":
                            self.maybe_encoded(arg, pos, op.name)  # a latin-1 str is handled at _codecs.encode
                    else:
                        push(arg)
                elif g == 3:  # MARK
                    metastack.append(stack)
                    stack = []
                    push = stack.append
                elif g == 4:  # TUPLE2
                    b = stack.pop()
                    stack[-1] = (stack[-1], b)
                elif g == 5:  # TUPLE
                    if not metastack:
                        raise _WalkError(f"no MARK for TUPLE at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    push(tuple(items))
                elif g == 6:  # NEWFALSE
                    push(False)
                elif g == 7:  # REDUCE
                    args = stack.pop()
                    stack[-1] = self.reduce(stack[-1], args, pos)
                elif g == 8:  # EMPTY_TUPLE
                    push(())
                elif g == 9:  # TUPLE1
                    stack[-1] = (stack[-1],)
                elif g == 10:  # BINPERSID
                    stack[-1] = self.persistent_load(stack[-1], pos)
                elif g == 11:  # SETITEMS
                    if not metastack:
                        raise _WalkError(f"no MARK for SETITEMS at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    self.setitems(stack[-1], items, pos, "SETITEMS")
                elif g == 12:  # EMPTY_DICT
                    push({})
                elif g == 13:  # EMPTY_LIST
                    push([])
                elif g == 14:  # APPENDS
                    if not metastack:
                        raise _WalkError(f"no MARK for APPENDS at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    target = stack[-1]
                    if type(target) is list:
                        target.extend(items)
                    else:
                        self.appends(target, items, pos, "APPENDS")
                elif g == 15:  # NONE
                    push(None)
                elif g == 16:  # NEWTRUE
                    push(True)
                elif g == 17:  # SETITEM
                    if len(stack) < 3:
                        raise IndexError
                    v = stack.pop()
                    k = stack.pop()
                    self.setitems(stack[-1], (k, v), pos, "SETITEM")
                elif g == 18:  # APPEND
                    if len(stack) < 2:
                        raise IndexError
                    v = stack.pop()
                    self.appends(stack[-1], (v,), pos, "APPEND")
                elif g == 19:  # TUPLE3
                    if len(stack) < 3:
                        raise IndexError
                    cc = stack.pop()
                    b = stack.pop()
                    stack[-1] = (stack[-1], b, cc)
                elif g == 20:  # BUILD
                    st = stack.pop()
                    self.build(stack[-1], st, pos)
                elif g == 21:  # MEMOIZE
                    if not stack:
                        raise IndexError
                    i = len(memo)
                    top = stack[-1]
                    old = memo.get(i, _MISSING)
                    if old is not _MISSING and old is not top:
                        self.trick(f"memo slot {i} rebound at byte {pos} (MEMOIZE): was "
                                   f"{_short_repr(old)}, now {_short_repr(top)}")
                    memo[i] = top
                elif g == 22:  # GLOBAL
                    mod, name = _raw_line_pair(self.data, pos)
                    res.globals.append(GlobalImport(mod, name, "GLOBAL", pos, True))
                    self.check_name(mod, name, pos)
                    push(GlobalRef(mod, name))
                elif g == 23:  # STACK_GLOBAL
                    name = stack.pop()
                    mod = stack.pop()
                    if type(mod) is str and type(name) is str:
                        res.globals.append(GlobalImport(mod, name, "STACK_GLOBAL", pos, True))
                        self.check_name(mod, name, pos)
                        push(GlobalRef(mod, name))
                    else:
                        m, nm = _short_repr(mod), _short_repr(name)
                        res.globals.append(GlobalImport(m, nm, "STACK_GLOBAL", pos, False))
                        self.trick(f"STACK_GLOBAL at byte {pos} imports a computed name "
                                   f"(module {m}, name {nm}), hiding what it imports")
                        push(GlobalRef(m, nm))
                elif g == 24:  # NEWOBJ
                    args = stack.pop()
                    stack[-1] = self.newobj(stack[-1], args, None, pos, "NEWOBJ")
                elif g == 25:  # NEWOBJ_EX
                    kwargs = stack.pop()
                    args = stack.pop()
                    stack[-1] = self.newobj(stack[-1], args, kwargs, pos, "NEWOBJ_EX")
                elif g == 26:  # INST: module/name operands, args since MARK
                    mod, name = _raw_line_pair(self.data, pos)
                    res.globals.append(GlobalImport(mod, name, "INST", pos, True))
                    self.check_name(mod, name, pos)
                    if not metastack:
                        raise _WalkError(f"no MARK for INST at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    push(self.newobj(GlobalRef(mod, name), tuple(items), None, pos, "INST"))
                elif g == 27:  # OBJ: cls and args since MARK
                    if not metastack:
                        raise _WalkError(f"no MARK for OBJ at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    if not items:
                        raise IndexError
                    push(self.newobj(items[0], tuple(items[1:]), None, pos, "OBJ"))
                elif g == 28:  # STRING / SHORT_BINSTRING / BINSTRING (Python 2 str)
                    push(arg)
                    if type(arg) is str and (arg[:1] == "\x80" or len(arg) >= _MIN_ENCODED_CHARS):
                        self.maybe_encoded(arg, pos, op.name)
                    elif type(arg) is bytes and (arg[:1] == b"\x80" or len(arg) >= _MIN_ENCODED_CHARS):
                        self.maybe_encoded(arg, pos, op.name)
                elif g == 29:  # BINBYTES / SHORT_BINBYTES / BINBYTES8
                    push(arg)
                    if arg[:1] == b"\x80" or len(arg) >= _MIN_ENCODED_CHARS:
                        self.maybe_encoded(arg, pos, op.name)
                elif g == 30:  # BYTEARRAY8
                    push(bytearray(arg))
                    if arg[:1] == b"\x80" or len(arg) >= _MIN_ENCODED_CHARS:
                        self.maybe_encoded(arg, pos, op.name)
                elif g == 31:  # LIST
                    if not metastack:
                        raise _WalkError(f"no MARK for LIST at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    push(items)
                elif g == 32:  # DICT
                    if not metastack:
                        raise _WalkError(f"no MARK for DICT at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    d: Dict[Any, Any] = {}
                    self.setitems(d, items, pos, "DICT")
                    push(d)
                elif g == 33:  # EMPTY_SET
                    push(set())
                elif g == 34:  # ADDITEMS
                    if not metastack:
                        raise _WalkError(f"no MARK for ADDITEMS at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    target = stack[-1]
                    if type(target) is set:
                        target.update(_safe_key(x) for x in items)
                elif g == 35:  # FROZENSET
                    if not metastack:
                        raise _WalkError(f"no MARK for FROZENSET at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    push(frozenset(_safe_key(x) for x in items))
                elif g == 36:  # POP
                    if stack:
                        stack.pop()
                    elif metastack:  # pickle.py: popping an empty frame pops the MARK
                        stack = metastack.pop()
                        push = stack.append
                    else:
                        raise IndexError
                elif g == 37:  # POP_MARK
                    if not metastack:
                        raise _WalkError(f"no MARK for POP_MARK at byte {pos}")
                    stack = metastack.pop()
                    push = stack.append
                elif g == 38:  # DUP
                    push(stack[-1])
                elif g == 39:  # EXT1 / EXT2 / EXT4
                    res.globals.append(GlobalImport("copyreg._extension_registry", str(arg), op.name, pos, False))
                    self.trick(f"{op.name} at byte {pos} imports by extension-registry code {arg} "
                               "(copyreg.add_extension), so the imported name is not in the file")
                    push(GlobalRef("copyreg._extension_registry", str(arg)))
                elif g == 40:  # PROTO
                    if res.protocol is None:
                        res.protocol = arg
                elif g == 41:  # FRAME (protocol 4 framing hint): nothing to do
                    pass
                elif g == 42:  # NEXT_BUFFER (protocol 5 out-of-band data, not in the stream)
                    push(Call("<out-of-band buffer>", ()))
                elif g == 43:  # READONLY_BUFFER
                    if not stack:
                        raise IndexError
                elif g == 44:  # PERSID (protocol 0: the id is a string operand)
                    push(self.persistent_load(arg, pos))
                else:  # STOP
                    if metastack:
                        raise _WalkError(f"STOP at byte {pos} inside an unclosed MARK")
                    if not stack:
                        raise IndexError
                    res.obj = stack.pop()
                    stopped = True
            if not stopped and n >= self.max_ops:
                raise _BudgetError(f"gave up after max_ops={self.max_ops} opcodes at byte {f.tell()}")
        except _BudgetError as e:
            res.error = str(e)
            res.budget_exhausted = True
            strs = {k: v for k, v in memo.items() if type(v) is str}
            n_memo = len(memo)
            stack, metastack, memo = [], [], {}  # what was held is dropped before the imports scan
            self.scan_imports(f, strs, n_memo)
        except _WalkError as e:
            res.error = str(e)
        except IndexError:
            res.error = f"stack underflow at byte {pos} ({op.name if op else '?'})"
        except RecursionError:
            res.error = f"structure too deep at byte {pos} ({op.name if op else '?'})"
        except ValueError as e:  # pickletools.genops could not decode the next opcode
            res.error = self.decode_error(e, f)
        except Exception as e:  # hostile operands the handlers did not foresee
            res.error = f"cannot interpret {op.name if op else '?'} at byte {pos}: {type(e).__name__}: {e}"
        res.n_ops = n
        res.end = f.tell()
        if not res.budget_exhausted:
            res.imports_end = res.end
        if not stopped and res.error is None:  # pragma: no cover - genops raises instead
            res.error = f"truncated at byte {res.end}: no STOP opcode"
        try:
            if not stopped:
                res.obj = _salvage(stack, metastack, self)
            res.tensors = _tensor_paths(res.obj, self.tensors_built)
        except Exception as e:  # pragma: no cover - defensive: the result must still come back
            res.error = res.error or f"cannot describe the result: {type(e).__name__}: {e}"
        if self.n_tricks_dropped:
            res.tricks.append(f"{self.n_tricks_dropped} more trick(s) not listed")

    def scan_imports(self, f: Any, strs: Dict[Any, str], n_memo: int) -> None:
        """After the budget ran out: list the imports of the rest of the stream without building anything.

        ``GLOBAL``/``INST`` carry their names as operands; a ``STACK_GLOBAL`` takes the two strings
        pushed before it (directly or through the memo, whose string slots are the only thing kept).
        Anything else feeding it is recorded as a computed import.  Stops at ``STOP``, on undecodable
        bytes, or after :data:`MAX_IMPORT_SCAN_OPS` opcodes; ``imports_end`` is where it stopped.
        """
        res = self.res
        last: List[Any] = [None, None]
        pos = f.tell()
        try:
            for op, arg, pos in itertools.islice(pickletools.genops(f), MAX_IMPORT_SCAN_OPS):
                code = op.code
                if code in "ci":
                    mod, name = _raw_line_pair(self.data, pos)
                    res.globals.append(GlobalImport(mod, name, "GLOBAL" if code == "c" else "INST", pos, True))
                    self.check_name(mod, name, pos)
                    last = [None, None]
                elif code == "\x93":
                    mod, name = last
                    if type(mod) is str and type(name) is str:
                        res.globals.append(GlobalImport(mod, name, "STACK_GLOBAL", pos, True))
                        self.check_name(mod, name, pos)
                    else:
                        res.globals.append(GlobalImport("<computed>", "<computed>", "STACK_GLOBAL", pos, False))
                        self.trick(f"STACK_GLOBAL at byte {pos} imports a computed name, hiding what it imports")
                    last = [None, None]
                elif code in "qrp\x94":  # BINPUT / LONG_BINPUT / PUT / MEMOIZE keep the top in a slot
                    slot = arg
                    if code == "\x94":
                        slot, n_memo = n_memo, n_memo + 1
                    if type(last[1]) is str:
                        strs[slot] = last[1]
                    else:
                        strs.pop(slot, None)
                elif code in "hjg":
                    last = [last[1], strs.get(arg)]
                elif type(arg) is str:
                    last = [last[1], arg]
                elif code == ".":
                    res.imports_end = f.tell()
                    return
                else:
                    last = [last[1], None]
        except Exception:  # undecodable tail: a loader stops here too, so nothing after it runs
            res.imports_end = pos
            return
        res.imports_end = pos
        res.imports_complete = False  # MAX_IMPORT_SCAN_OPS ran out before STOP

    def decode_error(self, e: Exception, f: Any) -> str:
        msg = str(e)
        at = f.tell()
        size = len(self.data)
        if at >= size or "exhausted before seeing STOP" in msg:
            return f"truncated at byte {at}: no STOP opcode"
        if "unknown" in msg and "opcode" in msg:
            bad = self.data[at - 1] if 0 < at <= size else -1
            return f"unknown opcode 0x{bad:02x} at byte {at - 1}"
        return f"bad operand before byte {at}: {type(e).__name__}: {msg}"

    # -- names
    def check_name(self, mod: str, name: str, pos: int) -> None:
        # protocol >= 4 resolves dotted names attribute by attribute
        # (pickle.py ``_getattribute``); a dunder step reaches into objects.
        if "__" in name and any(p.startswith("__") and p.endswith("__") for p in name.split(".")[1:]):
            self.trick(f"import at byte {pos} walks attributes through a dunder name: {mod}.{name}")

    # -- nested pickles
    def maybe_encoded(self, payload: Any, pos: int, opname: str) -> None:
        """Try ``payload`` (a str or bytes operand) as a pickle, raw or encoded (base64, hex, zlib,
        bz2, lzma, up to :data:`_MAX_NESTED_DEPTH` layers); walk the pickle found inside."""
        if self.depth >= _MAX_NESTED_DEPTH:
            return
        if type(payload) is str:
            if payload[:1] == "\x80":
                try:
                    self.maybe_nested(payload.encode("latin-1"), pos, opname, "")
                except UnicodeEncodeError:
                    pass
                return
            if not payload.isascii():
                return
            payload = payload.encode("ascii")
        via: List[str] = []
        blob: Optional[bytes] = bytes(payload)
        for _ in range(_MAX_NESTED_DEPTH):
            if blob is None or len(blob) < 3:
                return
            if blob[:1] == b"\x80":
                self.maybe_nested(blob, pos, opname, " ".join(via))
                return
            blob, how = _decode_layer(blob, self.budget)
            if how:
                via.append(how)

    def maybe_nested(self, payload: bytes, pos: int, opname: str, via: str = "") -> None:
        if len(payload) < 3 or payload[1] > 5 or self.depth >= _MAX_NESTED_DEPTH:
            return
        budget = self.max_ops - self.res.n_ops
        sub = walk(payload, 0, max_ops=max(1000, min(budget, self.max_ops)), persistent=self.persistent,
                   _depth=self.depth + 1, _budget=self.budget)
        if sub.error is None and sub.n_ops >= 3:
            self.res.nested.append(sub)
            names = sorted({str(g) for g in sub.all_globals()})
            how = f" ({via}-encoded)" if via else ""
            self.trick(f"{opname} at byte {pos} holds a complete nested pickle{how} ({len(payload)} bytes, "
                       f"{sub.n_ops} opcodes, imports {names})")

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
            if type(key) in (str, int) else _short_repr(key)
        if type(location) is bytes:
            location = location.decode("ascii", "replace")
        elif type(location) is not str:
            location = _short_repr(location)
        existing = self.res.storages.get(key_s)
        if existing is not None:
            return existing
        if type(stype) is GlobalRef:
            try:
                dtype, itemsize = dtype_of_storage_type(stype.name)
            except KeyError:
                dtype, itemsize = f"unknown({stype})", 0
        else:
            dtype, itemsize = f"unknown({_short_repr(stype)})", 0
        s = StorageRef(key_s, dtype, location, numel if type(numel) is int else None, itemsize)
        self.res.storages[key_s] = s
        return s

    # -- calls
    def reduce(self, func: Any, args: Any, pos: int) -> Any:
        if type(args) is list:
            args = tuple(args)
        elif type(args) is not tuple:
            args = (args,)
        if type(func) is not GlobalRef:
            self.trick(f"REDUCE at byte {pos} calls a computed value ({_short_repr(func)}), "
                       "not a named import")
            return Call(func, args)
        hit = self.names.get(id(func))
        if hit is not None and hit[0] is func:
            full = hit[1]
        else:
            full = "%s.%s" % normalize_global(func.module, func.name)
            self.names[id(func)] = (func, full)
        name = func.name
        if full in _TENSOR_REBUILDS:
            t = self.rebuild(full, args)
            if t is not None:
                return t
            return Call(func, args)
        if full == "collections.OrderedDict":
            d = AttrDict()
            if args and type(args[0]) in (list, tuple):
                for kv in args[0]:
                    if type(kv) in (list, tuple) and len(kv) == 2:
                        self.setitems(d, kv, pos, "OrderedDict")
            return d
        if full == "torch.Size" and len(args) == 1 and _int_tuple(args[0]) is not None:
            return tuple(args[0])
        lit = _literal_call(full, args)
        if lit is not _MISSING:
            if type(lit) is bytes and lit[:1] == b"\x80":
                self.maybe_nested(lit, pos, "_codecs.encode")
            return lit
        if full in _KNOWN_CLASSES or name.rsplit(".", 1)[-1][:1].isupper():
            return Instance(func, args)
        return Call(func, args)

    def newobj(self, cls: Any, args: Any, kwargs: Any, pos: int, opname: str) -> Any:
        if type(args) is list:
            args = tuple(args)
        elif type(args) is not tuple:
            args = (args,)
        if kwargs:
            args = args + (kwargs,)
        if type(cls) is not GlobalRef:
            self.trick(f"{opname} at byte {pos} instantiates a computed class ({_short_repr(cls)})")
            return Instance(cls, args)
        mod, name = normalize_global(cls.module, cls.name)
        full = f"{mod}.{name}"
        if full in _PARAMETER_CLASSES and args and type(args[0]) is TensorMeta:
            t = args[0]
            t.requires_grad = args[1] if len(args) > 1 and type(args[1]) is bool else True
            t.is_parameter = True
            return t
        if full == "collections.OrderedDict" and not args:
            return AttrDict()
        return Instance(cls, args)

    def rebuild(self, full: str, args: tuple) -> Optional[TensorMeta]:
        """TensorMeta for a recognised torch rebuild call with well-formed args, else None."""
        if full in (_R_TENSOR_V2, _R_TENSOR, _R_TENSOR_V3, _R_QTENSOR):
            if len(args) < 4:
                return None
            storage, offset, size, stride = args[0], args[1], _int_tuple(args[2]), _int_tuple(args[3])
            if type(storage) is not StorageRef or type(offset) is not int or size is None or stride is None:
                return None
            dtype = storage.dtype
            rg = False
            if full == _R_TENSOR_V2 and len(args) >= 5:
                rg = args[4] is True
            elif full == _R_TENSOR_V3 and len(args) >= 7:
                rg = args[4] is True
                dt = args[6]
                if type(dt) is GlobalRef and dt.module == "torch":
                    dtype = _DTYPE_ALIASES.get(dt.name, dt.name)
            elif full == _R_QTENSOR and len(args) >= 6:
                rg = args[5] is True
            t = TensorMeta(storage, offset, size, stride, dtype, rg, False)
            self.tensors_built.append(t)
            return t
        if full in (_R_PARAM, _R_PARAM_STATE):
            if not args or type(args[0]) is not TensorMeta:
                return None
            t = args[0]
            t.requires_grad = args[1] if len(args) > 1 and type(args[1]) is bool else True
            t.is_parameter = True
            return t
        if full == _R_FROM_TYPE:
            if len(args) < 3 or type(args[0]) is not GlobalRef:
                return None
            inner = "%s.%s" % normalize_global(args[0].module, args[0].name)
            if inner not in _TENSOR_REBUILDS or inner == _R_FROM_TYPE:
                return None
            inner_args = args[2] if type(args[2]) is tuple else tuple(args[2]) if type(args[2]) is list else None
            if inner_args is None:
                return None
            t = self.rebuild(inner, inner_args)
            if t is None:
                return None
            nt = args[1]
            if type(nt) is GlobalRef and "%s.%s" % normalize_global(nt.module, nt.name) in _PARAMETER_CLASSES:
                t.is_parameter = True
            return t
        return None

    # -- container mutation
    def setitems(self, target: Any, items: Any, pos: int, opname: str) -> None:
        t = type(target)
        if t is dict or t is AttrDict:
            for i in range(0, len(items) - 1, 2):
                k = items[i]
                tk = type(k)
                if not (tk is str or tk is int):
                    k = _safe_key(k)
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


def _literal_call(full: str, args: tuple) -> Any:
    """Value of a harmless builtin called with literal arguments, else _MISSING."""
    try:
        if full == "_codecs.encode":
            if len(args) == 2 and type(args[0]) is str and type(args[1]) is str \
                    and args[1].lower() in _LITERAL_ENCODINGS:
                return args[0].encode(args[1])
            if len(args) == 1 and type(args[0]) is str:
                return args[0].encode("utf-8")
            return _MISSING
        if full in ("builtins.set", "builtins.frozenset"):
            if not args:
                return set() if full == "builtins.set" else frozenset()
            if len(args) == 1 and type(args[0]) in (list, tuple, set, frozenset):
                vals = [_safe_key(x) for x in args[0]]
                return set(vals) if full == "builtins.set" else frozenset(vals)
            return _MISSING
        if full == "builtins.bytearray":
            if not args:
                return bytearray()
            if len(args) == 1 and type(args[0]) in (bytes, bytearray):
                return bytearray(args[0])
            if len(args) == 2 and type(args[0]) is str and type(args[1]) is str \
                    and args[1].lower() in _LITERAL_ENCODINGS:
                return bytearray(args[0], args[1])
            return _MISSING
        if full == "builtins.complex":
            if 1 <= len(args) <= 2 and all(type(a) in (int, float) for a in args):
                return complex(*args)
            return _MISSING
        if full == "builtins.slice":
            if 1 <= len(args) <= 3 and all(a is None or type(a) is int for a in args):
                return slice(*args)
            return _MISSING
    except (ValueError, TypeError, OverflowError, UnicodeError):
        return _MISSING
    return _MISSING


def _salvage(stack: List[Any], metastack: List[List[Any]], st: _State) -> Any:
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


def _tensor_paths(root: Any, built: List[TensorMeta], max_nodes: int = 5_000_000,
                  max_depth: int = 1000) -> List[Tuple[str, TensorMeta]]:
    """Dotted paths of every TensorMeta reachable from ``root``, depth-first in insertion order.

    A tensor reachable twice (tied weights) is listed under each path; a
    container is expanded once (cycles and shared sub-trees stop there).
    Tensors that were built but are not reached (a cut-short pickle, or
    nesting deeper than ``max_depth`` containers) are listed as
    ``<unreached>.N``.
    """
    out: List[Tuple[str, TensorMeta]] = []
    seen_containers = set()
    reached = set()
    todo: List[Tuple[Any, str, int]] = [(root, "", 0)]
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
        pre = path + "." if path else ""
        d = depth + 1
        if t is dict or t is AttrDict:
            kids = [(v, pre + str(k), d) for k, v in obj.items() if type(v) in branch]
        elif t is list or t is tuple:
            kids = [(v, pre + str(i), d) for i, v in enumerate(obj) if type(v) in branch]
        else:  # Instance / Call
            kids = [(a, f"{pre}<arg{i}>", d) for i, a in enumerate(obj.args) if type(a) in branch]
            s = obj.state
            if type(s) is tuple and len(s) == 2 and isinstance(s[0], dict):
                s = s[0]
            if isinstance(s, dict):
                kids.extend((v, pre + str(k), d) for k, v in s.items() if type(v) in branch)
            elif type(s) in branch:
                kids.append((s, pre + "<state>", d))
            it = obj.items
            if isinstance(it, dict):
                kids.extend((v, pre + str(k), d) for k, v in it.items() if type(v) in branch)
            elif isinstance(it, list):
                kids.extend((v, pre + str(i), d) for i, v in enumerate(it) if type(v) in branch)
        kids.reverse()
        todo.extend(kids)
    n = 0
    for t in built:
        if id(t) not in reached:
            out.append((f"<unreached>.{n}", t))
            n += 1
    return out


# types _tensor_paths descends into (everything else is a leaf without tensors)
_BRANCH = frozenset({TensorMeta, dict, AttrDict, list, tuple, Instance, Call})
