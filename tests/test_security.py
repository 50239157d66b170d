"""Tests for ckptaudit.security: allowlist classification of pickle imports and the findings it makes."""

from __future__ import annotations

import io
import json
import logging
import pickle
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from ckptaudit import findings
from ckptaudit.pickle_walk import walk
from ckptaudit.security import (
    BENIGN,
    WEIGHTS_ONLY_GLOBALS,
    ImportVerdict,
    classify_import,
    scan,
)

CASES = Path("/work/shared/cases")
MARKER = "CKPTAUDIT_PAYLOAD_RAN"


@pytest.fixture(autouse=True)
def _payload_never_runs(tmp_path):
    """Guards against any code path that would unpickle a malicious case (its payload touches MARKER)."""
    yield
    for d in (Path.cwd(), Path(tempfile.gettempdir()), tmp_path, *CASES.iterdir()):
        assert not (d / MARKER).exists(), f"{d / MARKER} exists: a payload ran"


def _pickle_members(case_dir: Path):
    """(file, member, bytes) of every pickle in a case folder: zip data.pkl records and raw pickle files."""
    for p in sorted(case_dir.rglob("*")):
        if not p.is_file() or p.name == "expected.json" or p.suffix == ".safetensors":
            continue
        rel = str(p.relative_to(case_dir))
        if zipfile.is_zipfile(p):
            try:
                with zipfile.ZipFile(p) as z:
                    for n in z.namelist():
                        if n.endswith(".pkl"):
                            yield rel, n, z.read(n)
            except (zipfile.BadZipFile, OSError):
                continue
        elif p.read_bytes()[:1] == b"\x80":
            yield rel, rel, p.read_bytes()


def _scan_case(case: str):
    out = []
    for rel, member, data in _pickle_members(CASES / case):
        offset = 0
        while offset < len(data):  # legacy files hold several pickles back to back
            r = walk(data, offset)
            out.append((rel, member, r, *scan(r, path=rel, member=member)))
            if r.error is not None:
                break
            offset = r.end
    return out


def _kinds(case: str):
    return sorted({f.kind for *_, fs in _scan_case(case) for f in fs})


# ------------------------------------------------------------------ the cases


@pytest.mark.parametrize("case, member", [
    ("security_malicious_reduce_zip", "ckpt/data.pkl"),
    ("security_malicious_dcp_metadata", "step-6/.metadata"),
])
def test_security_cases_are_code_exec(case, member):
    rows = [row for row in _scan_case(case) if row[1] == member]
    assert len(rows) == 1
    rel, member, r, verdicts, fs = rows[0]
    assert r.error is None
    assert [f.kind for f in fs] == ["malicious_pickle_code_exec"]
    f = fs[0]
    assert f.detail["dangerous"] == "'posix.system'"
    assert f.message == (
        f"{rel}: the pickle in {member} imports 'posix.system', which can run commands when unpickled: "
        "opening it with torch.load(weights_only=False) or pickle.load would execute code.")
    assert (f.severity, f.caps, f.layer) == ("error", "none", "security")
    assert {v.qualname: v.category for v in verdicts}["posix.system"] == "dangerous"
    expected = json.loads((CASES / case / "expected.json").read_text())
    assert expected["expected_error_kind"] == f.kind


VERSION_REPAIRS = {
    "version_argparse_namespace": (
        "'argparse.Namespace'", "import argparse\nimport torch.serialization\n"
        "torch.serialization.add_safe_globals([argparse.Namespace])"),
    "version_lightning_hparams": (
        "'pytorch_lightning.utilities.parsing.AttributeDict'",
        'import torch.serialization\n'  # the class is given by its name: no import
        'torch.serialization.add_safe_globals([(dict, "pytorch_lightning.utilities.parsing.AttributeDict")])'),
    "version_numpy_scalar": (
        "'numpy._core.multiarray.scalar', 'numpy.dtype'",
        "import numpy._core.multiarray\nimport numpy.dtypes\nimport torch.serialization\n"
        "torch.serialization.add_safe_globals([numpy._core.multiarray.scalar, numpy.dtype, "
        "numpy.dtypes.Float64DType])"),
    "version_torch_version_object": (
        "'torch.torch_version.TorchVersion'",
        "import torch.serialization\nimport torch.torch_version\n"
        "torch.serialization.add_safe_globals([torch.torch_version.TorchVersion])"),
}


