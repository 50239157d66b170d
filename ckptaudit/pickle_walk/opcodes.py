"""The opcode stream: :func:`genops`, :func:`pickletools.genops` decoded from the buffer instead of a file.

The walk spends half its time in ``pickletools.genops``, which reads every opcode and every operand with a
``read`` call and a reader function (measured on 2,000,000 ``BININT1``: 0.77 s of a 1.58 s walk).  The walk
holds the whole pickle in memory anyway, so :func:`genops` decodes the fixed-size operands and the
length-prefixed strings, bytes and ``LONG1``/``LONG4`` integers straight from the buffer (``struct.unpack_from``,
slices, ``int.from_bytes``), and hands every other operand — the newline-terminated ones of protocol 0, and any
operand cut short by
the end of the buffer — to the reader ``pickletools`` itself uses, on the same file object.  Its results are
those of ``pickletools.genops(f)`` exactly: the same ``(OpcodeInfo, operand, position)`` triples, the same
``ValueError`` (same message) at the same place, the file left at the same offset after each triple and
after an error (``tests/test_pickle_walk.py`` compares them on every opcode, cut at every byte, and on
random bytes).  Operand decoding follows pickletools' readers (CPython Lib/pickletools.py: ``read_uint1`` …
``read_unicodestring8``): little-endian sizes, ``BINFLOAT`` big-endian, text as UTF-8 with
``surrogatepass``, protocol-0/1 byte strings as latin-1.
"""

from __future__ import annotations

import pickletools
from struct import Struct
from typing import Any, Iterator, Tuple

__all__ = ["genops"]

_U2, _I4, _U4, _U8, _F8 = Struct("<H"), Struct("<i"), Struct("<I"), Struct("<Q"), Struct(">d")

# operand kinds decoded here; 0: none; -1: pickletools' reader
_NONE, _UINT1, _UINT2, _INT4, _UINT4, _UINT8, _FLOAT8 = 0, 1, 2, 3, 4, 5, 6
_TEXT1, _TEXT4, _TEXT8, _BYTES1, _BYTES4, _BYTES8, _BYTEARRAY8, _LATIN1_1, _LATIN1_4 = range(7, 16)
_LONG1, _LONG4 = 16, 17  # a length, then that many bytes of a little-endian two's-complement integer
#: the kinds a decoding loop tests first (:meth:`ckptaudit.pickle_walk.machine.WalkState._loop`)
NO_OPERAND, UINT1_OPERAND = _NONE, _UINT1
_READER = -1
_KIND_OF_ARG = {
    "uint1": _UINT1, "uint2": _UINT2, "int4": _INT4, "uint4": _UINT4, "uint8": _UINT8, "float8": _FLOAT8,
    "unicodestring1": _TEXT1, "unicodestring4": _TEXT4, "unicodestring8": _TEXT8,
    "bytes1": _BYTES1, "bytes4": _BYTES4, "bytes8": _BYTES8, "bytearray8": _BYTEARRAY8,
    "string1": _LATIN1_1, "string4": _LATIN1_4, "long1": _LONG1, "long4": _LONG4,
}
_WIDTH = {_TEXT1: 1, _BYTES1: 1, _LATIN1_1: 1, _TEXT4: 4, _BYTES4: 4, _LATIN1_4: 4,
          _TEXT8: 8, _BYTES8: 8, _BYTEARRAY8: 8, _LONG1: 1, _LONG4: 4}  # bytes of the length prefix
#: operand kind → (its struct's ``unpack_from``, bytes) for the fixed-size kinds after uint1, else None (the
#: last entry answers for ``_READER``, -1)
FIXED_OPERAND: list = [None] * 19
FIXED_OPERAND[_UINT2], FIXED_OPERAND[_INT4] = (_U2.unpack_from, 2), (_I4.unpack_from, 4)
FIXED_OPERAND[_UINT4] = (_U4.unpack_from, 4)
FIXED_OPERAND[_UINT8], FIXED_OPERAND[_FLOAT8] = (_U8.unpack_from, 8), (_F8.unpack_from, 8)
#: byte value → (OpcodeInfo, operand kind), or None for a byte that is no opcode
OPCODE_OF_BYTE: list = [None] * 256
for _op in pickletools.opcodes:
    OPCODE_OF_BYTE[ord(_op.code)] = (_op, _NONE if _op.arg is None else _KIND_OF_ARG.get(_op.arg.name, _READER))
del _op


def genops(data: Any, f: Any) -> Iterator[Tuple[Any, Any, int]]:
    """``pickletools.genops(f)``, where ``f`` (``io.BytesIO`` or the walk's memoryview reader, with ``tell``,
    ``seek`` and ``read``) reads ``data`` (bytes or a 1-D byte memoryview) and starts at ``f.tell()``.

    Yields ``(OpcodeInfo, operand, position)`` up to and including ``STOP``; raises ``ValueError`` where
    ``pickletools.genops`` would, with its message.  ``f`` is at the end of the opcode's operand whenever a
    triple is yielded, and where pickletools leaves it when an error is raised.

    The walk's loop (:meth:`ckptaudit.pickle_walk.machine.WalkState._loop`) decodes with a copy of this body,
    inlined for speed; tests/test_walk_loop.py fails when the two decode differently, and tests/test_pickle_walk.py
    holds this one to ``pickletools``."""
    table, fixed_of, n = OPCODE_OF_BYTE, FIXED_OPERAND, len(data)
    seek, tell = f.seek, f.tell
    p = tell()
    while True:
        if p >= n:
            seek(n)
            raise ValueError("pickle exhausted before seeing STOP")
        entry = table[data[p]]
        if entry is None:
            seek(p + 1)
            raise ValueError("at position %s, opcode %r unknown" % (p, bytes(data[p:p + 1])))
        op, kind = entry
        q = p + 1
        if kind == _NONE:
            arg = None
        elif kind == _UINT1 and q < n:
            arg = data[q]
            q += 1
        elif (fixed := fixed_of[kind]) is not None and q + fixed[1] <= n:
            arg = fixed[0](data, q)[0]
            q += fixed[1]
        else:
            arg, q = sized_operand(data, n, q, kind, f)
        seek(q)
        yield op, arg, p
        if op.code == ".":
            return
        p = q


