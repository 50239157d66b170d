"""The walk's opcode stream (ckptaudit/pickle_walk/opcodes.py) is pickletools.genops, exactly.

Compared on every opcode pickletools knows (each with an operand it can hold), on real pickles of every
protocol, on each of them cut at every byte, with a byte flipped, and on random bytes: the same triples, the
same error (type and message), and the file at the same offset after each triple and after the error.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
from collections import OrderedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptaudit.pickle_walk.opcodes import genops
from ckptaudit.pickle_walk.reader import MVReader


def _trace(it, f, limit=10_000):
    out = []
    try:
        for i, (op, arg, pos) in enumerate(it):
            out.append((op.name, type(arg).__name__, arg, pos, f.tell()))
            if i >= limit:
                break
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        out.append(("raised", type(e).__name__, str(e), None, f.tell()))
    return out


def _same(data: bytes, start: int = 0) -> None:
    ref_f = io.BytesIO(data)
    ref_f.seek(start)
    ref = _trace(pickletools.genops(ref_f), ref_f)
    for f, buf in ((io.BytesIO(data), data), (MVReader(memoryview(data), start), None)):
        if buf is None:
            buf = f.mv
        f.seek(start)
        got = _trace(genops(buf, f), f)
        assert got == ref, (type(f).__name__, data[:80])


# one operand of each kind, spelled by hand so every opcode appears (pickle.dumps never writes some)
_U8 = struct.pack("<Q", 3)
EVERY_OPCODE = [
    b"(", b".", b"0", b"1", b"2", b"t", b")", b"l", b"]", b"d", b"}", b"a", b"e", b"s", b"u", b"R", b"b", b"o",
    b"N", b"\x88", b"\x89", b"\x81", b"\x92", b"\x85", b"\x86", b"\x87", b"\x8f", b"\x90", b"\x91", b"\x93",
    b"\x94", b"Q", b"\x97", b"\x98",
    b"K\x07", b"M\x01\x02", b"J\xff\xff\xff\xff", b"I12\n", b"I01\n", b"L12L\n", b"\x8a\x02\xff\x7f",
    b"\x8b\x01\x00\x00\x00\x05", b"F1.5\n", b"G?\xf8\x00\x00\x00\x00\x00\x00",
    b"S'ab'\n", b"T\x02\x00\x00\x00ab", b"U\x02ab", b"B\x02\x00\x00\x00ab", b"C\x02ab", b"\x8e" + _U8 + b"abc",
    b"\x96" + _U8 + b"abc", b"Vab\n", b"X\x02\x00\x00\x00\xc3\xa9", b"\x8c\x02ab", b"\x8d" + _U8 + b"abc",
    b"g1\n", b"h\x01", b"j\x01\x00\x00\x00", b"p1\n", b"q\x01", b"r\x01\x00\x00\x00", b"\x80\x05",
    b"\x95" + _U8, b"cos\nsystem\n", b"iBuiltins\nstr\n", b"Pid\n", b"\x82\x01", b"\x83\x01\x02",
    b"\x84\x01\x00\x00\x00",
    # operands the fast path must hand to pickletools' reader: bad UTF-8, a lone surrogate, a negative
    # string4 length, a length past the end
    b"\x8c\x01\xff", b"X\x03\x00\x00\x00\xed\xa0\x80", b"T\xff\xff\xff\xff", b"B\xff\xff\xff\x7f",
    b"\x8e" + struct.pack("<Q", 1 << 62), b"\x96\xff", b"G\x00",
]


def test_every_opcode_is_known_to_the_table():
    codes = {op.code for op in pickletools.opcodes}
    assert {bytes(x[:1]).decode("latin-1") for x in EVERY_OPCODE} == codes


@pytest.mark.parametrize("chunk", EVERY_OPCODE + [b"\x99", b"\xff"], ids=lambda c: repr(c[:1]))  # + unknowns
def test_each_opcode_whole_and_cut_at_every_byte(chunk):
    data = chunk + b"."
    for end in range(len(data) + 1):
        _same(data[:end])


REAL = [pickle.dumps(obj, protocol=proto)
        for proto in range(6)
        for obj in ({"a": 1, "b": [1.5, -2, 2 ** 70, "é\u2603", b"\x00\xff", None, True]},
                    OrderedDict(w=(1, 2, 3)), [bytearray(b"xy")] * 3, "x" * 300, b"y" * 70000,
                    list(range(300)), -(2 ** 40))]


@pytest.mark.parametrize("i", range(len(REAL)))
def test_real_pickles_cut_and_flipped(i):
    data = REAL[i]
    _same(data)
    for end in range(0, len(data), max(1, len(data) // 64)):
        _same(data[:end])
    for at in range(0, len(data), max(1, len(data) // 64)):
        _same(data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1:])
    _same(data + data, start=len(data))  # a second stream, from its own start


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.integers(0, 5))
def test_random_bytes(blob, start):
    _same(b"\x80\x04" + blob, start=min(start, len(blob)))
