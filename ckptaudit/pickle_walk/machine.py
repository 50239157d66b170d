"""The opcode machine: ``_State`` and its one flat opcode loop over :func:`.opcodes.genops` (pickletools'
``genops``, decoded from the buffer).

The loop stays in one function for speed; the handlers it calls are mixin methods
(:mod:`.hidden`, :mod:`.objects`), so their attribute lookups are those of one class.
"""

from __future__ import annotations

import itertools
import pickletools
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import budgets

#: Held for the whole of a walk (re-entrant: a nested pickle is walked inside its parent's walk).  The walk's
#: memory budget is the growth of ``sys.getallocatedblocks()``, a count for the whole interpreter, so two walks
#: on two threads would each count the other's objects and give up early.  The hash stage's plan walks of a
#: part's units run on threads, and so does the reader's read-ahead beside its metadata pass; a walk is Python
#: under the GIL, so taking turns costs no throughput.
WALKS = threading.RLock()
from .hidden import _HiddenPickles
from .memo import EMPTY, Memo
from .model import Call, GlobalImport, GlobalRef, TensorMeta, WalkResult
from .objects import _ObjectOps
from .opcodes import genops
from .reader import _BudgetError, _WalkError, _raw_line_pair, _safe_key, _short_repr, clean_text
from .salvage import _salvage, _tensor_paths

# opcode (pickletools.OpcodeInfo) -> handler group used by _State.run, numbered by how often torch pickles use them
_GROUP_CODES = [
    "qrp", "hjg", "KMJX\x8cG\x8aIL\x8bFV\x8d", "(", "\x86", "\x89", "R", ")", "\x85", "Q", "}", "]", "N", "\x88",
    "s", "a", "\x87", "b", "\x94", "c", "\x93", "\x81", "\x92", "SUT", "BC\x8e", "\x96", "\x8f", "0", "2",
    "\x82\x83\x84", "\x80", "\x95", "\x97", "\x98", "P", ".",
]
# the opcodes that take the items pushed since the last MARK: groups _TAKES_MARK + i, one branch of _State.run
_TAKES_MARK = 100
_MARK_CODES = ["t", "u", "e", "i", "o", "l", "d", "\x90", "\x91", "1"]
_GROUP = {pickletools.code2op[ch]: g for g, codes in enumerate(_GROUP_CODES) for ch in codes}
_GROUP.update({pickletools.code2op[ch]: _TAKES_MARK + g for g, codes in enumerate(_MARK_CODES) for ch in codes})
assert len(_GROUP) == len(pickletools.opcodes), "an opcode has no handler group"


