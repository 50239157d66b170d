"""Pickles of one shape share a walk (ckptaudit.pickle_walk.templates): a result made from a template equals a walk
of the pickle itself — on torch's own checkpoints of one model at several steps, on every change of their literal
numbers hypothesis tries, and on pickles written so that a number is bound (a tensor's size, a computed set, a
shared container, a rebound memo slot), which are walked."""

import dataclasses
import io
import pickle
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptaudit.pickle_walk import walk
from ckptaudit.pickle_walk.templates import WalkTemplates, free_bytes, literal_places

torch = pytest.importorskip("torch")

MAX_OPS = 1 << 20


def canon(o, seen=None):
    """A comparable form of a walk's object: types, values, and which objects are shared."""
    seen = {} if seen is None else seen
    t = type(o)
    if t in (str, bytes, bool, int, type(None)):
        return t.__name__, o
    if t is float:
        return "float", "nan" if o != o else o
    if id(o) in seen:
        return "ref", seen[id(o)]
    seen[id(o)] = len(seen)
    if isinstance(o, dict):
        return (t.__name__, tuple((canon(k, seen), canon(v, seen)) for k, v in o.items()),
                canon(getattr(o, "attrs", None), seen))
    if isinstance(o, (list, tuple)):
        return t.__name__, tuple(canon(x, seen) for x in o)
    if isinstance(o, (set, frozenset)):
        return t.__name__, tuple(sorted(repr(canon(x, seen)) for x in o))
    if dataclasses.is_dataclass(o):
        return t.__name__, tuple(canon(getattr(o, f.name), seen) for f in dataclasses.fields(o))
    return t.__name__, repr(o)


def same_walk(a, b) -> bool:
    keys = ("error", "end", "n_ops", "protocol", "budget_exhausted", "imports_end", "imports_complete", "tricks")
    return (canon((a.obj, a.globals, a.storages, a.tensors)) == canon((b.obj, b.globals, b.storages, b.tensors))
            and all(getattr(a, k) == getattr(b, k) for k in keys) and len(a.nested) == len(b.nested))


