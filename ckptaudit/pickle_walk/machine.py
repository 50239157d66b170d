"""The opcode machine: ``WalkState`` and its loop, which decodes each opcode as :func:`.opcodes.genops` does
(pickletools' ``genops``, decoded from the buffer) and dispatches it to its handler in :mod:`.handlers`.

The handlers are mixin methods (:mod:`.handlers`, :mod:`.hidden`, :mod:`.objects`), so their attribute
lookups are those of one class; the loop looks each opcode's bound handler up in a list built once per walk.
"""

from __future__ import annotations

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
from .handlers import FRAME_HANDLERS, HANDLERS, OpcodeHandlers  # noqa: E402
from .hidden import HiddenPickles  # noqa: E402
from .memo import Memo  # noqa: E402
from .model import GlobalImport, GlobalRef, TensorMeta, WalkResult  # noqa: E402
from .objects import ObjectOps  # noqa: E402
from .opcodes import FIXED_OPERAND, NO_OPERAND, OPCODE_OF_BYTE, UINT1_OPERAND, memo_reads, sized_operand  # noqa: E402
from .reader import BudgetError, raw_line_pair, WalkError  # noqa: E402
from .salvage import fold_unfinished, tensor_paths  # noqa: E402

#: Bytes from a walk's start from which its memo keeps only the slots the stream reads (:func:`.opcodes.memo_reads`,
#: one quick pass over the opcodes first, ~10 % of a walk): below it every object is kept, as the memory is small.
FORGET_UNREAD_FROM_BYTES = 1 << 20
#: The handler names in table order; an opcode's index is its place here, and the frame-changing handlers
#: (after which the loop reloads the current frame) come last, from :data:`_FIRST_FRAME_HANDLER` on.
_NAMES: Tuple[str, ...] = tuple(sorted(set(HANDLERS.values()), key=lambda n: (n in FRAME_HANDLERS, n)))
_FIRST_FRAME_HANDLER = min(i for i, n in enumerate(_NAMES) if n in FRAME_HANDLERS)
#: opcode (pickletools.OpcodeInfo) -> index of its handler in :data:`_NAMES`
_INDEX: Dict[Any, int] = {op: _NAMES.index(HANDLERS[op.name]) for op in pickletools.opcodes}
assert len(_INDEX) == len(pickletools.opcodes), "an opcode has no handler"


