"""The hidden-pickle search: imports past the budget, names, and pickles encoded inside operands.

:class:`HiddenPickles` is a mixin of the walk's ``WalkState``; a nested pickle is walked by the ``walker``
the state was given (``streams.walk``), so this module never imports the entry points.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import itertools
import lzma
import re
import zlib
from typing import Any, Dict, List, Optional, Tuple

from . import budgets
from .model import GlobalImport
from .opcodes import genops
from .reader import raw_line_pair

_B64 = re.compile(rb"[A-Za-z0-9+/\-_]+={0,2}")
_HEX = re.compile(rb"(?:[0-9a-fA-F]{2})+")


def _decode_layer(blob: bytes, budget: List[int]) -> Tuple[Optional[bytes], str]:
    """One decoding step of an operand that may hide a pickle: zlib/gzip, bz2, lzma, hex or
    base64.  Returns ``(decoded, how)`` or ``(None, "")``; output is capped at
    :data:`_MAX_DECODED_BYTES` and charged to ``budget[0]`` (bytes left for this walk)."""
    if budget[0] <= 0:
        return None, ""
    cap = min(budgets._MAX_DECODED_BYTES, budget[0])
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
        elif len(blob) >= budgets._MIN_ENCODED_CHARS and len(blob) % 2 == 0 and _HEX.fullmatch(blob):
            out, how = binascii.unhexlify(blob), "hex"
        elif len(blob) >= budgets._MIN_ENCODED_CHARS and len(blob) % 4 == 0 and _B64.fullmatch(blob):
            alt = b"-_" if (b"-" in blob or b"_" in blob) else None
            out, how = base64.b64decode(blob, altchars=alt, validate=True), "base64"
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError, binascii.Error):
        return None, ""
    if out is None:
        return None, ""
    budget[0] -= len(out)
    return out, how



def _memo_put(code: str, arg: Any, last: List[Any], strs: Dict[Any, str], n_memo: int) -> int:
    """A memo store (``BINPUT``/``LONG_BINPUT``/``PUT``, or ``MEMOIZE`` into the next slot) during the import
    scan: the slot keeps the string on top (``last[1]``) or is forgotten.  Returns the memo's new length."""
    slot = arg
    if code == "\x94":
        slot, n_memo = n_memo, n_memo + 1
    if type(last[1]) is str:
        strs[slot] = last[1]
    else:
        strs.pop(slot, None)
    return n_memo


class HiddenPickles:
    """``WalkState`` methods that look for what a pickle hides: imports, dunder names, nested pickles."""

    __slots__ = ()

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
            for op, arg, pos in itertools.islice(genops(self.data, f), budgets.MAX_IMPORT_SCAN_OPS):
                code = op.code
                if code in "ci":
                    mod, name = raw_line_pair(self.data, pos)
                    res.globals.append(GlobalImport(mod, name, "GLOBAL" if code == "c" else "INST", pos, True))
                    self.check_name(mod, name, pos)
                    last = [None, None]
                elif code == "\x93":
                    self._stack_global(last, pos)
                    last = [None, None]
                elif code in "qrp\x94":  # BINPUT / LONG_BINPUT / PUT / MEMOIZE keep the top in a slot
                    n_memo = _memo_put(code, arg, last, strs, n_memo)
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

    def _stack_global(self, last: List[Any], pos: int) -> None:
        """The import of a ``STACK_GLOBAL`` at ``pos`` from the two strings pushed before it (``last``), or a
        computed import (a trick) when they are not both literal strings."""
        mod, name = last
        if type(mod) is str and type(name) is str:
            self.res.globals.append(GlobalImport(mod, name, "STACK_GLOBAL", pos, True))
            self.check_name(mod, name, pos)
        else:
            self.res.globals.append(GlobalImport("<computed>", "<computed>", "STACK_GLOBAL", pos, False))
            self.trick(f"STACK_GLOBAL at byte {pos} imports a computed name, hiding what it imports")

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
        if self.depth >= budgets._MAX_NESTED_DEPTH:
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
        for _ in range(budgets._MAX_NESTED_DEPTH):
            if blob is None or len(blob) < 3:
                return
            if blob[:1] == b"\x80":
                self.maybe_nested(blob, pos, opname, " ".join(via))
                return
            blob, how = _decode_layer(blob, self.budget)
            if how:
                via.append(how)

    def maybe_nested(self, payload: bytes, pos: int, opname: str, via: str = "") -> None:
        if len(payload) < 3 or payload[1] > 5 or self.depth >= budgets._MAX_NESTED_DEPTH:
            return
        budget = self.max_ops - self.res.n_ops
        sub = self.walker(payload, 0, max_ops=max(1000, min(budget, self.max_ops)), persistent=self.persistent,
                          _depth=self.depth + 1, _budget=self.budget)
        if sub.error is None and sub.n_ops >= 3:
            self.res.nested.append(sub)
            names = sorted({str(g) for g in sub.all_globals()})
            if not names:
                return  # imports nothing: whoever unpickles it later runs no code (torchdata's loader state)
            how = f" ({via}-encoded)" if via else ""
            self.trick(f"{opname} at byte {pos} holds a complete nested pickle{how} ({len(payload)} bytes, "
                       f"{sub.n_ops} opcodes, imports {names})")
