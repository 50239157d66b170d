"""Tests for ckptaudit.pickle_walk: the static pickle interpreter never unpickles what it reads."""

from __future__ import annotations

import pickle
import pickletools
import struct
import sys
import tempfile
import time
import zipfile
from collections import OrderedDict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptaudit.pickle_walk import (
    AttrDict,
    Call,
    GlobalImport,
    GlobalRef,
    Instance,
    PersistentRef,
    StorageRef,
    WalkResult,
    dtype_of_storage_type,
    walk,
)

CASES = Path("/work/shared/cases")
MARKER = "CKPTAUDIT_PAYLOAD_RAN"


def _read_member(case: str, member: str, file: str = "ckpt.pt") -> bytes:
    with zipfile.ZipFile(CASES / case / file) as z:
        return z.read(member)


@pytest.fixture(scope="module")
def ok_pkl() -> bytes:
    return _read_member("ok_full_torch", "ckpt/data.pkl")


@pytest.fixture(autouse=True)
def _payload_never_runs(tmp_path):
    """Guards against any code path that would unpickle a malicious case (its payload touches MARKER)."""
    yield
    for d in (Path.cwd(), Path(tempfile.gettempdir()), tmp_path, *CASES.iterdir()):
        assert not (d / MARKER).exists(), f"{d / MARKER} exists: a payload ran"


# ------------------------------------------------------------------ real torch checkpoints


def test_ok_full_torch_describes_every_tensor(ok_pkl):
    r = walk(ok_pkl)
    assert r.error is None
    assert r.end == len(ok_pkl) == 13985
    assert r.tricks == [] and r.nested == []
    assert r.protocol == 2
    assert [str(g) for g in r.globals] == [
        "collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch.FloatStorage", "torch.ByteStorage"]
    assert r.globals[0] == GlobalImport("collections", "OrderedDict", "GLOBAL", 54, True)

    paths = dict(r.tensors)
    assert len(r.tensors) == 114 and len(r.storages) == 113  # lm_head.weight is tied to wte.weight
    wte = paths["model.wte.weight"]
    assert (wte.shape, wte.stride, wte.dtype, wte.storage_offset) == ((64, 32), (32, 1), "float32", 0)
    assert wte.storage == StorageRef("0", "float32", "cpu", 2048, 4)
    assert (wte.numel, wte.nbytes, wte.storage.nbytes) == (2048, 8192, 8192)
    assert paths["model.lm_head.weight"].storage is wte.storage  # tied weights share storage '0'
    assert [p for p, _ in r.tensors[:3]] == ["model.wte.weight", "model.wpe.weight", "model.h.0.ln1.weight"]
    step = paths["optimizer.state.0.step"]
    assert (step.shape, step.stride, step.dtype, step.numel) == ((), (), "float32", 1)
    assert paths["optimizer.state.0.exp_avg"].shape == (64, 32)
    assert paths["optimizer.state.27.exp_avg_sq"].shape == (32,)
    assert paths["rng.torch"].dtype == "uint8" and paths["rng.torch"].shape == (5056,)

    obj = r.obj
    assert list(obj) == ["format", "model", "optimizer", "scheduler", "step", "epoch", "rng", "config",
                         "world_size", "torch_version"]
    assert obj["step"] == 6
    assert obj["scheduler"]["last_epoch"] == 6
    assert obj["scheduler"]["base_lrs"] == [0.003]
    assert obj["config"] == {"vocab": 64, "ctx": 16, "d": 32, "n_layer": 2, "n_head": 2}
    assert obj["torch_version"] == "2.13.0+cpu"
    assert obj["optimizer"]["param_groups"][0]["params"] == list(range(28))
    model = obj["model"]
    assert isinstance(model, AttrDict) and len(model) == 29
    assert model.attrs["_metadata"][""] == {"version": 1}


def test_storage_sizes_match_zip_records():
    """numel * itemsize of every persistent id equals the size of its data/<key> record."""
    with zipfile.ZipFile(CASES / "ok_full_torch" / "ckpt.pt") as z:
        r = walk(z.read("ckpt/data.pkl"))
        sizes = {i.filename: i.file_size for i in z.infolist()}
    for key, s in r.storages.items():
        assert s.nbytes == sizes[f"ckpt/data/{key}"], key


