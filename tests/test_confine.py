"""Confinement: a path the run names that leads outside it is ``path_outside_run`` and is never opened (issue 24).

Each field is written the way a hostile or careless run would: an index shard that is a symbolic link to a
file outside, a shard under a symbolically linked folder, an index naming ``../..`` and an absolute path, a
DeepSpeed ``latest`` holding ``../outside/global_step900``, a ``latest`` symbolic link out of the run.  The
outside files never open: their access time (set to 2020 first, so any read moves it) stays, and an audit
hook sees no ``open`` of them in this process or its forked load children.  A FIFO named as a shard is a
finding within seconds, never an open that blocks.  The same holds for Lightning's ``last.ckpt`` link, Megatron's
tracker, ``.sha256`` sidecars and ckptaudit manifests (the link and the names they list), a DeepSpeed tag folder
that is a link and DCP storage paths; and a FIFO or ``/dev/zero`` device in any of these fields.
"""

import json
import os
import sys
import time
from pathlib import Path

import pytest

from ckptaudit import safe_load_checkpoint
from ckptaudit.pipeline import audit_in_process
from ckptaudit.safe_load import NoUsableCheckpointError

_OPENED: list = []
_WATCH: list = []  # the outside folder of the test that runs


def _hook(event, args):
    if event == "open" and _WATCH and args and isinstance(args[0], (str, bytes, os.PathLike)):
        p = os.fsdecode(args[0]) if not isinstance(args[0], os.PathLike) else os.fspath(args[0])
        if str(p).startswith(_WATCH[0]):
            _OPENED.append(p)


sys.addaudithook(_hook)


def _outside(base: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    out = base / "outside"
    (out / "shards").mkdir(parents=True)
    save_file({"b": torch.ones(3)}, out / "secret.safetensors")
    save_file({"b": torch.ones(3)}, out / "shards" / "model-00002-of-00002.safetensors")
    (out / "global_step900").mkdir()
    torch.save({"module": {"w": torch.ones(2)}}, out / "global_step900" / "mp_rank_00_model_states.pt")
    return out


def _index_run(run: Path, shard_b: str, make_b=None) -> Path:
    import torch
    from safetensors.torch import save_file

    ck = run / "checkpoint-100"
    ck.mkdir(parents=True)
    save_file({"a": torch.ones(3)}, ck / "model-00001-of-00002.safetensors")
    if make_b:
        make_b(ck)
    (ck / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": shard_b}}))
    return run


CASES = {
    "shard_symlink": lambda run, out: _index_run(run, "model-00002-of-00002.safetensors", lambda ck: os.symlink(
        out / "secret.safetensors", ck / "model-00002-of-00002.safetensors")),
    "shard_under_symlinked_folder": lambda run, out: _index_run(
        run, "sub/model-00002-of-00002.safetensors", lambda ck: os.symlink(out / "shards", ck / "sub")),
    "shard_dotdot": lambda run, out: _index_run(run, "../../outside/secret.safetensors"),
    "shard_absolute": lambda run, out: _index_run(run, str(out / "secret.safetensors")),
}


def _freeze_atimes(out: Path) -> dict:
    old = {}
    for p in out.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(1_577_836_800 * 10**9, p.stat().st_mtime_ns))
            old[p] = p.stat().st_atime_ns
    return old


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_index_shard_outside_the_run_is_named_and_never_opened(tmp_path, case):
    out = _outside(tmp_path)
    run = CASES[case](tmp_path / "run", out)
    atimes = _freeze_atimes(out)
    _OPENED.clear()
    _WATCH[:] = [str(out)]
    try:
        v = audit_in_process(run, {}, out_dir=tmp_path / "audit")
        with pytest.raises(NoUsableCheckpointError):
            safe_load_checkpoint(run)  # was: weights read from outside the run, as a warm start
    finally:
        _WATCH.clear()
    (u,) = v["units"]
    found = [f for f in u["findings"] if f["kind"] == "path_outside_run"]
    assert found and u["usable_for"] == "none" and v["recommendation"] == "retrain", u["findings"]
    assert all(f["layer"] == "security" and f["severity"] == "error" for f in found)
    assert any(str(out) in f["message"] for f in found), found
    assert _OPENED == []
    assert {p: p.stat().st_atime_ns for p in atimes} == atimes


@pytest.mark.parametrize("how", ["text_latest", "symlink_latest"])
def test_a_pointer_out_of_the_run_is_path_outside_run(tmp_path, how):
    import torch

    out = _outside(tmp_path)
    run = tmp_path / "run"
    g = run / "global_step100"
    g.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "global_steps": 100}, g / "mp_rank_00_model_states.pt")
    if how == "text_latest":  # DeepSpeed reads the tag and joins it to the load directory
        (run / "latest").write_text("../outside/global_step900")
    else:
        os.symlink(out / "global_step900", run / "latest")
    atimes = _freeze_atimes(out)
    v = audit_in_process(run, {}, out_dir=tmp_path / "audit")
    (p,) = v["pointers"]
    assert (p["path"], p["ok"], p["kind"]) == ("latest", False, "path_outside_run"), p
    (f,) = [f for f in v["pointer_findings"] if f["path"] == "latest"]
    assert str(out / "global_step900") in f["message"] and f["layer"] == "security"
    assert v["rollback"]["unit"] == "global_step100"  # the run's own unit is still judged
    assert {q: q.stat().st_atime_ns for q in atimes} == atimes