class WalkState(OpcodeHandlers, HiddenPickles, ObjectOps):
    """One walk of one pickle stream: the result being filled, its budgets, the machine's frames and memo, and
    the opcode loop (:meth:`run`)."""

    __slots__ = ("res", "data", "persistent", "depth", "max_ops", "max_blocks", "n_tricks_dropped", "tensors_built", "names",
                 "budget", "walker", "stack", "metastack", "memo", "stopped", "min_chars", "shapes",
                 "tensor_paths")

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
        self.shapes: Dict[Tuple[int, ...], Tuple[int, ...]] = {}  # each tensor shape/stride once (objects.py)
        self.stack: List[Any] = []  # the current frame: the items since the last MARK
        self.metastack: List[List[Any]] = []  # the frames below it
        self.memo = Memo()  # a list while torch's pickler fills slots in order (./memo.py)
        self.stopped = False
        self.min_chars = budgets._MIN_ENCODED_CHARS
        self.tensor_paths = True  # False: res.tensors lists the tensors built, unnamed (streams.walk)

    # -- bookkeeping
    def trick(self, text: str) -> None:
        if len(self.res.tricks) < budgets._MAX_TRICKS:
            self.res.tricks.append(text)
        else:
            self.n_tricks_dropped += 1

    def line_global(self, pos: int, opname: str) -> GlobalRef:
        """The module/name operand lines of GLOBAL or INST at ``pos``: listed as an import, checked, and returned."""
        mod, name = raw_line_pair(self.data, pos)
        self.res.globals.append(GlobalImport(mod, name, opname, pos, True))
        self.check_name(mod, name, pos)
        return GlobalRef(mod, name)

    # -- main loop
    def run(self, f: Any, start: int) -> None:
        """Walk the pickle at ``start`` of ``f``, one walk at a time per process (:data:`WALKS`)."""
        with WALKS:
            self._run(f, start)

    def _run(self, f: Any, start: int) -> None:
        res = self.res
        if len(self.data) - start >= FORGET_UNREAD_FROM_BYTES:
            self.memo = Memo(memo_reads(self.data, start))
        n = self._loop(f, start)
        res.n_ops = n
        res.end = f.tell()
        if not res.budget_exhausted:
            res.imports_end = res.end
        if not self.stopped and res.error is None:  # pragma: no cover - genops raises instead
            res.error = f"truncated at byte {res.end}: no STOP opcode"
        try:
            if not self.stopped:
                res.obj = fold_unfinished(self.stack, self.metastack, self)
            res.tensors = tensor_paths(res.obj, self.tensors_built) if self.tensor_paths else \
                [("", t) for t in self.tensors_built]
        except Exception as e:  # pragma: no cover - defensive: the result must still come back
            res.error = res.error or f"cannot describe the result: {type(e).__name__}: {e}"
        if self.n_tricks_dropped:
            res.tricks.append(f"{self.n_tricks_dropped} more trick(s) not listed")

    def _loop(self, f: Any, start: int) -> int:
        """Run the opcodes from ``start`` through their handlers; returns how many ran.  A walk that cannot go
        on leaves its reason in ``res.error`` (and, past a budget, the imports scan of what is left).

        Each opcode is decoded here as :func:`.opcodes.genops` decodes it (a copy of its body, its tables, and its
        ``sized_operand`` for the length-prefixed and the rare operands), not through the generator: on a torch
        data.pkl of 3,100 opcodes (issue 45's small unit) the walk took 2.0 ms with the generator, its per-opcode
        ``seek`` and the ``islice``/``enumerate`` around it, 1.7 ms without. ``f`` is moved only where the walk's
        readers look at it: after the last opcode, before a budget's imports scan, when an operand cannot be decoded
        (where ``genops`` would leave it), and after the opcode whose handler raised."""
        table = [getattr(self, name) for name in _NAMES]  # bound once per walk
        index = _INDEX
        frame_changes = _FIRST_FRAME_HANDLER
        stack = self.stack
        data, size = self.data, len(self.data)
        decode, fixed_of = OPCODE_OF_BYTE, FIXED_OPERAND
        n = 0
        op = None
        pos = q = p = start
        blocks0 = sys.getallocatedblocks()
        max_ops, max_blocks = self.max_ops, self.max_blocks
        check_mask = budgets._CHECK_MASK
        try:
            while n < max_ops:
                if p >= size:
                    f.seek(size)
                    raise ValueError("pickle exhausted before seeing STOP")
                entry = decode[data[p]]
                if entry is None:
                    f.seek(p + 1)
                    raise ValueError("at position %s, opcode %r unknown" % (p, bytes(data[p:p + 1])))
                op, kind = entry
                q = p + 1
                if kind == NO_OPERAND:
                    arg = None
                elif kind == UINT1_OPERAND and q < size:
                    arg = data[q]
                    q += 1
                elif (fixed := fixed_of[kind]) is not None and q + fixed[1] <= size:
                    arg = fixed[0](data, q)[0]
                    q += fixed[1]
                else:
                    arg, q = sized_operand(data, size, q, kind, f)
                n += 1
                pos = p
                if not n & check_mask and sys.getallocatedblocks() - blocks0 > max_blocks:
                    f.seek(q)
                    raise BudgetError(f"gave up after {n} opcodes at byte {pos}: the object tree holds more "
                                      f"than {max_blocks} interpreter objects")
                i = index[op]
                try:
                    table[i](stack, arg, pos, op)
                except BaseException:
                    f.seek(q)
                    raise
                if i >= frame_changes:
                    stack = self.stack
                if op.code == ".":
                    break
                p = q
            f.seek(q)
            if not self.stopped and n >= max_ops:
                raise BudgetError(f"gave up after max_ops={max_ops} opcodes at byte {f.tell()}")
        except BudgetError as e:
            self.res.error = str(e)
            self.res.budget_exhausted = True
            strs = {k: v for k, v in self.memo.items() if type(v) is str}
            n_memo = len(self.memo)
            self.stack, self.metastack, self.memo = [], [], Memo()  # what was held is dropped before the imports scan
            self.scan_imports(f, strs, n_memo)
        except Exception as e:  # noqa: BLE001 - every failure of a hostile pickle becomes the walk's error
            self.res.error = self._error_text(e, f, op, pos)
        return n

    def _error_text(self, e: Exception, f: Any, op: Any, pos: int) -> str:
        """Why the walk stopped at the opcode ``op`` at byte ``pos``, in words."""
        name = op.name if op else "?"
        if isinstance(e, WalkError):
            return str(e)
        if isinstance(e, IndexError):
            return f"stack underflow at byte {pos} ({name})"
        if isinstance(e, RecursionError):
            return f"structure too deep at byte {pos} ({name})"
        if isinstance(e, ValueError):  # genops (pickletools') could not decode the next opcode
            return self.decode_error(e, f)
        return f"cannot interpret {name} at byte {pos}: {type(e).__name__}: {e}"  # operands no handler foresaw