def test_zip_format_dtypes_parameters_views_and_subclass_state(tmp_path):
    torch = pytest.importorskip("torch")
    base = torch.arange(10, dtype=torch.float32)
    t_attr = torch.ones(2)
    t_attr.note = "hi"  # tensors with Python state go through _rebuild_from_type_v2
    obj = {
        "p": torch.nn.Parameter(torch.ones(3, 2)),
        "frozen": torch.nn.Parameter(torch.ones(1), requires_grad=False),
        "bf": torch.zeros(5, dtype=torch.bfloat16),
        "f8": torch.zeros(4, dtype=torch.float8_e4m3fn),  # _rebuild_tensor_v3 over an UntypedStorage
        "u16": torch.zeros(3, dtype=torch.uint16),
        "c64": torch.zeros(2, dtype=torch.complex64),
        "b": torch.zeros(2, dtype=torch.bool),
        "view": base[2:5],
        "base": base,
        "attr": t_attr,
        "grad": torch.ones(2, requires_grad=True),
    }
    path = tmp_path / "x.pt"
    torch.save(obj, path)
    with zipfile.ZipFile(path) as z:
        data = z.read("x/data.pkl")
        sizes = {i.filename: i.file_size for i in z.infolist()}
    r = walk(data)
    assert r.error is None and r.tricks == []
    t = dict(r.tensors)
    assert (t["p"].is_parameter, t["p"].requires_grad, t["p"].shape, t["p"].dtype) == (True, True, (3, 2), "float32")
    assert (t["frozen"].is_parameter, t["frozen"].requires_grad) == (True, False)
    assert (t["bf"].dtype, t["bf"].storage.itemsize, t["bf"].nbytes) == ("bfloat16", 2, 10)
    assert (t["f8"].dtype, t["f8"].storage.dtype, t["f8"].storage.numel, t["f8"].nbytes) == \
        ("float8_e4m3fn", "uint8", 4, 4)
    assert (t["u16"].dtype, t["u16"].nbytes) == ("uint16", 6)
    assert (t["c64"].dtype, t["c64"].nbytes) == ("complex64", 16)
    assert t["b"].dtype == "bool"
    assert (t["view"].storage_offset, t["view"].shape, t["view"].storage.numel) == (2, (3,), 10)
    assert t["view"].storage is t["base"].storage
    assert (t["attr"].shape, t["attr"].dtype) == ((2,), "float32")
    assert t["grad"].requires_grad is True and t["grad"].is_parameter is False
    for key, s in r.storages.items():
        assert s.nbytes == sizes[f"x/data/{key}"], key
    assert list(t) == list(obj)


