"""A small pickle assembler: every sample of the corpus is written opcode by opcode.

Nothing here pickles a live object or unpickles anything: :class:`Asm` appends
the bytes of one opcode per call, in the encoding of the protocol it was made
for (opcode table: ``Lib/pickletools.py``; each opcode's ``proto`` there is the
lowest protocol that has it).  Protocol 0 output is text (``GLOBAL``, ``MARK``,
``UNICODE`` ... are printable ASCII lines); protocols 2+ start with ``PROTO``;
4+ may be wrapped in one ``FRAME`` as CPython's pickler does.

Values go on the stack with :meth:`Asm.push` (str, bytes, int, bool, None,
tuple, list, dict, nested); everything else is one explicit opcode, so a sample
reads like the disassembly it produces::

    a = Asm(2)
    a.glob("posix", "system")      # GLOBAL 'posix system'
    a.push(("touch X",))           # BINUNICODE + TUPLE1
    a.reduce()                     # REDUCE: posix.system("touch X")
    a.stop()
    a.bytes()
"""

from __future__ import annotations

import struct
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["Asm", "Raw"]

# opcode bytes (names as in pickletools)
MARK, STOP, POP, POP_MARK, DUP = b"(", b".", b"0", b"1", b"2"
INT, BININT, BININT1, BININT2, LONG, LONG1 = b"I", b"J", b"K", b"M", b"L", b"\x8a"
NONE, NEWTRUE, NEWFALSE = b"N", b"\x88", b"\x89"
STRING, UNICODE, BINUNICODE, SHORT_BINUNICODE = b"S", b"V", b"X", b"\x8c"
BINBYTES, SHORT_BINBYTES, BYTEARRAY8 = b"B", b"C", b"\x96"
APPEND, APPENDS, LIST, EMPTY_LIST = b"a", b"e", b"l", b"]"
DICT, EMPTY_DICT, SETITEM, SETITEMS = b"d", b"}", b"s", b"u"
TUPLE, EMPTY_TUPLE, TUPLE1, TUPLE2, TUPLE3 = b"t", b")", b"\x85", b"\x86", b"\x87"
GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ = b"c", b"\x93", b"R", b"b", b"i", b"o"
NEWOBJ, NEWOBJ_EX = b"\x81", b"\x92"
PUT, BINPUT, LONG_BINPUT, GET, BINGET, LONG_BINGET, MEMOIZE = b"p", b"q", b"r", b"g", b"h", b"j", b"\x94"
EXT1, EXT2, EXT4 = b"\x82", b"\x83", b"\x84"
PROTO, FRAME = b"\x80", b"\x95"


class Raw(bytes):
    """Bytes pushed as they are (already assembled opcodes)."""


def _text_unicode(s: str) -> bytes:
    # what pickle's protocol-0 save_str writes: raw-unicode-escape with \ and \n escaped
    return s.replace("\\", "\\u005c").replace("\0", "\\u0000").replace("\n", "\\u000a") \
        .replace("\r", "\\u000d").replace("\x1a", "\\u001a").encode("raw-unicode-escape")