def test_a_fifo_named_as_a_shard_is_a_finding_in_seconds(tmp_path):
    run = _index_run(tmp_path / "run", "model-00002-of-00002.safetensors",
                     lambda ck: os.mkfifo(ck / "model-00002-of-00002.safetensors"))
    t0 = time.monotonic()
    v = audit_in_process(run, {}, out_dir=tmp_path / "audit")
    assert time.monotonic() - t0 < 10
    (u,) = v["units"]
    assert u["usable_for"] == "none"
    assert any(f["kind"] == "not_a_regular_file" and "FIFO" in f["message"] for f in u["findings"]), u["findings"]


# ---------------------------------------------------------------------------------------------------------
# Every other field a run names (issue 24): Lightning's ``last.ckpt`` link, Megatron's tracker, ``.sha256``
# sidecars (the link itself and the name inside it), ckptaudit manifests' file entries, a DeepSpeed tag
# folder that is a link, and a DCP ``.metadata`` storage path.  Each run also holds one good unit, which is
# still the rollback point.

def _pt(path: Path, step: int) -> Path:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.ones(2)}, "step": step}, path)
    return path


def _sha(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


def _all_findings(v: dict) -> list:
    fl = [f for u in v["units"] for f in u["findings"]] + list(v["pointer_findings"])
    return fl + [e["finding"] for e in v.get("resume_entries", []) if e.get("finding")]


def _lightning(run: Path, out: Path):
    import torch

    run.mkdir(parents=True)
    for d, step in ((run, 50), (out, 900)):
        torch.save({"state_dict": {"w": torch.ones(2)}, "global_step": step, "epoch": 0,
                    "pytorch-lightning_version": "2.1.0", "optimizer_states": [], "lr_schedulers": []},
                   d / f"epoch=0-step={step}.ckpt")
    os.symlink(out / "epoch=0-step=900.ckpt", run / "last.ckpt")  # save_last="link", pointed out of the run
    return "last.ckpt", out / "epoch=0-step=900.ckpt", "epoch=0-step=50.ckpt"


def _megatron_unit(run: Path, it: int) -> None:
    import torch

    d = run / f"iter_{it:07d}" / "mp_rank_00"
    d.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(2)}, "iteration": it, "checkpoint_version": 3.0}, d / "model_optim_rng.pt")