def test_legacy_format_walks_pickles_in_sequence(tmp_path):
    """A pre-1.6 file is five pickles back to back, then raw storages (torch/serialization.py _legacy_save)."""
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 2)
    obj = {"model": lin.state_dict(), "p": torch.nn.Parameter(torch.ones(2)),
           "f8": torch.zeros(4, dtype=torch.float8_e4m3fn), "view": torch.arange(6.0)[1:4], "step": 7}
    path = tmp_path / "legacy.pt"
    torch.save(obj, path, _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    results = []
    off = 0
    for _ in range(5):
        r = walk(data, off)
        assert r.error is None, r.error
        results.append(r)
        off = r.end
    magic, proto, sys_info, main, keys = results
    assert magic.obj == 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER
    assert proto.obj == 1001  # PROTOCOL_VERSION
    assert sys_info.obj["little_endian"] is True
    assert keys.obj == sorted(main.storages)  # _legacy_save writes the keys sorted
    t = dict(main.tensors)
    assert [p for p, _ in main.tensors] == ["model.weight", "model.bias", "p", "f8", "view"]
    assert t["model.weight"].shape == (2, 3) and t["model.weight"].storage.numel == 6
    assert t["p"].is_parameter and t["p"].requires_grad
    assert (t["f8"].dtype, t["f8"].storage.dtype) == ("float8_e4m3fn", "uint8")
    assert (t["view"].storage_offset, t["view"].storage.numel) == (1, 6)
    assert main.obj["step"] == 7
    # each storage is an 8-byte element count then numel * itemsize bytes
    pos = off
    for key in keys.obj:
        s = main.storages[key]
        assert struct.unpack("<q", data[pos:pos + 8])[0] == s.numel
        pos += 8 + s.numel * s.itemsize
    assert pos == len(data)
    # the walk must not have touched anything past the fifth pickle
    assert walk(data, off).error.startswith("unknown opcode") or walk(data, off).error.startswith("truncated")


def test_legacy_truncated_case_predicts_original_size():
    """legacy_format_truncated: the pickles survive; the storages say the file was 116172 bytes."""
    data = (CASES / "legacy_format_truncated" / "model_legacy.pt").read_bytes()
    off, rs = 0, []
    for _ in range(5):
        r = walk(data, off)
        assert r.error is None
        rs.append(r)
        off = r.end
    main, keys = rs[3], rs[4]
    assert off == 3820
    assert keys.obj == sorted(main.storages)
    assert len(main.tensors) == 29 and main.tensors[0][0] == "wte.weight"
    expected = off + sum(8 + s.numel * s.itemsize for s in main.storages.values())
    assert expected == 116172 and len(data) == 58086


def test_truncated_data_pkl_keeps_what_was_built(ok_pkl):
    r = walk(ok_pkl[:7000])
    assert r.error == "truncated at byte 7000: no STOP opcode"
    assert r.end == 7000
    assert r.tensors[0][0] == "model.wte.weight"
    # pending SETITEMS frames are folded in: 29 model tensors, then optimizer state up to parameter 17
    assert len(r.tensors) == 83
    assert r.tensors[-1][0] == "optimizer.state.17.exp_avg_sq"
    assert list(r.obj) == ["format", "model", "optimizer"]


# ------------------------------------------------------------------ plain pickles, all protocols


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


class WithKw:
    def __init__(self, a, *, k):
        self.a, self.k = a, k

    def __getnewargs_ex__(self):
        return (self.a,), {"k": self.k}


DATA = {
    "a": 1, "b": [1, 2.5, None, True, False], "c": ("x", b"\x00\xffbytes", bytearray(b"ba")),
    "big": 2 ** 100, "neg": -(2 ** 70), "s": {1, 2}, "fs": frozenset({"q"}), "u": "\u00fcn\u00efc\u00f6de",
    "nested": {"k": {"k2": [()]}}, 1: "intkey", (1, 2): "tuplekey", "cx": 1 + 2j, "sl": slice(1, 5, 2),
    "od": OrderedDict(a=1), "empty": {}, "f": -0.125,
}


@pytest.mark.parametrize("proto", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_round_trips_symbolically(proto):
    blob = pickle.dumps(DATA, protocol=proto)
    r = walk(blob)
    assert r.error is None
    assert r.obj == DATA
    assert r.end == len(blob)
    assert r.tricks == []
    assert all(g.literal for g in r.globals)


@pytest.mark.parametrize("proto", range(0, pickle.HIGHEST_PROTOCOL + 1))
def test_class_instances_stay_symbolic(proto):
    r = walk(pickle.dumps(Point(1, 2), protocol=proto))
    assert r.error is None
    mod = Point.__module__
    if proto < 2:  # copyreg._reconstructor(cls, object, None) then BUILD
        assert type(r.obj) is Call
        assert r.obj.func == GlobalRef("copy_reg", "_reconstructor")
        assert r.obj.args[0] == GlobalRef(mod, "Point")
    else:  # NEWOBJ of the class then BUILD
        assert type(r.obj) is Instance
        assert r.obj.cls == GlobalRef(mod, "Point") and r.obj.args == ()
    assert r.obj.state == {"x": 1, "y": 2}


def test_newobj_ex_appends_kwargs():
    r = walk(pickle.dumps(WithKw(1, k=2), protocol=4))
    assert r.error is None
    assert r.obj.args == (1, {"k": 2})
    assert [g.opcode for g in r.globals] == ["STACK_GLOBAL"]


def test_ordered_dict_build_state_goes_to_attrs():
    od = OrderedDict(a=1)
    od.extra = "x"
    r = walk(pickle.dumps(od, protocol=2))
    assert r.obj == {"a": 1} and r.obj.attrs == {"extra": "x"}


def test_memoryview_and_start_offset():
    blob = pickle.dumps({"k": [1, 2]}, protocol=2)
    buf = b"JUNK" + blob + b"TAIL"
    for data in (buf, memoryview(buf), memoryview(bytearray(buf)), memoryview(buf)[0:]):
        r = walk(data, start=4)
        assert (r.obj, r.end, r.error) == ({"k": [1, 2]}, 4 + len(blob), None)


def test_persistent_raw_mode(ok_pkl):
    r = walk(ok_pkl, persistent="raw")
    assert r.error is None and r.tensors == [] and r.storages == {}
    call = r.obj["model"]["wte.weight"]
    assert type(call) is Call and type(call.args[0]) is PersistentRef
    assert call.args[0].pid[:3] == ("storage", GlobalRef("torch", "FloatStorage"), "0")


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("blob, error", [
    (b"", "truncated at byte 0: no STOP opcode"),
    (b"\x80\x02}q\x00(X\x01\x00\x00", "truncated at byte 10: no STOP opcode"),
    (b"\x80\x02\x85.", "stack underflow at byte 2 (TUPLE1)"),
    (b"\x80\x02R.", "stack underflow at byte 2 (REDUCE)"),
    (b"\x80\x02t.", "no MARK for TUPLE at byte 2"),
    (b"\x80\x02\xff.", "unknown opcode 0xff at byte 2"),
    (b"\x80\x02h\x05.", "memo key 5 not defined at byte 2 (BINGET)"),
    (b"\x80\x02(.", "STOP at byte 3 inside an unclosed MARK"),
    (b"\x80\x02.", "stack underflow at byte 2 (STOP)"),
])
def test_bad_input_sets_error(blob, error):
    r = walk(blob)
    assert r.error == error


def test_start_outside_buffer_is_an_error():
    assert walk(b"\x80\x02N.", start=-1).error == "start offset -1 is outside the 4-byte buffer"
    assert walk(b"\x80\x02N.", start=5).error == "start offset 5 is outside the 4-byte buffer"
    assert walk(b"\x80\x02N.", start=4).error == "truncated at byte 4: no STOP opcode"


def test_max_ops_bounds_the_walk(ok_pkl):
    r = walk(ok_pkl, max_ops=10)
    assert r.error == "gave up after max_ops=10 opcodes at byte 54"
    assert r.n_ops == 10


# ------------------------------------------------------------------ obfuscation tricks

def _u(s: str) -> bytes:  # SHORT_BINUNICODE
    b = s.encode()
    return b"\x8c" + bytes([len(b)]) + b


def _bu(s: str) -> bytes:  # BINUNICODE
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


MALICIOUS = b"\x80\x04" + _u("posix") + _u("system") + b"\x93" + _u("touch " + MARKER) + b"\x85R."


def test_computed_stack_global_is_a_trick():
    # module name = str("os"): an expression, not a literal string in the stream
    blob = b"\x80\x04cbuiltins\nstr\n" + _u("os") + b"\x85R" + _u("system") + b"\x93" + _u("id") + b"\x85R."
    r = walk(blob)
    assert r.error is None
    assert r.globals[1] == GlobalImport("<builtins.str instance>", "'system'", "STACK_GLOBAL", 30, False)
    assert r.tricks == [
        "STACK_GLOBAL at byte 30 imports a computed name (module <builtins.str instance>, name 'system'), "
        "hiding what it imports"]


def test_memo_rebinding_is_a_trick():
    blob = b"\x80\x02" + _bu("a") + b"q\x000" + _bu("b") + b"q\x00h\x00."
    r = walk(blob)
    assert r.obj == "b"
    assert r.tricks == ["memo slot 0 rebound at byte 17 (BINPUT): was 'a', now 'b'"]


def test_calling_a_computed_value_is_a_trick():
    # getattr(__import__('os'), 'system')('id')
    blob = (b"\x80\x02cbuiltins\ngetattr\ncbuiltins\n__import__\n" + _bu("os") + b"\x85R"
            + _bu("system") + b"\x86R" + _bu("id") + b"\x85R.")
    r = walk(blob)
    assert r.error is None
    assert [str(g) for g in r.globals] == ["builtins.getattr", "builtins.__import__"]
    assert r.tricks == ["REDUCE at byte 71 calls a computed value (builtins.getattr(...)), not a named import"]
    assert type(r.obj) is Call and type(r.obj.func) is Call and r.obj.args == ("id",)


@pytest.mark.parametrize("wrap", ["SHORT_BINBYTES", "BINBYTES", "BYTEARRAY8", "_codecs"])
def test_nested_pickle_in_bytes_is_walked(wrap):
    inner = MALICIOUS
    if wrap == "SHORT_BINBYTES":
        blob = b"\x80\x03C" + bytes([len(inner)]) + inner + b"."
        pos = 2
    elif wrap == "BINBYTES":
        blob = b"\x80\x03B" + struct.pack("<I", len(inner)) + inner + b"."
        pos = 2
    elif wrap == "BYTEARRAY8":
        blob = b"\x80\x05\x96" + struct.pack("<Q", len(inner)) + inner + b"."
        pos = 2
    else:  # protocol 2 spells bytes as _codecs.encode(str, 'latin1')
        blob = b"\x80\x02c_codecs\nencode\n" + _bu(inner.decode("latin-1")) + _bu("latin1") + b"\x86R."
        pos = len(blob) - 2  # the REDUCE that computes the bytes
    r = walk(blob)
    assert r.error is None
    assert bytes(r.obj) == inner
    assert len(r.nested) == 1 and [str(g) for g in r.nested[0].globals] == ["posix.system"]
    assert [str(g) for g in r.all_globals()][-1] == "posix.system"
    name = {"_codecs": "_codecs.encode"}.get(wrap, wrap)
    assert r.tricks == [f"{name} at byte {pos} holds a complete nested pickle ({len(inner)} bytes, 8 opcodes, "
                        "imports ['posix.system'])"]


def test_a_nested_pickle_that_imports_nothing_is_walked_but_hides_nothing():
    # torchtitan keeps each rank's StatefulDataLoader state as pickle.dumps bytes inside its torch.save'd item
    inner = pickle.dumps({"epoch": 2, "batches_yielded": 10}, protocol=4)
    r = walk(pickle.dumps({"dp_rank_0": inner}, protocol=2))
    assert r.error is None and r.obj == {"dp_rank_0": inner}
    assert len(r.nested) == 1 and r.nested[0].obj == {"epoch": 2, "batches_yielded": 10}
    assert r.tricks == [] and [str(g) for g in r.all_globals()] == ["_codecs.encode"]


def test_bytes_that_merely_start_with_0x80_are_not_nested():
    r = walk(pickle.dumps(b"\x80\x02garbage", protocol=3))
    assert r.error is None and r.nested == [] and r.tricks == []


@pytest.mark.parametrize("code, blob", [
    ("EXT1", b"\x80\x02\x82\x07)R."),
    ("EXT2", b"\x80\x02\x83\x07\x01)R."),
    ("EXT4", b"\x80\x02\x84\x07\x00\x01\x00)R."),
])
def test_extension_registry_opcodes_are_a_trick(code, blob):
    r = walk(blob)
    assert r.error is None
    n = {"EXT1": 7, "EXT2": 263, "EXT4": 65543}[code]
    assert r.globals == [GlobalImport("copyreg._extension_registry", str(n), code, 2, False)]
    assert r.tricks == [f"{code} at byte 2 imports by extension-registry code {n} (copyreg.add_extension), "
                        "so the imported name is not in the file"]


def test_build_and_setitem_on_imported_objects_are_tricks():
    blob = (b"\x80\x02cbuiltins\nint\n}" + _bu("real") + b"K\x01sb"  # BUILD on a class: attribute overwrite
            + b"csys\nmodules\n" + _bu("os") + b"N" + b"s0.")  # SETITEM into sys.modules
    r = walk(blob)
    assert r.error is None
    assert r.tricks == [
        "BUILD at byte 29 sets attributes on the imported object builtins.int "
        "(overwriting a module or class attribute)",
        "SETITEM at byte 51 writes items into the imported object sys.modules (e.g. patching a module-level dict)",
    ]


def test_dunder_attribute_path_in_import_is_a_trick():
    blob = b"\x80\x04" + _u("builtins") + _u("object.__subclasses__") + b"\x93)R."
    r = walk(blob)
    assert r.tricks == ["import at byte 35 walks attributes through a dunder name: builtins.object.__subclasses__"]


def test_global_names_are_read_raw_not_escape_decoded():
    # pickletools undoes backslash escapes in GLOBAL operands; pickle.load does not
    r = walk(b"\x80\x02cpo\\x73ix\nsystem\n.")
    assert str(r.globals[0]) == "po\\x73ix.system"


# ------------------------------------------------------------------ tables


def test_dtype_of_storage_type():
    assert dtype_of_storage_type("FloatStorage") == ("float32", 4)
    assert dtype_of_storage_type("torch.cuda.HalfStorage") == ("float16", 2)
    assert dtype_of_storage_type("BFloat16Storage") == ("bfloat16", 2)
    assert dtype_of_storage_type("torch.storage.UntypedStorage") == ("uint8", 1)
    assert dtype_of_storage_type("ComplexDoubleStorage") == ("complex128", 16)
    assert dtype_of_storage_type("QUInt4x2Storage") == ("quint4x2", 1)
    with pytest.raises(KeyError, match="'NopeStorage' is not a torch storage type"):
        dtype_of_storage_type("NopeStorage")


def test_dtype_table_matches_installed_torch():
    torch = pytest.importorskip("torch")
    for dtype, name in torch.storage._dtype_to_storage_type_map().items():
        assert dtype_of_storage_type(name) == (str(dtype).removeprefix("torch."), dtype.itemsize), name


def test_module_does_not_import_torch_or_unpickle():
    """The walker's code imports no unpickler or torch and calls no load/loads (checked on its AST)."""
    import ast
    import subprocess

    root = Path(__file__).resolve().parents[1]
    tree = ast.Module([n for f in sorted((root / "ckptaudit" / "pickle_walk").glob("*.py")) for n in ast.parse(f.read_text()).body], [])
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"pickle", "_pickle", "torch", "cloudpickle", "dill", "joblib"}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not (attrs | names) & {"load", "loads", "Unpickler", "_Unpickler", "find_class"}
    code = "import sys, ckptaudit.pickle_walk; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "False False"


# ------------------------------------------------------------------ never raises, never hangs

_OPCODE_BYTES = [op.code.encode("latin-1") for op in pickletools.opcodes]


def _bounded_walk(data: bytes, **kw) -> WalkResult:
    t0 = time.perf_counter()
    r = walk(data, **kw)
    assert time.perf_counter() - t0 < 5.0
    assert isinstance(r, WalkResult)
    assert 0 <= r.end <= len(data)
    return r


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096))
def test_random_bytes_never_raise(data):
    _bounded_walk(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_OPCODE_BYTES), st.binary(max_size=4)), max_size=300))