def sized_operand(data: Any, n: int, q: int, kind: int, f: Any) -> Tuple[Any, int]:
    """(operand, offset after it) of a length-prefixed operand at ``q``; pickletools' own reader (on ``f``)
    for the other kinds and for an operand the buffer does not hold whole (it raises the error)."""
    width = _WIDTH.get(kind)
    if width is not None and q + width <= n:
        size = data[q] if width == 1 else (_U4 if width == 4 else _U8).unpack_from(data, q)[0]
        if (kind == _LATIN1_4 or kind == _LONG4) and size >= 1 << 31:  # read_string4/read_long4: a signed length
            size = -1
        a = q + width
        if 0 <= size and a + size <= n:
            raw = data[a:a + size]
            if kind in (_TEXT1, _TEXT4, _TEXT8):
                try:
                    return str(raw, "utf-8", "surrogatepass"), a + size
                except UnicodeDecodeError:
                    pass  # the reader raises it, with f where pickletools leaves it
            elif kind == _LONG1 or kind == _LONG4:  # pickle.decode_long
                return int.from_bytes(raw, "little", signed=True), a + size
            elif kind == _BYTEARRAY8:
                return bytearray(raw), a + size
            elif kind in (_LATIN1_1, _LATIN1_4):
                return bytes(raw).decode("latin-1"), a + size
            else:
                return bytes(raw), a + size
    op = OPCODE_OF_BYTE[data[q - 1]][0]
    f.seek(q)
    arg = op.arg.reader(f)
    return arg, f.tell()


#: byte value → how :func:`memo_reads` steps over the opcode's operand: ``(0, n)`` n fixed bytes, ``(1, w)`` a
#: w-byte little-endian length then that many bytes, ``(2, k)`` k newline-terminated lines, ``(3, n)`` a binary
#: ``GET`` whose n-byte slot it records; None for a byte that is no opcode, or that this scan does not decode
#: (the text ``GET``/``PUT``/``MEMOIZE``-free protocol 0 memo opcodes: it then gives up)
_STEP: list = [None] * 256
for _op in pickletools.opcodes:
    _k = _NONE if _op.arg is None else _KIND_OF_ARG.get(_op.arg.name, _READER)
    if _op.name in ("BINGET", "LONG_BINGET"):
        _STEP[ord(_op.code)] = (3, _op.arg.n)
    elif _op.name in ("GET", "PUT"):
        continue
    elif _k == _NONE:
        _STEP[ord(_op.code)] = (0, 0)
    elif _k in _WIDTH:
        _STEP[ord(_op.code)] = (1, _WIDTH[_k])
    elif _op.arg.n >= 0:
        _STEP[ord(_op.code)] = (0, _op.arg.n)
    else:  # newline-terminated operands: one line, or two for GLOBAL/INST
        _STEP[ord(_op.code)] = (2, 2 if _op.arg.name == "stringnl_noescape_pair" else 1)
del _op, _k


def memo_reads(data: Any, start: int = 0) -> Any:
    """The memo slots that the pickle at ``start`` of ``data`` ever reads (``BINGET``/``LONG_BINGET``
    operands up to its ``STOP``), as a set of ints; None when this scan cannot tell them all (a protocol-0
    ``GET``/``PUT``, an unknown opcode, an operand past the end, no ``STOP``).

    A ``torch.save`` memoises almost every object it writes (~7 slots a tensor) and reads back a handful
    (the storage tag, the location, the rebuild functions), so a walk told these keeps only those
    (:class:`ckptaudit.pickle_walk.memo.Memo`).  Never a subset: every slot a ``genops`` decode of the same
    bytes would read is here; one opcode at a time, no value decoded."""
    step, n, p = _STEP, len(data), start
    reads = set()
    add = reads.add
    u4 = _U4.unpack_from
    while p < n:
        code = data[p]
        entry = step[code]
        if entry is None:
            return None
        how, k = entry
        p += 1
        if how == 0:
            p += k
        elif how == 3:
            if p + k > n:
                return None
            add(data[p] if k == 1 else u4(data, p)[0])
            p += k
        elif how == 1:
            if p + k > n:
                return None
            size = data[p] if k == 1 else u4(data, p)[0] if k == 4 else _U8.unpack_from(data, p)[0]
            p += k + size
        else:
            for _ in range(k):
                e = bytes(data[p:p + 4096]).find(b"\n")
                if e < 0:
                    return None
                p += e + 1
        if code == 0x2E:  # STOP
            return reads if p <= n else None
    return None