@pytest.mark.parametrize("case", sorted(VERSION_REPAIRS))
def test_version_cases_are_benign_with_exact_repair(case):
    rows = _scan_case(case)
    assert len(rows) == 1
    _, _, r, verdicts, fs = rows[0]
    assert [f.kind for f in fs] == ["non_allowlisted_global_benign"]
    benign, repair = VERSION_REPAIRS[case]
    assert fs[0].detail["benign"] == benign
    assert fs[0].repair == repair
    assert (fs[0].severity, fs[0].caps) == ("warning", "resume")
    assert findings.usable_for(fs) == "resume"
    assert json.loads((CASES / case / "expected.json").read_text())["expected_error_kind"] == fs[0].kind


def test_version_repairs_really_load_with_weights_only():
    """Each repair makes torch.load(weights_only=True) succeed, and it fails without (child process).

    Only the benign version_* cases are loaded, and only with weights_only=True, which runs no code
    from the file.
    """
    pytest.importorskip("torch")
    # the add_safe_globals line, after the imports it is printed with (run whole in tests/test_repairs_run.py)
    repairs = {case: VERSION_REPAIRS[case][1].splitlines()[-1] for case in VERSION_REPAIRS}
    child = r"""
import json, sys, warnings
import argparse, numpy, numpy._core.multiarray, torch, torch.torch_version
warnings.simplefilter("ignore")
out = {}
for case, repair in json.loads(sys.argv[1]).items():
    path = f"/work/shared/cases/{case}/ckpt.pt"
    try:
        torch.load(path, weights_only=True)
        before = "loaded"
    except Exception as e:
        before = "rejected"
    safe = eval(repair[len("torch.serialization.add_safe_globals("):-1])
    with torch.serialization.safe_globals(safe):
        try:
            torch.load(path, weights_only=True)
            after = "loaded"
        except Exception as e:
            after = "rejected: " + str(e)[-300:]
    out[case] = [before, after]
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", child, json.dumps(repairs)], capture_output=True, text=True,
                         timeout=300, cwd=tempfile.gettempdir())
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {case: ["rejected", "loaded"] for case in repairs}


@pytest.mark.parametrize("case", sorted(p.name for p in CASES.iterdir() if p.name.startswith("ok_")))
def test_ok_cases_have_no_security_findings(case):
    rows = _scan_case(case)
    for rel, member, r, verdicts, fs in rows:
        assert fs == [], (rel, member, [f.message for f in fs])
        assert r.tricks == []
        assert all(v.category in ("weights_only", "benign") for v in verdicts)


def test_dcp_metadata_types_are_known_and_need_no_repair():
    rows = [row for row in _scan_case("ok_dcp") if row[1] == "step-6/.metadata"]
    (_, _, r, verdicts, fs), = rows
    cats = {v.qualname: v.category for v in verdicts}
    assert cats["torch.distributed.checkpoint.metadata.Metadata"] == "benign"
    assert cats["pathlib.PosixPath"] == "benign"
    assert fs == []
    # the same pickle read by torch.load would need allowlisting
    _, fs_torch = scan(r, path="x", member="x.pkl", loader="torch.load")
    assert [f.kind for f in fs_torch] == ["non_allowlisted_global_benign"]
    assert '(pathlib.PosixPath, "pathlib.PosixPath")' in fs_torch[0].repair


# ------------------------------------------------------------------ classification


@pytest.mark.parametrize("module, name, category", [
    ("os", "system", "dangerous"),
    ("posix", "system", "dangerous"),
    ("nt", "system", "dangerous"),
    ("subprocess", "Popen", "dangerous"),
    ("__builtin__", "eval", "dangerous"),  # Python 2 spelling, what pickle imports for protocol < 3
    ("builtins", "getattr", "dangerous"),
    ("builtins", "__import__", "dangerous"),
    ("operator", "attrgetter", "dangerous"),
    ("functools", "partial", "dangerous"),
    ("pkgutil", "resolve_name", "dangerous"),
    ("runpy", "_run_code", "dangerous"),
    ("torch.hub", "load", "dangerous"),
    ("torch.serialization", "load", "dangerous"),
    ("asyncio.subprocess", "create_subprocess_shell", "dangerous"),
    ("code", "InteractiveInterpreter.runcode", "dangerous"),
    ("builtins", "set", "weights_only"),
    ("__builtin__", "set", "weights_only"),  # torch maps __builtin__ to builtins too
    ("collections", "OrderedDict", "weights_only"),
    ("torch._utils", "_rebuild_tensor_v2", "weights_only"),
    ("torch", "float8_e4m3fn", "weights_only"),
    ("torch", "BFloat16Storage", "weights_only"),
    ("torch.nn.parameter", "Parameter", "weights_only"),
    ("_codecs", "encode", "weights_only"),
    ("argparse", "Namespace", "benign"),
    ("numpy.dtypes", "Float32DType", "benign"),
    ("numpy.core.multiarray", "_reconstruct", "benign"),
    ("datetime", "datetime", "benign"),
    ("builtins", "slice", "benign"),
    ("_io", "BytesIO", "benign"),  # an in-memory buffer (DCP saves BytesIO values so) ...
    ("_io", "StringIO", "benign"),
    ("_io", "FileIO", "dangerous"),  # ... the module's other names open files
    ("_io", "open", "dangerous"),
    ("_io", "BufferedWriter", "dangerous"),
    ("_io", "BytesIO.__init__", "dangerous"),
    ("collections", "defaultdict", "benign"),  # by name; scan() checks its factory (issue 12)  # deliberately not benign: see security.py
    ("torch.nn.modules.linear", "Linear", "unknown"),
    ("my.pkg", "Config", "unknown"),
])
def test_classify_import(module, name, category):
    v = classify_import(module, name)
    assert v.category == category
    assert v.source


def test_extra_allowed_is_benign_but_cannot_allow_dangerous():
    v = classify_import("my.pkg", "Config", extra_allowed=["my.pkg.Config"])
    assert v == ImportVerdict("my.pkg", "Config", "benign", "security.allow_globals in the audit config",
                              "my.pkg.Config")
    assert classify_import("os", "system", extra_allowed=["os.system"]).category == "dangerous"
    # torch maps __builtin__.long to builtins.int itself; exceptions.* it leaves alone
    assert classify_import("__builtin__", "long", extra_allowed=["builtins.int"]).add_safe == "int"
    assert classify_import("exceptions", "ValueError", extra_allowed=["exceptions.ValueError"]).add_safe == \
        '(ValueError, "exceptions.ValueError")'


def test_benign_spellings_are_python_expressions():
    for full, b in BENIGN.items():
        compile(b.add_safe, full, "eval")


def test_weights_only_list_matches_installed_torch():
    torch = pytest.importorskip("torch")
    from torch._weights_only_unpickler import _get_allowed_globals

    assert WEIGHTS_ONLY_GLOBALS == frozenset(_get_allowed_globals()), torch.__version__


def test_benign_names_are_not_weights_only_and_torch_rejects_them():
    pytest.importorskip("torch")
    from torch._weights_only_unpickler import _get_allowed_globals

    assert not set(BENIGN) & set(_get_allowed_globals())


# ------------------------------------------------------------------ findings


def _g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def test_one_finding_per_kind_naming_every_import_sorted_and_quoted():
    blob = (b"\x80\x02(" + _g("subprocess", "Popen") + _g("os", "system") + _g("builtins", "eval")
            + _g("os", "system") + _g("zzz", "Baz") + _g("foo", "Bar") + _g("argparse", "Namespace")
            + _g("datetime", "timedelta") + _g("collections", "OrderedDict") + b"l.")
    r = walk(blob)
    verdicts, fs = scan(r, path="run/ckpt.pt", member="ckpt/data.pkl")
    assert [v.qualname for v in verdicts] == [
        "subprocess.Popen", "os.system", "builtins.eval", "zzz.Baz", "foo.Bar", "argparse.Namespace",
        "datetime.timedelta", "collections.OrderedDict"]
    by = {f.kind: f for f in fs}
    assert list(by) == ["malicious_pickle_code_exec", "unknown_pickle_global", "non_allowlisted_global_benign"]
    assert by["malicious_pickle_code_exec"].detail["dangerous"] == "'builtins.eval', 'os.system', 'subprocess.Popen'"
    assert by["unknown_pickle_global"].message == (
        "run/ckpt.pt: the pickle in ckpt/data.pkl imports 'foo.Bar', 'zzz.Baz' (module.name), which is neither "
        "allowed by torch.load(weights_only=True) nor a known framework data class: weights_only=True will refuse "
        "it, and weights_only=False would run whatever code that name has where the file is loaded.")
    assert by["unknown_pickle_global"].severity == "warning"  # issue 12: unknown is a warning, not an error
    assert by["non_allowlisted_global_benign"].repair == \
        "import argparse\nimport datetime\nimport torch.serialization\n" \
        "torch.serialization.add_safe_globals([argparse.Namespace, datetime.timedelta])"
    assert findings.usable_for(fs) == "none"


def test_nested_pickle_imports_and_tricks_are_reported():
    inner = b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c\x02id\x85R."
    blob = b"\x80\x03}(\x8c\x04blobB" + struct.pack("<I", len(inner)) + inner + b"u."
    r = walk(blob)
    verdicts, fs = scan(r, path="p", member="m")
    assert [f.kind for f in fs] == ["malicious_pickle_code_exec", "pickle_obfuscation"]
    assert fs[0].detail["dangerous"] == "'posix.system'"
    assert fs[1].message == (
        "p: the pickle in m uses a trick that hides what it imports (BINBYTES at byte 10 holds a complete "
        "nested pickle (25 bytes, 8 opcodes, imports ['posix.system'])).")


def test_computed_and_extension_imports_are_unknown():
    blob = b"\x80\x04" + _g("builtins", "str") + b"\x8c\x02os\x85R\x8c\x06system\x93\x82\x07)R\x86."
    r = walk(blob)
    verdicts, fs = scan(r, path="p", member="m")
    assert [(v.qualname, v.category) for v in verdicts] == [
        ("builtins.str", "benign"), ("<builtins.str instance>.'system'", "unknown"),
        ("copyreg._extension_registry.7", "unknown")]
    assert [f.kind for f in fs] == ["unknown_pickle_global", "non_allowlisted_global_benign", "pickle_obfuscation"]
    assert len(fs[2].detail["tricks"]) == 2


def test_numpy_arrays_get_their_dtype_class_in_the_repair():
    np = pytest.importorskip("numpy")
    blob = pickle.dumps({"a": np.arange(3, dtype=np.int64), "b": np.float32(1.5)}, protocol=2)
    _, fs = scan(walk(blob), path="p", member="m")
    assert [f.kind for f in fs] == ["non_allowlisted_global_benign"]
    assert fs[0].repair == (
        "import numpy._core.multiarray\nimport numpy.dtypes\nimport torch.serialization\n"
        "torch.serialization.add_safe_globals([numpy._core.multiarray._reconstruct, numpy._core.multiarray.scalar, "
        "numpy.dtype, numpy.dtypes.Float32DType, numpy.dtypes.Int64DType, numpy.ndarray])")


# ------------------------------------------------------------------ picklescan comparison

# How picklescan 1.0.5 (scan_pickle_bytes) and ckptaudit label every import of the security_* and
# version_* cases.  Agreements: both find exactly the same imports, both call posix.system dangerous,
# and nothing either calls safe is dangerous to the other.  Disagreements, by design:
#  * _codecs.encode, and torch.Size/float32/_get_layout elsewhere: picklescan "suspicious", ckptaudit
#    "weights_only" (torch's own allowlist accepts them; _codecs.encode is how protocol 2 spells bytes).
#  * numpy.dtype: picklescan "innocuous", ckptaudit "benign" -- torch.load(weights_only=True) still
#    rejects it, so ckptaudit warns with the add_safe_globals repair.
#  * argparse.Namespace, AttributeDict, numpy scalar, TorchVersion: picklescan "suspicious" and it
#    reports 0 issues (the file looks clean); ckptaudit "benign" and warns, because the default
#    weights-only torch.load of torch >= 2.6 refuses these files until the repair is applied.
PICKLESCAN_TABLE = {
    "posix.system": ("dangerous", "dangerous"),
    "collections.OrderedDict": ("weights_only", "innocuous"),
    "torch._utils._rebuild_tensor_v2": ("weights_only", "innocuous"),
    "torch.FloatStorage": ("weights_only", "innocuous"),
    "torch.ByteStorage": ("weights_only", "innocuous"),
    "_codecs.encode": ("weights_only", "suspicious"),
    "numpy.dtype": ("benign", "innocuous"),
    "numpy._core.multiarray.scalar": ("benign", "suspicious"),
    "argparse.Namespace": ("benign", "suspicious"),
    "pytorch_lightning.utilities.parsing.AttributeDict": ("benign", "suspicious"),
    "torch.torch_version.TorchVersion": ("benign", "suspicious"),
}
PICKLESCAN_ISSUES = {  # case -> (picklescan issues_count, ckptaudit error-level security findings)
    "security_malicious_reduce_zip": (1, 1),
    "security_malicious_dcp_metadata": (1, 1),
    "version_argparse_namespace": (0, 0),
    "version_lightning_hparams": (0, 0),
    "version_numpy_scalar": (0, 0),
    "version_torch_version_object": (0, 0),
}


@pytest.mark.parametrize("case", sorted(PICKLESCAN_ISSUES))
def test_categories_against_picklescan(case):
    scanner = pytest.importorskip("picklescan.scanner")
    logging.getLogger("picklescan").setLevel(logging.CRITICAL)
    n_issues = 0
    n_errors = 0
    for rel, member, r, verdicts, fs in _scan_case(case):
        ps = scanner.scan_pickle_bytes(io.BytesIO(walk_bytes(case, member)), f"{case}:{member}")
        theirs = {f"{g.module}.{g.name}": g.safety.value for g in ps.globals}
        ours = {v.qualname: v.category for v in verdicts}
        assert set(theirs) == set(ours)
        for name, cat in ours.items():
            assert (cat, theirs[name]) == PICKLESCAN_TABLE[name], name
        n_issues += ps.issues_count
        n_errors += sum(f.severity == "error" for f in fs)
    assert (n_issues, n_errors) == PICKLESCAN_ISSUES[case]


def walk_bytes(case: str, member: str) -> bytes:
    for rel, m, data in _pickle_members(CASES / case):
        if m == member:
            return data
    raise KeyError(member)


def test_picklescan_misses_a_pickle_nested_in_bytes():
    """A disagreement in ckptaudit's favour: picklescan does not look inside BINBYTES payloads."""
    scanner = pytest.importorskip("picklescan.scanner")
    logging.getLogger("picklescan").setLevel(logging.CRITICAL)
    inner = b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c\x02id\x85R."
    blob = b"\x80\x03B" + struct.pack("<I", len(inner)) + inner + b"."
    assert scanner.scan_pickle_bytes(io.BytesIO(blob), "nested").issues_count == 0
    _, fs = scan(walk(blob), path="p", member="m")
    assert [f.kind for f in fs] == ["malicious_pickle_code_exec", "pickle_obfuscation"]