def test_random_opcode_streams_never_raise(parts):
    _bounded_walk(b"\x80\x04" + b"".join(a + b for a, b in parts))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, 13985), flips=st.lists(st.tuples(st.integers(0, 13984), st.integers(0, 255)), max_size=8))
def test_truncated_or_flipped_checkpoint_never_raises(cut, flips):
    data = bytearray(_read_member("ok_full_torch", "ckpt/data.pkl"))
    for i, b in flips:
        data[i] = b
    data = bytes(data[:cut])
    r = _bounded_walk(data)
    if not flips and cut < 13985:
        assert r.error == f"truncated at byte {cut}: no STOP opcode"


def test_the_memo_is_the_same_mapping_as_a_dict_for_any_slot_order():
    """The walk's memo (ckptaudit/pickle_walk/memo.py) keeps slots in a list while they come 0, 1, 2, …
    (CPython's and torch's picklers) and in a dict otherwise: every sequence of writes reads back as a dict's."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from ckptaudit.pickle_walk.memo import Memo

    keys = st.one_of(st.integers(-3, 40), st.sampled_from(["a", 2.0, True]))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(keys, st.integers()), max_size=60), st.lists(keys, max_size=20))
    def check(writes, reads):
        m, d = Memo(), {}
        for k, v in writes:
            m[k] = v
            d[k] = v
        assert len(m) == len(d) and dict(m.items()) == d
        for k in reads:
            assert (k in m) == (k in d) and m.get(k, "none") == d.get(k, "none")

    check()


def test_a_torch_save_memo_stays_a_list(tmp_path):
    """torch.save of many tensors fills slots in order: the memo never becomes a dict (8 bytes a slot)."""
    import torch

    from ckptaudit.pickle_walk import machine, memo

    made = []

    class Spy(memo.Memo):
        def __init__(self):
            super().__init__()
            made.append(self)

    torch.save({f"w{i}": torch.ones(1) for i in range(2000)}, tmp_path / "m.pt")
    with zipfile.ZipFile(tmp_path / "m.pt") as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    orig = machine.Memo
    machine.Memo = Spy
    try:
        res = walk(data)
    finally:
        machine.Memo = orig
    assert res.error is None and len(res.tensors) == 2000
    assert made and made[0]._dict is None and len(made[0]) > 4000
