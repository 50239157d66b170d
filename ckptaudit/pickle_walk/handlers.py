"""One small handler per pickle opcode (or family of opcodes), as the walk's dispatch table.

:class:`OpcodeHandlers` is a mixin of the walk's ``WalkState``.  Each handler is called as
``handler(stack, arg, pos, op)``: ``stack`` is the current frame (the items pushed since the last MARK, as
in ``pickle._Unpickler.stack``), ``arg`` the operand :func:`.opcodes.genops` decoded, ``pos`` the opcode's
byte offset and ``op`` its ``pickletools.OpcodeInfo``.  A handler works on ``stack`` in place; the three that
change frames (MARK, POP and the opcodes that take the items since the last MARK) set ``self.stack`` and
are marked in :data:`FRAME_HANDLERS` so the loop (:meth:`.machine.WalkState._run`) reloads it.

Semantics follow CPython's ``Lib/pickle.py`` ``_Unpickler`` (``load_*`` methods): popping from an empty frame
is a stack underflow (``IndexError``), POP on an empty frame pops its MARK, STOP inside an open MARK is an
error; what a call or an instance would build is made symbolically by :mod:`.objects`.
"""

from __future__ import annotations

from typing import Any, Dict, List

from .memo import EMPTY
from .model import Call, GlobalImport, GlobalRef
from .reader import safe_key, short_repr, WalkError, clean_text