def test_deepspeed_classes_without_deepspeed_are_load_not_checked(tmp_path, monkeypatch):
    """A ZeRO optimizer file audited where deepspeed cannot be imported must get a `load`-stage
    warning (`load_not_checked`), never a file-layer or security error (issue 12)."""
    import sys
    import types

    import torch

    from ckptaudit.pipeline import audit_in_process

    mod = types.ModuleType("deepspeed.runtime.fp16.loss_scaler")

    class LossScaler:  # stands in for deepspeed's: pickled by name, never imported back
        def __init__(self):
            self.cur_scale = 1.0
            self.dynamic = False

    LossScaler.__module__ = mod.__name__
    LossScaler.__qualname__ = "LossScaler"
    mod.LossScaler = LossScaler
    for name in ("deepspeed", "deepspeed.runtime", "deepspeed.runtime.fp16"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"optimizer_state_dict": {"loss_scaler": LossScaler(), "step": 100},
                "model": {"w": torch.zeros(2)}}, run / "ckpt_000100.pt")
    for name in ("deepspeed.runtime.fp16.loss_scaler", "deepspeed.runtime.fp16", "deepspeed.runtime"):
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # deepspeed not importable where the audit runs
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    (u,) = v["units"]
    errors = [(f["layer"], f["kind"]) for f in u["findings"]
              if f["severity"] == "error" and f["layer"] in ("file", "security")]
    assert errors == []
    nc = [f for f in u["findings"] if f["kind"] == "load_not_checked"]
    assert nc and nc[0]["severity"] == "warning" and "deepspeed" in nc[0]["message"], u["findings"]