def _megatron(run: Path, out: Path):
    _megatron_unit(run, 50)
    (out / "tracker.txt").write_text("900")
    # Megatron's tracker holds an iteration number (or "release"), never a path: only a link can leave the run
    os.symlink(out / "tracker.txt", run / "latest_checkpointed_iteration.txt")
    return "latest_checkpointed_iteration.txt", out / "tracker.txt", "iter_0000050"


def _file_units(run: Path):
    _pt(run / "ckpt_000050.pt", 50)
    return _pt(run / "ckpt_000100.pt", 100)


def _sidecar_link(run: Path, out: Path):
    p = _file_units(run)
    (out / "stolen.sha256").write_text(f"{_sha(p)}  ckpt_000100.pt\n")
    os.symlink(out / "stolen.sha256", run / "ckpt_000100.pt.sha256")
    return "ckpt_000100.pt.sha256", out / "stolen.sha256", "ckpt_000050.pt"


def _sidecar_names(named_of):
    def make(run: Path, out: Path):  # `sha256sum -c` opens the name the sidecar lists
        p = _file_units(run)
        named = named_of(out)
        (run / "ckpt_000100.pt.sha256").write_text(f"{_sha(p)}  {named}\n")
        return "ckpt_000100.pt.sha256", out / "secret.safetensors", "ckpt_000050.pt"
    return make


def _manifest_link(run: Path, out: Path):
    p = _file_units(run)
    (out / "stolen.manifest.json").write_text(json.dumps({"schema": "ckptaudit.manifest/1", "files": [
        {"path": "ckpt_000100.pt", "size_bytes": p.stat().st_size, "sha256_hex": _sha(p)}]}))
    os.symlink(out / "stolen.manifest.json", run / "ckpt_000100.pt.manifest.json")
    return "ckpt_000100.pt.manifest.json", out / "stolen.manifest.json", "ckpt_000050.pt"


def _folder_manifest_link(run: Path, out: Path):  # was: the publish layout's claim read 64 bytes of it
    _pt(run / "checkpoint-50" / "model.pt", 50)
    _pt(run / "checkpoint-100" / "model.pt", 100)
    (out / "stolen.manifest.json").write_text(json.dumps({"schema": "ckptaudit.manifest/1", "files": []}))
    os.symlink(out / "stolen.manifest.json", run / "checkpoint-100" / "manifest.json")
    return "checkpoint-100/manifest.json", out / "stolen.manifest.json", "checkpoint-50"


def _manifest_names(named_of):
    def make(run: Path, out: Path):  # a manifest entry's path is relative to the manifest's folder
        p = _file_units(run)
        named = named_of(out)
        files = [{"path": "ckpt_000100.pt", "size_bytes": p.stat().st_size, "sha256_hex": _sha(p), "role": "mixed"},
                 {"path": named, "size_bytes": 8, "sha256_hex": "0" * 64, "role": "weights"}]
        (run / "ckpt_000100.pt.manifest.json").write_text(json.dumps(
            {"schema": "ckptaudit.manifest/1", "unit": "ckpt_000100.pt", "step": 100, "files": files}))
        return "ckpt_000100.pt.manifest.json", out / "secret.safetensors", "ckpt_000050.pt"
    return make


def _ds_unit(run: Path, step: int) -> None:
    import torch

    g = run / f"global_step{step}"
    g.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "global_steps": step}, g / "mp_rank_00_model_states.pt")


def _ds_tag_folder_link(run: Path, out: Path):
    _ds_unit(run, 50)
    os.symlink(out / "global_step900", run / "global_step900")  # the tag's folder itself is a link
    (run / "latest").write_text("global_step900")
    return "global_step900", out / "global_step900", "global_step50"


DCP_CASE = Path(__file__).resolve().parents[2] / "shared" / "cases" / "ok_dcp" / "step-6"