class OpcodeHandlers:
    """``WalkState`` methods, one per opcode family; the table that maps opcodes to them is :data:`HANDLERS`."""

    __slots__ = ()

    # -- memo
    def op_put(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # BINPUT / LONG_BINPUT / PUT
        if not stack:
            raise IndexError
        top = stack[-1]
        old = self.memo.put(arg, top)
        if old is not EMPTY and old is not top:
            self.trick(f"memo slot {arg} rebound at byte {pos} ({op.name}): was "
                       f"{short_repr(old)}, now {short_repr(top)}")

    def op_memoize(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # MEMOIZE (slot = memo size)
        if not stack:
            raise IndexError
        i = len(self.memo)
        top = stack[-1]
        old = self.memo.put(i, top)
        if old is not EMPTY and old is not top:
            self.trick(f"memo slot {i} rebound at byte {pos} (MEMOIZE): was "
                       f"{short_repr(old)}, now {short_repr(top)}")

    def op_get(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # BINGET / LONG_BINGET / GET
        try:
            stack.append(self.memo[arg])
        except KeyError:
            raise WalkError(f"memo key {arg} not defined at byte {pos} ({op.name})") from None

    # -- values
    def op_literal(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # ints, floats, unicode str
        if type(arg) is str:
            if not arg.isascii():  # genops decodes with surrogatepass: no lone surrogate goes on
                arg = clean_text(arg)
            stack.append(arg)
            if len(arg) >= self.min_chars and arg[:1] != "\x80":
                self.maybe_encoded(arg, pos, op.name)  # a latin-1 str is handled at _codecs.encode
        else:
            stack.append(arg)

    def op_py2_string(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # STRING / *BINSTRING
        stack.append(arg)
        if type(arg) is str and (arg[:1] == "\x80" or len(arg) >= self.min_chars):
            self.maybe_encoded(arg, pos, op.name)
        elif type(arg) is bytes and (arg[:1] == b"\x80" or len(arg) >= self.min_chars):
            self.maybe_encoded(arg, pos, op.name)

    def op_bytes(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # BINBYTES / SHORT_BINBYTES / 8
        stack.append(arg)
        if arg[:1] == b"\x80" or len(arg) >= self.min_chars:
            self.maybe_encoded(arg, pos, op.name)

    def op_bytearray(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # BYTEARRAY8
        stack.append(bytearray(arg))
        if arg[:1] == b"\x80" or len(arg) >= self.min_chars:
            self.maybe_encoded(arg, pos, op.name)

    def op_none(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append(None)

    def op_true(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append(True)

    def op_false(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append(False)

    def op_empty_tuple(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append(())

    def op_empty_dict(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append({})

    def op_empty_list(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append([])

    def op_empty_set(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append(set())

    def op_tuple1(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack[-1] = (stack[-1],)

    def op_tuple2(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        b = stack.pop()
        stack[-1] = (stack[-1], b)

    def op_tuple3(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        if len(stack) < 3:
            raise IndexError
        c = stack.pop()
        b = stack.pop()
        stack[-1] = (stack[-1], b, c)

    def op_dup(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack.append(stack[-1])

    # -- containers filled from the stack
    def op_setitem(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        if len(stack) < 3:
            raise IndexError
        v = stack.pop()
        k = stack.pop()
        self.setitems(stack[-1], (k, v), pos, "SETITEM")

    def op_append(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        if len(stack) < 2:
            raise IndexError
        v = stack.pop()
        self.appends(stack[-1], (v,), pos, "APPEND")

    # -- imports, calls, instances
    def op_global(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # GLOBAL: operand lines
        stack.append(self.line_global(pos, "GLOBAL"))

    def op_stack_global(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        name = stack.pop()
        mod = stack.pop()
        if type(mod) is str and type(name) is str:
            self.res.globals.append(GlobalImport(mod, name, "STACK_GLOBAL", pos, True))
            self.check_name(mod, name, pos)
            stack.append(GlobalRef(mod, name))
        else:
            m, nm = short_repr(mod), short_repr(name)
            self.res.globals.append(GlobalImport(m, nm, "STACK_GLOBAL", pos, False))
            self.trick(f"STACK_GLOBAL at byte {pos} imports a computed name "
                       f"(module {m}, name {nm}), hiding what it imports")
            stack.append(GlobalRef(m, nm))

    def op_ext(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # EXT1 / EXT2 / EXT4
        self.res.globals.append(GlobalImport("copyreg._extension_registry", str(arg), op.name, pos, False))
        self.trick(f"{op.name} at byte {pos} imports by extension-registry code {arg} "
                   "(copyreg.add_extension), so the imported name is not in the file")
        stack.append(GlobalRef("copyreg._extension_registry", str(arg)))

    def op_reduce(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        args = stack.pop()
        stack[-1] = self.reduce(stack[-1], args, pos)

    def op_newobj(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        args = stack.pop()
        stack[-1] = self.newobj(stack[-1], args, None, pos, "NEWOBJ")

    def op_newobj_ex(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        kwargs = stack.pop()
        args = stack.pop()
        stack[-1] = self.newobj(stack[-1], args, kwargs, pos, "NEWOBJ_EX")

    def op_build(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        st = stack.pop()
        self.build(stack[-1], st, pos)

    def op_binpersid(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        stack[-1] = self.persistent_load(stack[-1], pos)

    def op_persid(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # protocol 0: a string operand
        stack.append(self.persistent_load(arg, pos))

    # -- framing and protocol 5 buffers
    def op_proto(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        if self.res.protocol is None:
            self.res.protocol = arg

    def op_frame(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # a framing hint: nothing to do
        pass

    def op_next_buffer(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # out-of-band data
        stack.append(Call("<out-of-band buffer>", ()))

    def op_readonly_buffer(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        if not stack:
            raise IndexError

    def op_stop(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        if self.metastack:
            raise WalkError(f"STOP at byte {pos} inside an unclosed MARK")
        if not stack:
            raise IndexError
        self.res.obj = stack.pop()
        self.stopped = True

    # -- frames (FRAME_HANDLERS: the loop reloads self.stack after these)
    def op_mark(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        self.metastack.append(stack)
        self.stack = []

    def op_pop(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        if stack:
            stack.pop()
        elif self.metastack:  # pickle.py: popping an empty frame pops the MARK
            self.stack = self.metastack.pop()
        else:
            raise IndexError

    def _items(self, stack: List[Any], pos: int, op: Any) -> List[Any]:
        """The items since the last MARK (the current frame); the frame below becomes current."""
        if not self.metastack:
            raise WalkError(f"no MARK for {op.name} at byte {pos}")
        self.stack = self.metastack.pop()
        return stack

    def op_tuple(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        items = self._items(stack, pos, op)
        self.stack.append(tuple(items))

    def op_list(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        items = self._items(stack, pos, op)
        self.stack.append(items)

    def op_dict(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        items = self._items(stack, pos, op)
        d: Dict[Any, Any] = {}
        self.setitems(d, items, pos, "DICT")
        self.stack.append(d)

    def op_frozenset(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        items = self._items(stack, pos, op)
        self.stack.append(frozenset(safe_key(x) for x in items))

    def op_setitems(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        items = self._items(stack, pos, op)
        self.setitems(self.stack[-1], items, pos, "SETITEMS")

    def op_appends(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        items = self._items(stack, pos, op)
        target = self.stack[-1]
        if type(target) is list:
            target.extend(items)
        else:
            self.appends(target, items, pos, "APPENDS")

    def op_additems(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:
        items = self._items(stack, pos, op)
        target = self.stack[-1]
        if type(target) is set:
            target.update(safe_key(x) for x in items)

    def op_pop_mark(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # the items are dropped
        self._items(stack, pos, op)

    def op_inst(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # module/name operands, args since MARK
        if not self.metastack:  # INST names its class in operands: listed even without a MARK
            self.line_global(pos, "INST")
        items = self._items(stack, pos, op)
        try:
            cls = self.line_global(pos, "INST")
        except WalkError:  # unreadable operands: the frame goes back as it was, for the salvage
            self.metastack.append(self.stack)
            self.stack = items
            raise
        self.stack.append(self.newobj(cls, tuple(items), None, pos, "INST"))

    def op_obj(self, stack: List[Any], arg: Any, pos: int, op: Any) -> None:  # cls and args since MARK
        items = self._items(stack, pos, op)
        if not items:
            raise IndexError
        self.stack.append(self.newobj(items[0], tuple(items[1:]), None, pos, "OBJ"))


#: Opcode name -> handler name.  Every opcode of ``pickletools.opcodes`` has one (checked at import).
HANDLERS: Dict[str, str] = {
    **{n: "op_put" for n in ("BINPUT", "LONG_BINPUT", "PUT")},
    **{n: "op_get" for n in ("BINGET", "LONG_BINGET", "GET")},
    **{n: "op_literal" for n in ("BININT", "BININT1", "BININT2", "INT", "LONG", "LONG1", "LONG4", "FLOAT",
                                  "BINFLOAT", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8")},
    **{n: "op_py2_string" for n in ("STRING", "BINSTRING", "SHORT_BINSTRING")},
    **{n: "op_bytes" for n in ("BINBYTES", "SHORT_BINBYTES", "BINBYTES8")},
    **{n: "op_ext" for n in ("EXT1", "EXT2", "EXT4")},
    "MEMOIZE": "op_memoize", "BYTEARRAY8": "op_bytearray", "NONE": "op_none", "NEWTRUE": "op_true",
    "NEWFALSE": "op_false", "EMPTY_TUPLE": "op_empty_tuple", "EMPTY_DICT": "op_empty_dict",
    "EMPTY_LIST": "op_empty_list", "EMPTY_SET": "op_empty_set", "TUPLE1": "op_tuple1", "TUPLE2": "op_tuple2",
    "TUPLE3": "op_tuple3", "DUP": "op_dup", "SETITEM": "op_setitem", "APPEND": "op_append",
    "GLOBAL": "op_global", "STACK_GLOBAL": "op_stack_global", "REDUCE": "op_reduce", "NEWOBJ": "op_newobj",
    "NEWOBJ_EX": "op_newobj_ex", "BUILD": "op_build", "BINPERSID": "op_binpersid", "PERSID": "op_persid",
    "PROTO": "op_proto", "FRAME": "op_frame", "NEXT_BUFFER": "op_next_buffer",
    "READONLY_BUFFER": "op_readonly_buffer", "STOP": "op_stop",
    "MARK": "op_mark", "POP": "op_pop", "TUPLE": "op_tuple", "LIST": "op_list", "DICT": "op_dict",
    "FROZENSET": "op_frozenset", "SETITEMS": "op_setitems", "APPENDS": "op_appends", "ADDITEMS": "op_additems",
    "POP_MARK": "op_pop_mark", "INST": "op_inst", "OBJ": "op_obj",
}
#: The handlers that change the current frame (``self.stack``).
FRAME_HANDLERS = frozenset({"op_mark", "op_pop", "op_tuple", "op_list", "op_dict", "op_frozenset", "op_setitems",
                            "op_appends", "op_additems", "op_pop_mark", "op_inst", "op_obj"})
