"""The walk's opcode loop decodes in place (ckptaudit/pickle_walk/machine.py, ``WalkState._loop``): its results
equal those of the loop it replaced, which took each opcode from ``opcodes.genops`` (shown equal to
``pickletools.genops`` in tests/test_pickle_walk.py), on every input: real torch pickles cut at any byte or with
bytes flipped, random opcode streams, budgets run out, hostile imports."""

from __future__ import annotations

import itertools
import pickletools
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptaudit.pickle_walk import budgets, walk
from ckptaudit.pickle_walk.machine import _FIRST_FRAME_HANDLER, _INDEX, _NAMES, WalkState
from ckptaudit.pickle_walk.memo import Memo
from ckptaudit.pickle_walk.opcodes import genops
from ckptaudit.pickle_walk.reader import BudgetError

CASES = Path(__file__).resolve().parent.parent.parent / "shared" / "cases"
_OPCODE_BYTES = [op.code.encode("latin-1") for op in pickletools.opcodes]


def _genops_loop(self, f, start):
    """The loop before: ``genops`` in ``islice``/``enumerate``, ``f`` moved by the generator at every opcode."""
    table = [getattr(self, name) for name in _NAMES]
    stack = self.stack
    n, op, pos = 0, None, start
    blocks0 = sys.getallocatedblocks()
    try:
        for n, (op, arg, pos) in enumerate(itertools.islice(genops(self.data, f), self.max_ops), 1):
            if not n & budgets._CHECK_MASK and sys.getallocatedblocks() - blocks0 > self.max_blocks:
                raise BudgetError(f"gave up after {n} opcodes at byte {pos}: the object tree holds more "
                                  f"than {self.max_blocks} interpreter objects")
            i = _INDEX[op]
            table[i](stack, arg, pos, op)
            if i >= _FIRST_FRAME_HANDLER:
                stack = self.stack
        if not self.stopped and n >= self.max_ops:
            raise BudgetError(f"gave up after max_ops={self.max_ops} opcodes at byte {f.tell()}")
    except BudgetError as e:
        self.res.error = str(e)
        self.res.budget_exhausted = True
        strs = {k: v for k, v in self.memo.items() if type(v) is str}
        n_memo = len(self.memo)
        self.stack, self.metastack, self.memo = [], [], Memo()
        self.scan_imports(f, strs, n_memo)
    except Exception as e:  # noqa: BLE001
        self.res.error = self._error_text(e, f, op, pos)
    return n


def _facts(r):
    return (r.error, r.end, r.n_ops, r.protocol, r.budget_exhausted, r.imports_end, r.imports_complete,
            [(g.module, g.name, g.opcode, g.pos) for g in r.all_globals()], list(r.tricks),
            [(name, t.dtype, tuple(t.shape), t.storage.key, t.storage_offset) for name, t in r.tensors],
            sorted(r.storages), repr(r.obj)[:20000], [_facts(s) for s in r.nested])


def _same(data: bytes, **kw) -> None:
    now = walk(data, **kw)
    loop = WalkState._loop
    WalkState._loop = _genops_loop
    try:
        before = walk(data, **kw)
    finally:
        WalkState._loop = loop
    assert _facts(now) == _facts(before)


def _torch_pkl() -> bytes:
    with zipfile.ZipFile(CASES / "ok_full_torch" / "ckpt.pt") as z:
        return z.read("ckpt/data.pkl")


def test_the_oracle_is_the_loop_before():
    """The reference loop is not the loop in use (else every comparison here would hold trivially)."""
    assert WalkState._loop is not _genops_loop and "genops" not in WalkState._loop.__code__.co_names


@pytest.mark.parametrize("cut", [0, 1, 2, 3, 100, 5000, 13984, None])
def test_a_cut_torch_pickle_walks_as_before(cut):
    data = _torch_pkl()
    _same(data if cut is None else data[:cut])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, 13985), flips=st.lists(st.tuples(st.integers(0, 13984), st.integers(0, 255)), max_size=8))
def test_a_cut_or_flipped_torch_pickle_walks_as_before(cut, flips):
    data = bytearray(_torch_pkl())
    for i, b in flips:
        if i < len(data):
            data[i] = b
    _same(bytes(data[:cut]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_OPCODE_BYTES), st.binary(max_size=9)), max_size=300))
def test_random_opcode_streams_walk_as_before(parts):
    _same(b"\x80\x04" + b"".join(a + b for a, b in parts))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_walk_as_before(data):
    _same(data)


@pytest.mark.parametrize("max_ops", [1, 2, 50, 1000])
def test_an_opcode_budget_run_out_walks_as_before(max_ops):
    _same(_torch_pkl(), max_ops=max_ops)


def test_hidden_imports_behind_a_budget_walk_as_before():
    import pickle

    payload = pickle.dumps([list(range(300)), {"k": "v" * 50}], protocol=4)[:-1]  # no STOP: glue another on
    evil = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R."
    _same(payload[:-0] + b"0" + evil, max_ops=40)
    _same(b"\x80\x02" + b"K\x01" * 5000 + b"cos\nsystem\n(S'id'\ntR.", max_ops=100)
