"""Pickles in any record of an archive, and TorchScript's pickles, are walked and judged (issue 24).

Fixtures are made at test time: TorchScript archives with a real ``torch.jit.save`` of a tiny scripted module,
torch.save zips with a real ``torch.save``; the malicious variants rewrite or add records with ``zipfile``,
each a ``GLOBAL os system`` + ``REDUCE`` as public advisories describe.  What torch does with them is asked
of torch itself, in a subprocess (``torch.jit.load``, ``torch.load``); the audit never unpickles them.
"""

from __future__ import annotations

import io
import json
import pickle
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ckptaudit.security import torchscript as TS
from ckptaudit.pipeline import audit_in_process

from .conftest import PAYLOAD

torch = pytest.importorskip("torch")


def _global_reduce(module: str, name: str, arg: str) -> bytes:
    """Protocol 2: ``GLOBAL module name``, one string argument, ``REDUCE``: ``module.name(arg)``."""
    a = arg.encode()
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X" + struct.pack("<I", len(a)) + a + b"\x85R."


def _payload(tmp_path: Path) -> bytes:
    return _global_reduce("os", "system", f"touch {tmp_path / PAYLOAD}")


def _jit_save(dst: Path) -> None:
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.lin(x) * 2.0

    torch.jit.save(torch.jit.script(M()), str(dst))


def _rewrite(src: Path, dst: Path, suffix: str, data: bytes) -> str:
    """Copy zip ``src`` to ``dst`` with the record ending in ``suffix`` replaced by ``data``; its name."""
    hit = ""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            body = zin.read(info.filename)
            if info.filename.endswith(suffix) and not hit:
                body, hit = data, info.filename
            zout.writestr(info, body)
    assert hit, suffix
    return hit


def _add(src: Path, dst: Path, name: str, data: bytes, method: int) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, zin.read(info.filename))
        zout.writestr(zipfile.ZipInfo(name), data, compress_type=method)


def _unit(run: Path, tmp_path: Path, tag: str) -> dict:
    (u,) = audit_in_process(run, {}, out_dir=tmp_path / f"out_{tag}")["units"]
    return u


def _security(u: dict) -> list:
    return [f for f in u["findings"] if f["layer"] == "security"]


# ------------------------------------------------------------------------- TorchScript: what torch does


_LOAD = """
import json, sys, warnings
import torch
warnings.simplefilter("ignore")
out = {}
for call in ("jit", "load"):
    try:
        if call == "jit":
            torch.jit.load(sys.argv[1])
        else:
            torch.load(sys.argv[1], weights_only=False)
        out[call] = "loaded"
    except Exception as e:
        out[call] = type(e).__name__ + ": " + " ".join(str(e).split())[:300]
print(json.dumps(out))
"""


