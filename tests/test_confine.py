"""Confinement: a path the run names that leads outside it is ``path_outside_run`` and is never opened (issue 24).

Each field is written the way a hostile or careless run would: an index shard that is a symbolic link to a
file outside, a shard under a symbolically linked folder, an index naming ``../..`` and an absolute path, a
DeepSpeed ``latest`` holding ``../outside/global_step900``, a ``latest`` symbolic link out of the run.  The
outside files never open: their access time (set to 2020 first, so any read moves it) stays, and an audit
hook sees no ``open`` of them in this process or its forked load children.  A FIFO named as a shard is a
finding within seconds, never an open that blocks.
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