def _dcp(relpath_of):
    def make(run: Path, out: Path):
        import pickle
        import shutil

        import torch.distributed.checkpoint  # noqa: F401 - the classes .metadata pickles

        if not DCP_CASE.is_dir():
            pytest.skip("shared DCP case missing")
        run.mkdir(parents=True)
        shutil.copytree(DCP_CASE, run / "step-6")
        shutil.copytree(DCP_CASE, run / "step-12")
        (out / "dcp").mkdir()
        shutil.copy(DCP_CASE / "__0_0.distcp", out / "dcp" / "__0_0.distcp")
        md = run / "step-12" / ".metadata"
        m = pickle.loads(md.read_bytes())  # the test's own file
        relp = relpath_of(run / "step-12", out)
        for info in m.storage_data.values():
            object.__setattr__(info, "relative_path", relp)
        md.write_bytes(pickle.dumps(m))
        return "step-12/.metadata", out / "dcp" / "__0_0.distcp", "step-6"
    return make


def _dcp_folder_link(unit: Path, out: Path) -> str:
    os.symlink(out / "dcp", unit / "sub")
    return "sub/__0_0.distcp"


FIELDS = {
    "lightning_last_symlink": _lightning,
    "megatron_tracker_symlink": _megatron,
    "sidecar_symlink": _sidecar_link,
    "sidecar_names_dotdot": _sidecar_names(lambda out: "../outside/secret.safetensors"),
    "sidecar_names_absolute": _sidecar_names(lambda out: str(out / "secret.safetensors")),
    "manifest_symlink": _manifest_link,
    "folder_manifest_symlink": _folder_manifest_link,
    "manifest_names_dotdot": _manifest_names(lambda out: "../outside/secret.safetensors"),
    "manifest_names_absolute": _manifest_names(lambda out: str(out / "secret.safetensors")),
    "deepspeed_tag_folder_symlink": _ds_tag_folder_link,
    "dcp_storage_dotdot": _dcp(lambda unit, out: "../../outside/dcp/__0_0.distcp"),
    "dcp_storage_absolute": _dcp(lambda unit, out: str(out / "dcp" / "__0_0.distcp")),
    "dcp_storage_symlinked_folder": _dcp(_dcp_folder_link),
}


@pytest.mark.parametrize("case", sorted(FIELDS))
def test_every_field_pointing_outside_the_run_is_path_outside_run(tmp_path, case):
    out = _outside(tmp_path)
    run = tmp_path / "run"
    field, target, good = FIELDS[case](run, out)
    atimes = _freeze_atimes(out)
    _OPENED.clear()
    _WATCH[:] = [str(out)]
    try:
        v = audit_in_process(run, {}, out_dir=tmp_path / "audit")
        ck = safe_load_checkpoint(run, load=False)  # the reader side judges the same and reads nothing outside
    finally:
        _WATCH.clear()
    assert Path(ck.path).resolve() == (run / good).resolve(), ck.path
    found = [f for f in _all_findings(v) if f["kind"] == "path_outside_run" and f["path"] == field]
    assert found, [(f["kind"], f["path"]) for f in _all_findings(v)]
    assert any(str(target) in f["message"] for f in found), found
    assert all(f["layer"] == "security" and f["severity"] == "error" for f in found)
    assert _OPENED == []
    assert {p: p.stat().st_atime_ns for p in atimes} == atimes
    assert v["rollback"] and v["rollback"]["unit"] == good, (v["rollback"], v["reasons"])


# ---------------------------------------------------------------------------------------------------------
# FIFOs and devices in every field: a finding within seconds, never an open that blocks or reads forever.

def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _zero_device(p: Path) -> None:  # /dev/zero's numbers: reads never end
    import stat

    try:
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("mknod needs root (CAP_MKNOD)")


def _sp_latest(run: Path, make):
    _ds_unit(run, 50)
    make(run / "latest")
    return "latest", "global_step50"