@pytest.mark.parametrize("record", ["constants.pkl", "data.pkl"])
def test_torch_jit_load_imports_no_python_global(tmp_path, record):
    """The framework's loader is the truth: torch.jit.load (and torch.load, which hands a TorchScript archive
    to it) reads a ``GLOBAL os system`` + ``REDUCE`` record with the C++ unpickler, fails, and runs nothing."""
    clean, bad = tmp_path / "clean.pt", tmp_path / "bad.pt"
    _jit_save(clean)
    _rewrite(clean, bad, "/" + record, _payload(tmp_path))
    p = subprocess.run([sys.executable, "-c", _LOAD, str(bad)], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["jit"].startswith("RuntimeError") and "Unknown type name 'os.system'" in got["jit"], got
    assert got["load"].startswith("RuntimeError") and "Unknown type name 'os.system'" in got["load"], got
    assert not (tmp_path / PAYLOAD).exists()


def test_cpp_unpickler_names():
    code = TS.code_modules(["m/code/__torch__.py", "m/code/__torch__/torch/nn/modules/linear.py",
                            "m/code/__torch__.py.debug_pkl"], "m")
    assert code == {"__torch__", "__torch__.torch.nn.modules.linear"}
    assert TS.cpp_resolves("__torch__", "M", code)
    assert TS.cpp_resolves("__torch__.torch.nn.modules.linear", "Linear", code)
    assert not TS.cpp_resolves("__torch__.evil", "Linear", code)  # no code/__torch__/evil.py
    for module, name in [("torch._utils", "_rebuild_tensor_v2"), ("torch", "FloatStorage"),
                         ("torch", "QUInt8Storage"), ("torch", "per_tensor_affine"), ("collections", "OrderedDict"),
                         ("torch.jit._pickle", "restore_type_tag")]:
        assert TS.cpp_resolves(module, name, code), (module, name)
    for module, name in [("os", "system"), ("builtins", "eval"), ("torch", "load"), ("torch", "NoSuchStorage")]:
        assert not TS.cpp_resolves(module, name, code), (module, name)
    assert TS.is_torchscript(["m/data.pkl", "m/constants.pkl"], "m")
    assert not TS.is_torchscript(["m/data.pkl", "m/extra/constants.pkl"], "m")


# ------------------------------------------------------------------------- TorchScript: what the audit says


def _no_pickle_finding(u: dict) -> None:
    assert _security(u) == [], _security(u)


def test_clean_torchscript_archives_get_no_security_finding(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _jit_save(run / "model_000100.pt")
    def shift(x):
        return x + torch.arange(3.0) * 2

    traced = torch.jit.trace(shift, torch.zeros(3))  # its constants.pkl holds a tensor
    run2 = tmp_path / "run2"
    run2.mkdir()
    torch.jit.save(traced, str(run2 / "model_000100.pt"))
    with zipfile.ZipFile(run2 / "model_000100.pt") as z:
        assert any(n.endswith("constants.pkl") and len(z.read(n)) > 10 for n in z.namelist())
    for r, tag in ((run, "script"), (run2, "trace")):
        u = _unit(r, tmp_path, tag)
        _no_pickle_finding(u)
        (lf,) = [f for f in u["findings"] if f["kind"] == "load_failed"]  # torch.load(weights_only=True) refuses
        assert "TorchScript archive" in lf["message"], lf["message"]
        assert u["usable_for"] == "none"


@pytest.mark.parametrize("record", ["/constants.pkl", "/data.pkl", ".py.debug_pkl"])
def test_global_in_a_torchscript_pickle_is_a_warning_not_code_execution(tmp_path, record):
    clean = tmp_path / "clean.pt"
    _jit_save(clean)
    run = tmp_path / "run"
    run.mkdir()
    name = _rewrite(clean, run / "model_000100.pt", record, _payload(tmp_path))
    u = _unit(run, tmp_path, "bad")
    (f,) = _security(u)
    assert f["kind"] == "torchscript_pickle_global" and f["severity"] == "warning" and f["caps"] == "resume"
    assert f["detail"]["member"] == name and f["detail"]["imports"] == ["os.system"]
    assert f["detail"]["dangerous"] == ["os.system"]
    assert "imports no Python global" in f["message"] and "'os.system' would run code there" in f["message"]
    assert u["usable_for"] == "none"  # torch.load(weights_only=True) refuses any TorchScript archive
    assert not (tmp_path / PAYLOAD).exists()


def test_torchscript_extra_record_is_judged_as_a_record_no_loader_reads(tmp_path):
    """``torch.jit.save(_extra_files=…)`` records come back from torch.jit.load as bytes: a pickle there is
    judged by the Python rule (dangerous = error), not the C++ unpickler's."""
    clean = tmp_path / "clean.pt"
    _jit_save(clean)
    run = tmp_path / "run"
    run.mkdir()
    _add(clean, run / "model_000100.pt", "clean/extra/meta.pkl", _payload(tmp_path), zipfile.ZIP_DEFLATED)
    u = _unit(run, tmp_path, "extra")
    (f,) = _security(u)
    assert f["kind"] == "malicious_pickle_code_exec" and f["severity"] == "error"
    assert f["detail"]["member"] == "clean/extra/meta.pkl" and f["detail"]["imports"] == ["os.system"]
    assert u["usable_for"] == "none"


# ------------------------------------------------------------------------- any record of a torch.save zip


def _torch_save(dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 100}, dst)


@pytest.mark.parametrize("name,method", [
    ("ckpt_000100/extra/notes.pkl", zipfile.ZIP_DEFLATED),  # a .pkl beside data.pkl, deflated
    ("ckpt_000100/blob", zipfile.ZIP_STORED),  # a pickle under no pickle name, found by its PROTO header
    ("other/data.pkl", zipfile.ZIP_STORED),  # a second archive folder
])
def test_pickle_in_any_record_of_a_torch_zip_is_walked(tmp_path, name, method):
    clean = tmp_path / "src" / "ckpt_000100.pt"  # torch.save names the archive folder after the file
    _torch_save(clean)
    run = tmp_path / "run"
    run.mkdir()
    _add(clean, run / "ckpt_000100.pt", name, _payload(tmp_path), method)
    u = _unit(run, tmp_path, "side")
    mal = [f for f in _security(u) if f["kind"] == "malicious_pickle_code_exec"]
    assert [(f["severity"], f["detail"]["member"], f["detail"]["imports"]) for f in mal] == [
        ("error", name, ["os.system"])]
    others = sorted(f["kind"] for f in _security(u) if f not in mal)
    assert others == (["pickle_obfuscation"] if name.startswith("other/") else []), others  # mixed folders
    assert u["usable_for"] == "none"


def test_unknown_and_benign_globals_in_a_side_record(tmp_path):
    clean = tmp_path / "src" / "ckpt_000100.pt"  # torch.save names the archive folder after the file
    _torch_save(clean)
    run = tmp_path / "run"
    run.mkdir()
    _add(clean, run / "ckpt_000100.pt", "ckpt_000100/extra/helper.pkl", _global_reduce("mypkg.helpers", "Thing", "x"),
         zipfile.ZIP_STORED)
    u = _unit(run, tmp_path, "unknown")
    (f,) = _security(u)
    assert (f["kind"], f["severity"], f["detail"]["imports"]) == ("unknown_pickle_global", "warning",
                                                                  ["mypkg.helpers.Thing"])
    run2 = tmp_path / "run2"
    run2.mkdir()
    _add(clean, run2 / "ckpt_000100.pt", "ckpt_000100/extra/meta.pkl", pickle.dumps({"lr": 1e-3}, protocol=4),
         zipfile.ZIP_DEFLATED)
    _no_pickle_finding(_unit(run2, tmp_path, "benign"))


def test_clean_torch_save_files_get_no_security_finding(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _torch_save(run / "ckpt_000100.pt")
    torch.save(torch.nn.Linear(3, 2).state_dict(), run / "ckpt_000200.pt")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    assert len(v["units"]) == 2
    for u in v["units"]:
        _no_pickle_finding(u)


def test_member_bound(tmp_path, monkeypatch):
    """At most MAX_MEMBERS records of an archive are looked at (a documented bound)."""
    from ckptaudit.layouts import archive_pickles

    clean = tmp_path / "src" / "ckpt_000100.pt"  # torch.save names the archive folder after the file
    _torch_save(clean)
    with zipfile.ZipFile(clean) as z:
        n = len(z.namelist())
    run = tmp_path / "run"
    run.mkdir()
    _add(clean, run / "ckpt_000100.pt", "ckpt_000100/extra/late.pkl", _payload(tmp_path), zipfile.ZIP_STORED)
    monkeypatch.setattr(archive_pickles, "MAX_MEMBERS", n)
    assert not [f for f in _security(_unit(run, tmp_path, "cap")) if f["kind"] == "malicious_pickle_code_exec"]
    monkeypatch.setattr(archive_pickles, "MAX_MEMBERS", n + 1)
    assert [f for f in _security(_unit(run, tmp_path, "nocap")) if f["kind"] == "malicious_pickle_code_exec"]


# ------------------------------------------------------------------------- .npz members that are no .npy


def test_pickle_member_of_an_npz_that_is_no_npy(tmp_path):
    import numpy as np

    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "ckpt_000100.npz", w=np.ones(3))
    with zipfile.ZipFile(run / "ckpt_000100.npz", "a") as z:
        z.writestr("extra.pkl", _payload(tmp_path))
    u = _unit(run, tmp_path, "npz")
    (f,) = [f for f in _security(u) if f["kind"] == "malicious_pickle_code_exec"]
    assert f["detail"]["member"] == "extra.pkl" and f["detail"]["imports"] == ["os.system"]
    assert u["usable_for"] == "none"


# ------------------------------------------------------------------------- torch's legacy tar format


def _legacy_tar(dst: Path, pickle_record: bytes, views: bytes = b"") -> None:
    """The layout torch/serialization.py ``legacy_load`` reads (``storages``, ``tensors``, ``pickle``)."""
    storages = io.BytesIO()
    pickle.dump(1, storages, protocol=2)
    pickle.dump(("0", "cpu", torch.FloatStorage), storages, protocol=2)
    storages.write(struct.pack("<q", 2) + struct.pack("<2f", 1.0, 2.0))
    storages.write(views or pickle.dumps([], protocol=2))
    tensors = pickle.dumps(0, protocol=2)
    with tarfile.open(dst, "w:", format=tarfile.PAX_FORMAT) as t:
        for name, data in (("pickle", pickle_record), ("tensors", tensors), ("storages", storages.getvalue())):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))