# ------------------------------------------------------------------ issue 12: tiers by what a name can do


@pytest.mark.parametrize("module,name", [
    ("logging", "os.system"),  # protocol-4 dotted name walking through a module attribute
    ("torch", "serialization.os.system"),
    ("pathlib", "Path.write_text"),
    ("codecs", "open"),
    ("typing", "_eval_type"),
    ("torch.fx.graph_module", "reduce_graph_module"),
    ("torch._inductor.cpp_builder", "run_compile_cmd"),
])
def test_names_once_caught_only_as_unknown_are_dangerous(module, name):
    """These were caught only because unknown was an error; they must be dangerous by what they do."""
    assert classify_import(module, name).category == "dangerous"


def _pk(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def test_defaultdict_is_data_only_with_a_type_factory():
    """A defaultdict stores its default_factory and calls it on missing keys: a built-in type is data."""
    ok = _pk(b"ccollections\ndefaultdict\nc__builtin__\ndict\n\x85R")
    bad = _pk(b"ccollections\ndefaultdict\ncmy.hooks\nfactory\n\x85R")
    v_ok, f_ok = scan(walk(ok), path="a.pt", member="data.pkl")
    v_bad, f_bad = scan(walk(bad), path="a.pt", member="data.pkl")
    assert {v.qualname: v.category for v in v_ok}["collections.defaultdict"] == "benign"
    assert {v.qualname: v.category for v in v_bad}["collections.defaultdict"] == "dangerous"
    assert [f.kind for f in f_bad][0] == "malicious_pickle_code_exec"


def test_unknown_name_is_a_warning_unless_its_result_is_called():
    plain = _pk(b"cmy.pkg\nConfig\n)R")
    called = _pk(b"cmy.pkg\nget_handler\nX\x05\x00\x00\x00shell\x85RX\x02\x00\x00\x00id\x85R")
    _, f1 = scan(walk(plain), path="a.pt", member="data.pkl")
    v2, f2 = scan(walk(called), path="a.pt", member="data.pkl")
    assert [(f.kind, f.severity) for f in f1] == [("unknown_pickle_global", "warning")]
    assert {v.qualname: v.category for v in v2}["my.pkg.get_handler"] == "dangerous"
    assert "malicious_pickle_code_exec" in [f.kind for f in f2]


def test_data_class_called_with_a_computed_argument_is_not_data():
    p = _pk(b"cargparse\nNamespace\ncmy.pkg\nmake\n)R\x85R")
    v, _ = scan(walk(p), path="a.pt", member="data.pkl")
    assert {x.qualname: x.category for x in v}["argparse.Namespace"] == "unknown"


def test_every_stream_is_walked_and_a_hidden_stream_is_a_trick():
    """pickle.load in a loop (legacy torch.load reads five) runs a second stream after the first STOP."""
    from ckptaudit.security import streams

    data = _pk(b"}") + _pk(b"cposix\nsystem\nX\x02\x00\x00\x00id\x85R")
    _, fl = scan(streams(data), path="a.pt", member="(pickle)")
    kinds = [f.kind for f in fl]
    assert kinds == ["malicious_pickle_code_exec", "pickle_obfuscation"]
    assert "pickle stream 2 (from byte 4)" in fl[1].message


@pytest.mark.parametrize("enc", ["base64", "hex", "zlib", "bz2", "lzma"])
def test_encoded_nested_pickle_is_walked(enc):
    import base64
    import bz2
    import lzma
    import zlib

    inner = _pk(b"cposix\nsystem\nX\x02\x00\x00\x00id\x85R")
    blob = {"base64": lambda b: base64.b64encode(b), "hex": lambda b: b.hex().encode(), "zlib": zlib.compress,
            "bz2": bz2.compress, "lzma": lzma.compress}[enc](inner)
    outer = _pk(b"B" + len(blob).to_bytes(4, "little") + blob)
    r = walk(outer)
    assert [str(g) for g in r.all_globals()] == ["posix.system"]
    assert f"({enc}-encoded)" in r.tricks[0]


class _RunsACommand:
    """Pickled as ``os.system(...)``: the payload public advisories describe for object arrays."""

    def __reduce__(self):
        import os

        return (os.system, ("touch CKPTAUDIT_PAYLOAD_RAN",))


@pytest.mark.parametrize("kind", ["npy", "npz"])
def test_object_arrays_in_numpy_files_are_walked(tmp_path, kind, monkeypatch):
    """numpy.save of an object array writes a pickle after the .npy header (numpy/lib/format.py write_array);
    numpy.load(allow_pickle=True) would run it.  The audit walks it statically, as picklescan and modelscan do;
    a plain float array holds no pickle and gets no security finding."""
    import numpy as np

    from ckptaudit.pipeline import audit_in_process

    monkeypatch.chdir(tmp_path)
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir()
    good.mkdir()
    obj = np.array([_RunsACommand(), 1], dtype=object)
    if kind == "npy":
        np.save(bad / "ckpt_000100.npy", obj, allow_pickle=True)
        np.save(good / "ckpt_000100.npy", np.ones(4))
    else:
        np.savez(bad / "ckpt_000100.npz", w=np.ones(3), extra=obj)
        np.savez(good / "ckpt_000100.npz", w=np.ones(3))
    (u,) = audit_in_process(bad, {}, out_dir=tmp_path / "a1")["units"]
    (f,) = [f for f in u["findings"] if f["kind"] == "malicious_pickle_code_exec"]
    assert "'posix.system'" in f["message"] or "'os.system'" in f["message"], f["message"]
    assert u["usable_for"] == "none"
    (u,) = audit_in_process(good, {}, out_dir=tmp_path / "a2")["units"]
    assert not [f for f in u["findings"] if f["layer"] == "security"]
    assert not (tmp_path / "CKPTAUDIT_PAYLOAD_RAN").exists()