def _sp_tracker(run: Path, make):
    _megatron_unit(run, 50)
    make(run / "latest_checkpointed_iteration.txt")
    return "latest_checkpointed_iteration.txt", "iter_0000050"


def _sp_sidecar(run: Path, make):
    _file_units(run)
    make(run / "ckpt_000050.pt.sha256")
    return "ckpt_000050.pt.sha256", "ckpt_000100.pt"


def _sp_manifest(run: Path, make):
    _file_units(run)
    make(run / "ckpt_000050.pt.manifest.json")
    return "ckpt_000050.pt.manifest.json", "ckpt_000100.pt"


def _hf_folder(d: Path, step: int) -> None:
    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    save_file({"w": torch.ones(2)}, d / "model.safetensors")
    torch.save({"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]}, d / "optimizer.pt")
    torch.save({"last_epoch": step}, d / "scheduler.pt")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 1.0, "log_history": []}))


def _sp_folder_manifest(run: Path, make):  # a folder unit as ckptaudit.publish writes it: its manifest.json
    _pt(run / "checkpoint-50" / "model.pt", 50)
    _pt(run / "checkpoint-100" / "model.pt", 100)
    make(run / "checkpoint-100" / "manifest.json")  # was: the publish layout's claim opened it and blocked
    return "checkpoint-100/manifest.json", "checkpoint-50"


def _sp_trainer_state(run: Path, make):
    _hf_folder(run / "checkpoint-50", 50)
    _hf_folder(run / "checkpoint-100", 100)
    (run / "checkpoint-100" / "trainer_state.json").unlink()
    make(run / "checkpoint-100" / "trainer_state.json")
    return "checkpoint-100/trainer_state.json", "checkpoint-50"


def _sp_dcp_metadata(run: Path, make):
    import shutil

    if not DCP_CASE.is_dir():
        pytest.skip("shared DCP case missing")
    run.mkdir(parents=True)
    shutil.copytree(DCP_CASE, run / "step-6")
    shutil.copytree(DCP_CASE, run / "step-12")
    (run / "step-12" / ".metadata").unlink()
    make(run / "step-12" / ".metadata")
    return "step-12/.metadata", "step-6"


def _sp_unit_file(run: Path, make):
    _pt(run / "ckpt_000050.pt", 50)
    make(run / "ckpt_000100.pt")
    return "ckpt_000100.pt", "ckpt_000050.pt"


SPECIAL_FIELDS = {"latest": _sp_latest, "megatron_tracker": _sp_tracker, "sidecar": _sp_sidecar,
                  "manifest": _sp_manifest, "folder_manifest": _sp_folder_manifest, "trainer_state": _sp_trainer_state, "dcp_metadata": _sp_dcp_metadata,
                  "unit_file": _sp_unit_file}


@pytest.mark.parametrize("make", [_fifo, _zero_device], ids=["fifo", "chardev"])
@pytest.mark.parametrize("field", sorted(SPECIAL_FIELDS))
def test_a_fifo_or_device_in_any_field_is_a_finding_in_seconds(tmp_path, field, make):
    run = tmp_path / "run"
    import signal

    path, good = SPECIAL_FIELDS[field](run, make)

    class Hung(Exception):  # not an OSError: no `except OSError` of the audit swallows it
        pass

    def hung(*_):  # an open that blocks fails the test instead of hanging the suite
        raise Hung(f"the audit blocked on {path}")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    t0 = time.monotonic()
    try:
        v = audit_in_process(run, {}, out_dir=tmp_path / "audit")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 10
    named = [f for f in _all_findings(v) if f["path"] == path or path in f["message"]]
    assert named and any(f["severity"] in ("error", "warning") for f in named), \
        [(f["kind"], f["path"]) for f in _all_findings(v)]
    assert v["rollback"] and v["rollback"]["unit"] == good, (v["rollback"], v["reasons"])