class _State(_HiddenPickles, _ObjectOps):
    """One walk of one pickle stream: the result being filled, its budgets, and the opcode loop (:meth:`run`)."""

    __slots__ = ("res", "data", "persistent", "depth", "max_ops", "max_blocks", "n_tricks_dropped", "tensors_built", "names",
                 "budget", "walker")

    def __init__(self, res: WalkResult, data: Any, persistent: str, depth: int, max_ops: int,
                 budget: Optional[List[int]] = None, *, walker: Callable[..., WalkResult]) -> None:
        self.budget = budget if budget is not None else [budgets._MAX_DECODE_BUDGET]
        self.res = res
        self.data = data
        self.persistent = persistent
        self.depth = depth
        self.max_ops = max_ops
        self.max_blocks = budgets.MAX_WALK_BLOCKS
        self.walker = walker  # streams.walk, for nested pickles (hidden.py never imports it)
        self.n_tricks_dropped = 0
        self.tensors_built: List[TensorMeta] = []
        self.names: Dict[int, Tuple[GlobalRef, str]] = {}  # id(GlobalRef) -> normalised "module.name"

    # -- bookkeeping
    def trick(self, text: str) -> None:
        if len(self.res.tricks) < budgets._MAX_TRICKS:
            self.res.tricks.append(text)
        else:
            self.n_tricks_dropped += 1

    def line_global(self, pos: int, opname: str) -> GlobalRef:
        """The module/name operand lines of GLOBAL or INST at ``pos``: listed as an import, checked, and returned."""
        mod, name = _raw_line_pair(self.data, pos)
        self.res.globals.append(GlobalImport(mod, name, opname, pos, True))
        self.check_name(mod, name, pos)
        return GlobalRef(mod, name)

    # -- main loop
    def run(self, f: Any, start: int) -> None:
        """Walk the pickle at ``start`` of ``f``, one walk at a time per process (:data:`WALKS`)."""
        with WALKS:
            self._run(f, start)

    def _run(self, f: Any, start: int) -> None:  # noqa: C901 - one opcode table, kept flat for speed
        res = self.res
        stack: List[Any] = []
        metastack: List[List[Any]] = []
        memo = Memo()  # a list while torch's pickler fills slots in order (./memo.py)
        push = stack.append
        group = _GROUP
        n = 0
        op = None
        pos = start
        stopped = False
        blocks0 = sys.getallocatedblocks()
        max_blocks = self.max_blocks
        check_mask = budgets._CHECK_MASK
        min_chars = budgets._MIN_ENCODED_CHARS
        try:
            ops = itertools.islice(genops(self.data, f), self.max_ops)
            for n, (op, arg, pos) in enumerate(ops, 1):
                if not n & check_mask and sys.getallocatedblocks() - blocks0 > max_blocks:
                    raise _BudgetError(f"gave up after {n} opcodes at byte {pos}: the object tree holds more "
                                       f"than {max_blocks} interpreter objects")
                g = group[op]
                if g == 0:  # BINPUT / LONG_BINPUT / PUT
                    if not stack:
                        raise IndexError
                    top = stack[-1]
                    old = memo.put(arg, top)
                    if old is not EMPTY and old is not top:
                        self.trick(f"memo slot {arg} rebound at byte {pos} ({op.name}): was "
                                   f"{_short_repr(old)}, now {_short_repr(top)}")
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
                        if len(arg) >= min_chars and arg[:1] != "\x80":
                            self.maybe_encoded(arg, pos, op.name)  # a latin-1 str is handled at _codecs.encode
                    else:
                        push(arg)
                elif g == 3:  # MARK
                    metastack.append(stack)
                    stack = []
                    push = stack.append
                elif g >= 100:  # _TAKES_MARK: the items since the last MARK become this opcode's operands
                    if not metastack:
                        if g == 103:  # INST names its class in operands: listed even without a MARK
                            self.line_global(pos, "INST")
                        raise _WalkError(f"no MARK for {op.name} at byte {pos}")
                    items = stack
                    stack = metastack.pop()
                    push = stack.append
                    if g == 100:  # TUPLE
                        push(tuple(items))
                    elif g == 101:  # SETITEMS
                        self.setitems(stack[-1], items, pos, "SETITEMS")
                    elif g == 102:  # APPENDS
                        target = stack[-1]
                        if type(target) is list:
                            target.extend(items)
                        else:
                            self.appends(target, items, pos, "APPENDS")
                    elif g == 103:  # INST: module/name operands, args since MARK
                        try:
                            cls = self.line_global(pos, "INST")
                        except _WalkError:  # unreadable operands: the frame goes back as it was, for the salvage
                            metastack.append(stack)
                            stack = items
                            raise
                        push(self.newobj(cls, tuple(items), None, pos, "INST"))
                    elif g == 104:  # OBJ: cls and args since MARK
                        if not items:
                            raise IndexError
                        push(self.newobj(items[0], tuple(items[1:]), None, pos, "OBJ"))
                    elif g == 105:  # LIST
                        push(items)
                    elif g == 106:  # DICT
                        d: Dict[Any, Any] = {}
                        self.setitems(d, items, pos, "DICT")
                        push(d)
                    elif g == 107:  # ADDITEMS
                        target = stack[-1]
                        if type(target) is set:
                            target.update(_safe_key(x) for x in items)
                    elif g == 108:  # FROZENSET
                        push(frozenset(_safe_key(x) for x in items))
                    # 109, POP_MARK: the items are dropped
                elif g == 4:  # TUPLE2
                    b = stack.pop()
                    stack[-1] = (stack[-1], b)
                elif g == 5:  # NEWFALSE
                    push(False)
                elif g == 6:  # REDUCE
                    args = stack.pop()
                    stack[-1] = self.reduce(stack[-1], args, pos)
                elif g == 7:  # EMPTY_TUPLE
                    push(())
                elif g == 8:  # TUPLE1
                    stack[-1] = (stack[-1],)
                elif g == 9:  # BINPERSID
                    stack[-1] = self.persistent_load(stack[-1], pos)
                elif g == 10:  # EMPTY_DICT
                    push({})
                elif g == 11:  # EMPTY_LIST
                    push([])
                elif g == 12:  # NONE
                    push(None)
                elif g == 13:  # NEWTRUE
                    push(True)
                elif g == 14:  # SETITEM
                    if len(stack) < 3:
                        raise IndexError
                    v = stack.pop()
                    k = stack.pop()
                    self.setitems(stack[-1], (k, v), pos, "SETITEM")
                elif g == 15:  # APPEND
                    if len(stack) < 2:
                        raise IndexError
                    v = stack.pop()
                    self.appends(stack[-1], (v,), pos, "APPEND")
                elif g == 16:  # TUPLE3
                    if len(stack) < 3:
                        raise IndexError
                    cc = stack.pop()
                    b = stack.pop()
                    stack[-1] = (stack[-1], b, cc)
                elif g == 17:  # BUILD
                    st = stack.pop()
                    self.build(stack[-1], st, pos)
                elif g == 18:  # MEMOIZE
                    if not stack:
                        raise IndexError
                    i = len(memo)
                    top = stack[-1]
                    old = memo.put(i, top)
                    if old is not EMPTY and old is not top:
                        self.trick(f"memo slot {i} rebound at byte {pos} (MEMOIZE): was "
                                   f"{_short_repr(old)}, now {_short_repr(top)}")
                elif g == 19:  # GLOBAL
                    push(self.line_global(pos, "GLOBAL"))
                elif g == 20:  # STACK_GLOBAL
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
                elif g == 21:  # NEWOBJ
                    args = stack.pop()
                    stack[-1] = self.newobj(stack[-1], args, None, pos, "NEWOBJ")
                elif g == 22:  # NEWOBJ_EX
                    kwargs = stack.pop()
                    args = stack.pop()
                    stack[-1] = self.newobj(stack[-1], args, kwargs, pos, "NEWOBJ_EX")
                elif g == 23:  # STRING / SHORT_BINSTRING / BINSTRING (Python 2 str)
                    push(arg)
                    if type(arg) is str and (arg[:1] == "\x80" or len(arg) >= min_chars):
                        self.maybe_encoded(arg, pos, op.name)
                    elif type(arg) is bytes and (arg[:1] == b"\x80" or len(arg) >= min_chars):
                        self.maybe_encoded(arg, pos, op.name)
                elif g == 24:  # BINBYTES / SHORT_BINBYTES / BINBYTES8
                    push(arg)
                    if arg[:1] == b"\x80" or len(arg) >= min_chars:
                        self.maybe_encoded(arg, pos, op.name)
                elif g == 25:  # BYTEARRAY8
                    push(bytearray(arg))
                    if arg[:1] == b"\x80" or len(arg) >= min_chars:
                        self.maybe_encoded(arg, pos, op.name)
                elif g == 26:  # EMPTY_SET
                    push(set())
                elif g == 27:  # POP
                    if stack:
                        stack.pop()
                    elif metastack:  # pickle.py: popping an empty frame pops the MARK
                        stack = metastack.pop()
                        push = stack.append
                    else:
                        raise IndexError
                elif g == 28:  # DUP
                    push(stack[-1])
                elif g == 29:  # EXT1 / EXT2 / EXT4
                    res.globals.append(GlobalImport("copyreg._extension_registry", str(arg), op.name, pos, False))
                    self.trick(f"{op.name} at byte {pos} imports by extension-registry code {arg} "
                               "(copyreg.add_extension), so the imported name is not in the file")
                    push(GlobalRef("copyreg._extension_registry", str(arg)))
                elif g == 30:  # PROTO
                    if res.protocol is None:
                        res.protocol = arg
                elif g == 31:  # FRAME (protocol 4 framing hint): nothing to do
                    pass
                elif g == 32:  # NEXT_BUFFER (protocol 5 out-of-band data, not in the stream)
                    push(Call("<out-of-band buffer>", ()))
                elif g == 33:  # READONLY_BUFFER
                    if not stack:
                        raise IndexError
                elif g == 34:  # PERSID (protocol 0: the id is a string operand)
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
            stack, metastack, memo = [], [], Memo()  # what was held is dropped before the imports scan
            self.scan_imports(f, strs, n_memo)
        except _WalkError as e:
            res.error = str(e)
        except IndexError:
            res.error = f"stack underflow at byte {pos} ({op.name if op else '?'})"
        except RecursionError:
            res.error = f"structure too deep at byte {pos} ({op.name if op else '?'})"
        except ValueError as e:  # genops (pickletools') could not decode the next opcode
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