def _data_pkl(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    z = zipfile.ZipFile(buf)
    return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def _checkpoint(step: int) -> bytes:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        sched.step()
    return _data_pkl({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                      "step": step, "loss": 1.0 / step, "rng": torch.random.get_rng_state()})


@pytest.fixture(scope="module")
def steps():
    return [_checkpoint(s) for s in (300, 400, 500, 600)]  # one BININT2 width: one shape


def test_checkpoints_of_one_model_share_a_walk_and_each_result_is_its_own(steps):
    t = WalkTemplates()
    got = [t.walk(p, MAX_OPS) for p in steps]
    assert (t.walks, t.hits) == (1, 3)
    for p, r in zip(steps, got):
        assert same_walk(r, walk(p, max_ops=MAX_OPS))
    assert [r.obj["step"] for r in got] == [300, 400, 500, 600]  # each its own step, not the template's
    assert len({id(r.obj) for r in got}) == 4


def test_results_from_a_template_are_the_callers_to_change(steps):
    t = WalkTemplates()
    first = t.walk(steps[0], MAX_OPS)
    first.tensors.clear()  # as the scan does once the tensors are columns
    again = t.walk(steps[1], MAX_OPS)
    assert again.tensors and same_walk(again, walk(steps[1], max_ops=MAX_OPS))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_change_of_literal_numbers_walks_as_the_pickle_itself(steps, data):
    base = steps[0]
    owner = free_bytes(base)
    ops = sorted(set(owner[owner >= 0].tolist()))
    chosen = data.draw(st.lists(st.sampled_from(ops), min_size=1, max_size=4, unique=True))
    raw = bytearray(base)
    for pos in chosen:
        width = int((owner == pos).sum())
        raw[pos + 1:pos + 1 + width] = data.draw(st.binary(min_size=width, max_size=width))
    t = WalkTemplates()
    t.walk(base, MAX_OPS)
    assert same_walk(t.walk(bytes(raw), MAX_OPS), walk(bytes(raw), max_ops=MAX_OPS))


def test_a_tensor_size_is_bound_and_its_change_is_walked():
    a = _data_pkl({"w": torch.zeros(4, 4)})
    b = _data_pkl({"w": torch.zeros(2, 8)})  # same length: the sizes' BININT1 operands differ
    assert len(a) == len(b)
    t = WalkTemplates()
    t.walk(a, MAX_OPS)
    rb = t.walk(b, MAX_OPS)
    assert (t.walks, t.hits) == (2, 0)
    assert rb.tensors[0][1].shape == (2, 8)


def _set_of_two(x: int, y: int) -> bytes:
    """``builtins.set([x, y])`` in a dict, protocol 2 (the walk computes a set of literals)."""
    return (b"\x80\x02}q\x00X\x01\x00\x00\x00sq\x01cbuiltins\nset\nq\x02]q\x03(K" + bytes([x]) + b"K" + bytes([y])
            + b"e\x85q\x04Rq\x05s.")


def test_a_number_the_walk_computes_with_is_bound():
    a, b = _set_of_two(1, 1), _set_of_two(1, 2)
    assert literal_places(a, MAX_OPS) == {}  # both numbers reach a call
    t = WalkTemplates()
    t.walk(a, MAX_OPS)
    rb = t.walk(b, MAX_OPS)
    assert t.hits == 0 and same_walk(rb, walk(b, max_ops=MAX_OPS))


def test_a_number_in_a_shared_container_is_bound():
    shared = [7]
    data = pickle.dumps({"a": shared, "b": shared, "c": 9}, protocol=2)  # the list's second use is a memo GET
    places = literal_places(data, MAX_OPS)
    assert sorted(places.values()) == [("c",)]
    changed = bytearray(data)
    changed[data.index(b"K\x07") + 1] = 8
    t = WalkTemplates()
    t.walk(data, MAX_OPS)
    r = t.walk(bytes(changed), MAX_OPS)
    assert t.hits == 0 and r.obj["a"] == [8] and r.obj["b"] is r.obj["a"]


@pytest.mark.parametrize("shared", [b"", b"\x85"], ids=["int", "tuple"])
def test_a_number_shared_by_a_key_and_a_value_is_bound(shared):
    """One memoized number (or 1-tuple) is a dict key and, by a memo GET, a value: changing it can merge two
    keys, so it is bound (found by an adversarial review: the key's tag was lost to safe_key)."""
    def pkl(k):  # {k: "a", 1: "b", "v": k}
        return (b"\x80\x02}q\x00(K" + bytes([k]) + shared + b"q\x01X\x01\x00\x00\x00aK\x01"
                b"X\x01\x00\x00\x00bX\x01\x00\x00\x00vh\x01u.")

    assert literal_places(pkl(2), MAX_OPS) == {}
    t = WalkTemplates()
    t.walk(pkl(2), MAX_OPS)
    r = t.walk(pkl(1), MAX_OPS)
    assert t.hits == 0 and same_walk(r, walk(pkl(1), max_ops=MAX_OPS))


def test_a_pickle_that_binds_a_memo_slot_twice_is_no_template():
    data = b"\x80\x02]q\x00(K\x01q\x01K\x02q\x01e."  # BINPUT 1 twice
    assert free_bytes(data) is None
    t = WalkTemplates()
    t.walk(data, MAX_OPS)
    t.walk(data, MAX_OPS)
    assert (t.walks, t.hits) == (2, 0)


def test_free_bytes_mark_each_literal_numbers_operand_with_its_opcode():
    data = pickle.dumps({"step": 70000, "small": 7, "mid": 300, "loss": 0.5}, protocol=2)
    owner = free_bytes(data)
    got = bytes(np.frombuffer(data, np.uint8)[owner >= 0])
    assert got == struct.pack("<i", 70000) + bytes([7]) + struct.pack("<H", 300) + struct.pack(">d", 0.5)
    for pos in set(owner[owner >= 0].tolist()):
        assert data[pos:pos + 1] in (b"J", b"K", b"M", b"G")
    assert free_bytes(data[:-1]) is None  # no STOP


def test_a_pickle_of_one_number_and_a_key_named_like_a_tag_walk_as_themselves():
    """From a second review: a pickle that is one number (the root has no container to patch), and a str key
    spelled as safe_key's stand-in for a tagged int key (the tagging walk must set keys as the plain walk does)."""
    def keyed(a):  # {"<key <_TagInt>>": [7], 5: [a]}
        return (b"\x80\x02}q\x00(X\x0f\x00\x00\x00<key <_TagInt>>]q\x01K\x07aK\x05]q\x02K" + bytes([a]) + b"au.")

    for first, second in ((pickle.dumps(300, protocol=2), pickle.dumps(400, protocol=2)), (keyed(7), keyed(9))):
        t = WalkTemplates()
        t.walk(first, MAX_OPS)
        assert same_walk(t.walk(second, MAX_OPS), walk(second, max_ops=MAX_OPS))


@pytest.mark.parametrize("how", ["FROZENSET", "REDUCE"])
def test_a_number_in_a_set_key_is_set_untagged(how):
    """From a third review: {frozenset({"<key <_TagInt>>"}): [7], frozenset({5}): [y]} — a set's members become
    keys (safe_key) before the dict sees them, so the tagging walk must build the set from plain numbers too."""
    stand_in = b"X\x0f\x00\x00\x00<key <_TagInt>>"

    def pkl(y):
        if how == "FROZENSET":
            k1, k2 = b"(" + stand_in + b"\x91", b"(K\x05\x91"
        else:
            k1, k2 = b"cbuiltins\nfrozenset\nq\x00(" + stand_in + b"l\x85R", b"h\x00(K\x05l\x85R"
        return b"\x80\x02}(" + k1 + b"]K\x07a" + k2 + b"]K" + bytes([y]) + b"au."

    t = WalkTemplates()
    t.walk(pkl(7), MAX_OPS)
    assert same_walk(t.walk(pkl(9), MAX_OPS), walk(pkl(9), max_ops=MAX_OPS))


@pytest.mark.parametrize("case", ["frozenset of list args", "storage keys 5 and '5'"])
def test_keys_the_plain_walk_merges_keep_no_number_loose(case):
    """From a fourth review: keys equal in the plain walk and apart in the tagging walk (a REDUCE of frozenset
    with list args; storages keyed "5" and 5, one storage for the walk): a path must name the same entry in both
    trees, container by container, for its number to be loose."""
    def pid(key_op):
        return b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\n" + key_op + b"X\x03\x00\x00\x00cpuK\x04tQ"

    def pkl(a):
        if case.startswith("frozenset"):
            k1, k2 = b"(K\x05\x91", b"cbuiltins\nfrozenset\n]]K\x05aaR"
        else:
            k1, k2 = pid(b"X\x01\x00\x00\x005"), pid(b"K\x05")
        return b"\x80\x02}(" + k1 + b"]K" + bytes([a]) + b"a" + k2 + b"]K\x07au."

    t = WalkTemplates()
    t.walk(pkl(7), MAX_OPS)
    assert same_walk(t.walk(pkl(9), MAX_OPS), walk(pkl(9), max_ops=MAX_OPS))


def test_a_template_serves_only_the_budget_it_was_walked_with():
    """From a fifth review: a nested pickle's walk gets the outer walk's budget, so a template walked at a small
    max_ops (nested walk cut short: no nested pickle, no trick) must not answer for a larger one."""
    inner = b"\x80\x02cbuiltins\nlist\n)R" + b"N0" * 1500 + b"."  # ~3,000 opcodes

    def outer(n):
        return (b"\x80\x02}(X\x01\x00\x00\x00pB" + struct.pack("<I", len(inner)) + inner
                + b"X\x01\x00\x00\x00sK" + bytes([n]) + b"u.")

    t = WalkTemplates()
    t.walk(outer(5), 1000)
    got = t.walk(outer(9), 1 << 20)
    assert same_walk(got, walk(outer(9), max_ops=1 << 20)) and got.nested