class Asm:
    """Assemble one pickle stream of ``protocol`` (0-5).

    ``header=False`` leaves out the ``PROTO`` opcode (a trick some samples
    use); ``frame=True`` wraps the body in one ``FRAME`` (protocol 4+).
    """

    def __init__(self, protocol: int, *, header: bool = True, frame: bool = False) -> None:
        if not 0 <= protocol <= 5:
            raise ValueError(protocol)
        self.protocol = protocol
        self.header = header and protocol >= 2
        self.frame = frame and protocol >= 4
        self.body = bytearray()
        self._memo = 0

    # ---------------------------------------------------------------- raw
    def raw(self, b: bytes) -> "Asm":
        self.body += b
        return self

    def bytes(self) -> bytes:
        head = PROTO + bytes([self.protocol]) if self.header else b""
        body = bytes(self.body)
        if self.frame:
            body = FRAME + struct.pack("<Q", len(body)) + body
        return head + body

    # ---------------------------------------------------------------- values
    def push(self, v: Any) -> "Asm":
        """Push a literal value (recursively), in this protocol's encoding."""
        t = type(v)
        if isinstance(v, Raw):
            return self.raw(v)
        if v is None:
            return self.raw(NONE)
        if t is bool:
            if self.protocol >= 2:
                return self.raw(NEWTRUE if v else NEWFALSE)
            return self.raw(INT + (b"01\n" if v else b"00\n"))
        if t is int:
            return self.int_(v)
        if t is str:
            return self.str_(v)
        if t is bytes:
            return self.bytes_(v)
        if t is tuple:
            return self.tuple_literal(v)
        if t is list:
            if self.protocol == 0:
                self.raw(MARK + LIST)
                for x in v:
                    self.push(x)
                    self.raw(APPEND)
                return self
            self.raw(EMPTY_LIST)
            if v:
                self.raw(MARK)
                for x in v:
                    self.push(x)
                self.raw(APPENDS)
            return self
        if t is dict:
            if self.protocol == 0:
                self.raw(MARK + DICT)
                for k, x in v.items():
                    self.push(k)
                    self.push(x)
                    self.raw(SETITEM)
                return self
            self.raw(EMPTY_DICT)
            if v:
                self.raw(MARK)
                for k, x in v.items():
                    self.push(k)
                    self.push(x)
                self.raw(SETITEMS)
            return self
        raise TypeError(f"cannot push {t.__name__}")

    def int_(self, i: int) -> "Asm":
        if self.protocol == 0 or (self.protocol == 1 and not -(1 << 31) <= i < (1 << 31)):
            return self.raw(INT + b"%d\n" % i if -(1 << 31) <= i < (1 << 31) else LONG + b"%dL\n" % i)
        if 0 <= i < 256:
            return self.raw(BININT1 + bytes([i]))
        if 0 <= i < 65536:
            return self.raw(BININT2 + struct.pack("<H", i))
        if -(1 << 31) <= i < (1 << 31):
            return self.raw(BININT + struct.pack("<i", i))
        n = (i.bit_length() + 8) // 8
        return self.raw(LONG1 + bytes([n]) + i.to_bytes(n, "little", signed=True))

    def str_(self, s: str) -> "Asm":
        if self.protocol == 0:
            return self.raw(UNICODE + _text_unicode(s) + b"\n")
        b = s.encode("utf-8", "surrogatepass")
        if self.protocol >= 4 and len(b) < 256:
            return self.raw(SHORT_BINUNICODE + bytes([len(b)]) + b)
        return self.raw(BINUNICODE + struct.pack("<I", len(b)) + b)

    def string_(self, s: str) -> "Asm":
        """Python 2 ``STRING`` opcode (``S'...'``), the spelling of old protocol-0 exploits."""
        return self.raw(STRING + repr(s).encode("ascii") + b"\n")

    def bytes_(self, b: bytes) -> "Asm":
        if self.protocol >= 3:
            if len(b) < 256:
                return self.raw(SHORT_BINBYTES + bytes([len(b)]) + b)
            return self.raw(BINBYTES + struct.pack("<I", len(b)) + b)
        # protocols 0-2 have no bytes type: pickle writes _codecs.encode(latin-1 text, "latin1")
        if self.protocol == 0 and any(c >= 0x80 or (c < 0x20 and c not in b"\t") for c in b):
            raise ValueError("protocol-0 samples stay text: encode binary payloads (base64, hex) first")
        self.glob("_codecs", "encode")
        self.tuple_literal((b.decode("latin-1"), "latin1"))
        return self.reduce()

    def bytearray8(self, b: bytes) -> "Asm":
        assert self.protocol >= 5
        return self.raw(BYTEARRAY8 + struct.pack("<Q", len(b)) + b)

    def tuple_literal(self, items: tuple) -> "Asm":
        n = len(items)
        if n == 0:
            return self.raw(EMPTY_TUPLE if self.protocol >= 1 else MARK + TUPLE)
        if self.protocol >= 2 and n <= 3:
            for x in items:
                self.push(x)
            return self.raw((TUPLE1, TUPLE2, TUPLE3)[n - 1])
        self.raw(MARK)
        for x in items:
            self.push(x)
        return self.raw(TUPLE)

    @contextmanager
    def tuple_(self) -> Iterator["Asm"]:
        """``MARK`` ... ``TUPLE`` around whatever the block pushes (computed items)."""
        self.raw(MARK)
        yield self
        self.raw(TUPLE)

    @contextmanager
    def list_(self) -> Iterator["Asm"]:
        self.raw(MARK)
        yield self
        self.raw(LIST)

    # ---------------------------------------------------------------- imports and calls
    def glob(self, module: str, name: str) -> "Asm":
        """Import ``module.name``: ``GLOBAL`` below protocol 4, ``STACK_GLOBAL`` from 4 on."""
        if self.protocol >= 4:
            self.str_(module)
            self.str_(name)
            return self.raw(STACK_GLOBAL)
        return self.global_op(module, name)

    def global_op(self, module: str, name: str) -> "Asm":
        """The text ``GLOBAL`` opcode, whatever the protocol (it exists in all)."""
        return self.raw(GLOBAL + module.encode() + b"\n" + name.encode() + b"\n")

    def stack_global(self) -> "Asm":
        return self.raw(STACK_GLOBAL)

    def call(self, module: str, name: str, *args: Any) -> "Asm":
        """``module.name(*args)`` with literal args: import, args tuple, ``REDUCE``."""
        self.glob(module, name)
        self.tuple_literal(tuple(args))
        return self.reduce()

    def reduce(self) -> "Asm":
        return self.raw(REDUCE)

    def build(self) -> "Asm":
        return self.raw(BUILD)

    def inst(self, module: str, name: str, *args: Any) -> "Asm":
        """Protocol-0 ``INST``: ``MARK args INST 'module name'``."""
        self.raw(MARK)
        for x in args:
            self.push(x)
        return self.raw(INST + module.encode() + b"\n" + name.encode() + b"\n")

    def obj(self, module: str, name: str, *args: Any) -> "Asm":
        """Protocol-1 ``OBJ``: ``MARK class args OBJ`` calls class(*args)."""
        self.raw(MARK)
        self.glob(module, name)
        for x in args:
            self.push(x)
        return self.raw(OBJ)

    def newobj(self) -> "Asm":
        return self.raw(NEWOBJ)

    def ext(self, code: int) -> "Asm":
        """``EXT1``/``EXT2``/``EXT4``: import by copyreg extension-registry code."""
        if code < 256:
            return self.raw(EXT1 + bytes([code]))
        if code < 65536:
            return self.raw(EXT2 + struct.pack("<H", code))
        return self.raw(EXT4 + struct.pack("<i", code))

    # ---------------------------------------------------------------- stack and memo
    def pop(self) -> "Asm":
        return self.raw(POP)

    def dup(self) -> "Asm":
        return self.raw(DUP)

    def put(self, i: int) -> "Asm":
        if self.protocol == 0:
            return self.raw(PUT + b"%d\n" % i)
        if i < 256:
            return self.raw(BINPUT + bytes([i]))
        return self.raw(LONG_BINPUT + struct.pack("<I", i))

    def put_text(self, i: int) -> "Asm":
        """Text ``PUT`` (valid in every protocol)."""
        return self.raw(PUT + b"%d\n" % i)

    def get(self, i: int) -> "Asm":
        if self.protocol == 0:
            return self.raw(GET + b"%d\n" % i)
        if i < 256:
            return self.raw(BINGET + bytes([i]))
        return self.raw(LONG_BINGET + struct.pack("<I", i))

    def get_text(self, i: int) -> "Asm":
        return self.raw(GET + b"%d\n" % i)

    def memoize(self) -> "Asm":
        assert self.protocol >= 4
        self._memo += 1
        return self.raw(MEMOIZE)

    def stop(self) -> "Asm":
        return self.raw(STOP)