def test_legacy_tar_pickles_are_walked(tmp_path):
    clean = tmp_path / "clean"
    clean.mkdir()
    _legacy_tar(clean / "ckpt_000100.tar", pickle.dumps({"step": 5}, protocol=2))
    assert _security(_unit(clean, tmp_path, "clean")) == []
    for tag, kw, member in (("obj", {"pickle_record": _payload(tmp_path)}, "pickle"),
                            ("views", {"pickle_record": pickle.dumps({}, protocol=2), "views": _payload(tmp_path)},
                             "storages")):
        run = tmp_path / tag
        run.mkdir()
        _legacy_tar(run / "ckpt_000100.tar", **kw)
        u = _unit(run, tmp_path, tag)
        (f,) = _security(u)
        assert (f["kind"], f["severity"], f["detail"]["member"], f["detail"]["imports"]) == (
            "malicious_pickle_code_exec", "error", member, ["os.system"])
        assert u["usable_for"] == "none"
    run = tmp_path / "unknown"
    run.mkdir()
    _legacy_tar(run / "ckpt_000100.tar", _global_reduce("mypkg.helpers", "Thing", "x"))
    (f,) = _security(_unit(run, tmp_path, "unknown"))
    # torch.load(weights_only=True) refuses the tar format before unpickling: a warning, not an error
    assert (f["kind"], f["severity"], f["detail"]["imports"]) == ("unknown_pickle_global", "warning",
                                                                  ["mypkg.helpers.Thing"])
