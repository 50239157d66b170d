"""Salvage (ckptaudit.salvage): every tensor whose bytes survive is recovered bit-exact, none whose bytes
changed is called intact, and the report's counts are the ones the damage implies.

Checkpoints are written by torch.save, safetensors' own save_file and ckptaudit.publish; the expectation for
each tensor comes from the original file's own records (zipfile's offsets, the safetensors header), never
from the code under test.  The salvaged files are read back with safetensors' own loader.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ckptaudit import publish as P
from ckptaudit.salvage import SalvageRefused, salvage


def _state(seed: int = 0, n_layers: int = 8, width: int = 128) -> dict:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(n_layers)])
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(2, width)).sum().backward()
    opt.step()
    return {"model": m.state_dict(), "optimizer": opt.state_dict(), "iter_num": 30}


def _flat(obj, prefix: str = "") -> dict:
    out = {}
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def _records(path: Path) -> dict:
    """{storage key: (first data byte, end data byte)} from the intact original (zipfile's own reading)."""
    out = {}
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            if "/data/" not in info.filename:
                continue
            f.seek(info.header_offset + 26)
            n, x = struct.unpack("<HH", f.read(4))
            start = info.header_offset + 30 + n + x
            out[info.filename.rsplit("/", 1)[-1]] = (start, start + info.compress_size)
    return out


def _storage_of(sd: dict) -> dict:
    """{tensor path: storage key} as torch.save numbers storages (order of first appearance in the pickle)."""
    keys, out = {}, {}
    for name, t in _flat(sd).items():
        ptr = t.untyped_storage().data_ptr()
        keys.setdefault(ptr, str(len(keys)))
        out[name] = keys[ptr]
    return out


def _salvaged(out: Path) -> dict:
    got = {}
    for p in sorted(out.glob("*.safetensors")):
        got.update(load_file(str(p)))
    return got


def _report(out: Path) -> dict:
    return json.loads((out / "salvage.json").read_text())


@pytest.mark.parametrize("fraction", [0.10, 0.50, 0.90, 0.99])
def test_torch_zip_cut_short_every_whole_record_is_recovered_bit_exact(tmp_path, fraction):
    sd = _state()
    run = tmp_path / "run"
    run.mkdir()
    src = run / "ckpt_000030.pt"
    torch.save(sd, src)
    recs, storage = _records(src), _storage_of(sd)
    raw = src.read_bytes()
    cut = int(len(raw) * fraction)
    src.write_bytes(raw[:cut])
    report = salvage(src, tmp_path / "out")
    got, want = _salvaged(tmp_path / "out"), _flat(sd)
    # a record whose data and descriptor CRC are before the cut survives; one the cut enters is lost
    survives = {name for name, key in storage.items() if recs[key][1] + 8 <= cut}
    entered = {name for name, key in storage.items() if recs[key][1] > cut}
    assert survives <= set(got) and not (entered & set(got)), (fraction, sorted(entered & set(got)))
    for name, t in got.items():
        assert torch.equal(t, want[name].contiguous()), name
    rows = {r["name"]: r for r in report["tensors"]}
    assert set(rows) == set(want)
    assert report["counts"]["intact"] == len(got) and report["counts"]["lost"] == len(want) - len(got)
    assert all(rows[n]["status"] == "intact" and rows[n]["proof"].startswith("zip record CRC-32") for n in got)
    assert report["written"] == len(got) and report["usable_for"] == "warm start"
    assert (tmp_path / "out" / "ckpt_000030.pt.safetensors.sha256").is_file()
    assert src.read_bytes() == raw[:cut]  # the damaged unit is never changed


def test_torch_zip_zeroed_block_loses_only_the_storages_under_it(tmp_path):
    sd = _state()
    src = tmp_path / "run" / "ckpt_000030.pt"
    src.parent.mkdir()
    torch.save(sd, src)
    recs, storage = _records(src), _storage_of(sd)
    raw = bytearray(src.read_bytes())
    first, end = recs[storage["model.3.weight"]]
    start = (first + 4096) // 4096 * 4096  # one page inside model.3.weight's storage
    raw[start:start + 4096] = bytes(4096)
    src.write_bytes(bytes(raw))
    report = salvage(src, tmp_path / "out")
    got, want = _salvaged(tmp_path / "out"), _flat(sd)
    hit = {n for n, k in storage.items() if recs[k][0] < start + 4096 and recs[k][1] > start}
    assert hit == {"model.3.weight"}
    assert set(got) == set(want) - hit
    assert all(torch.equal(got[n], want[n]) for n in got)
    row = next(r for r in report["tensors"] if r["name"] == "model.3.weight")
    assert row["status"] == "lost" and "CRC-32 differs" in row["proof"]


def test_flipped_byte_with_a_publish_manifest_loses_only_the_chunk_it_is_in(tmp_path):
    """A view sharing its storage with the damaged bytes is still intact when the manifest's chunk digests
    cover its own bytes (the zip's CRC-32 covers the whole storage and cannot tell)."""
    big = torch.arange(4 * 4096, dtype=torch.float32)
    sd = {"head": big[:4096], "tail": big[3 * 4096:], "other": torch.ones(1024)}  # two views of one storage
    run = tmp_path / "run"
    with P.publish(run, 30, chunk_bytes=4096) as pub:
        pub.save(sd)
    src = run / "ckpt_000030.pt"
    recs = _records(src)
    raw = bytearray(src.read_bytes())
    s0 = recs["0"][0]
    flip = s0 + 4096 * 4 + 100  # inside big's third quarter: neither view's bytes
    raw[flip] ^= 0xFF
    src.write_bytes(bytes(raw))
    report = salvage(src, tmp_path / "out")
    rows = {r["name"]: r for r in report["tensors"]}
    got = _salvaged(tmp_path / "out")
    touched = {n for n, r in rows.items() if r["span"][0] // 4096 <= flip // 4096 <= (r["span"][1] - 1) // 4096}
    for n, r in rows.items():
        if n in touched:
            assert r["status"] == "lost" and "chunk digest differs" in r["proof"], r
        else:
            assert r["status"] == "intact" and "BLAKE3 chunk digest" in r["proof"], r
            assert torch.equal(got[n], sd[n].contiguous())
    assert set(got) == set(rows) - touched


def _st_offsets(path: Path) -> dict:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1]) for k, v in head.items()
            if k != "__metadata__"}


def test_safetensors_cut_and_zeroed_without_manifest_are_never_called_intact(tmp_path):
    sd = {f"layer{i}.weight": torch.randn(64, 64) for i in range(8)}
    run = tmp_path / "run"
    run.mkdir()
    src = run / "model.safetensors"
    save_file(sd, str(src))
    spans = _st_offsets(src)
    raw = bytearray(src.read_bytes())
    z0 = (spans["layer2.weight"][0] + 4096) // 4096 * 4096
    raw[z0:z0 + 4096] = bytes(4096)  # a lost block inside layer2 (64*64*4 = 16 KiB)
    cut = spans["layer6.weight"][0] + 100
    src.write_bytes(bytes(raw[:cut]))
    report = salvage(src, tmp_path / "out")
    rows = {r["name"]: r for r in report["tensors"]}
    assert report["counts"] == {"intact": 0, "lost": 2, "unproven": 5, "suspect": 1}
    assert rows["layer2.weight"]["status"] == "suspect"
    assert {n for n, r in rows.items() if r["status"] == "lost"} == {"layer6.weight", "layer7.weight"}
    assert report["written"] == 0 and not list((tmp_path / "out").glob("*.safetensors"))
    report = salvage(src, tmp_path / "out2", include_unproven=True)
    got = _salvaged(tmp_path / "out2")
    assert set(got) == {f"layer{i}.weight" for i in (0, 1, 3, 4, 5)}
    assert all(torch.equal(got[n], sd[n]) for n in got)


def test_safetensors_with_a_manifest_proves_each_tensor(tmp_path):
    sd = {f"layer{i}.weight": torch.randn(64, 64) for i in range(8)}
    run = tmp_path / "run"
    with P.publish(run, 30, name="model.safetensors", chunk_bytes=4096) as pub:
        pub.open().write(__import__("safetensors.torch", fromlist=["save"]).save(sd))
    src = run / "model.safetensors"
    spans = _st_offsets(src)
    raw = bytearray(src.read_bytes())
    z0 = (spans["layer2.weight"][0] + 4096) // 4096 * 4096
    raw[z0:z0 + 4096] = bytes(4096)
    src.write_bytes(bytes(raw))
    report = salvage(src, tmp_path / "out")
    rows = {r["name"]: r for r in report["tensors"]}
    bad = {n for n, (a, b) in spans.items() if a < z0 + 4096 and b > z0}
    assert {n for n, r in rows.items() if r["status"] == "lost"} == bad and "layer2.weight" in bad
    got = _salvaged(tmp_path / "out")
    assert set(got) == set(sd) - bad and all(torch.equal(got[n], sd[n]) for n in got)


def test_fill_from_an_older_unit_names_the_source_and_step(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    old, new = _state(seed=1), _state(seed=2)
    torch.save(old, run / "ckpt_000020.pt")
    torch.save(new, run / "ckpt_000030.pt")
    raw = (run / "ckpt_000030.pt").read_bytes()
    (run / "ckpt_000030.pt").write_bytes(raw[: len(raw) // 2])
    report = salvage(run / "ckpt_000030.pt", tmp_path / "out", fill_from=run / "ckpt_000020.pt")
    rows = {r["name"]: r for r in report["tensors"]}
    got, wnew, wold = _salvaged(tmp_path / "out"), _flat(new), _flat(old)
    assert set(got) == set(wnew) and report["filled"] == report["counts"]["lost"] > 0
    for n, r in rows.items():
        if r["source"]:
            assert r["source"]["step"] == 20 and r["source"]["unit"].endswith("ckpt_000020.pt")
            assert torch.equal(got[n], wold[n])
        else:
            assert torch.equal(got[n], wnew[n])


def test_the_step_comes_from_the_saved_dict_when_the_name_has_none(tmp_path):
    """nanoGPT's ``ckpt.pt`` and Lightning's ``last.ckpt`` carry no step in their names: the salvage report said
    "step unknown" although ``iter_num`` / ``global_step`` sit in data.pkl, before any cut."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": _state(seed=1), "iter_num": 400}, run / "ckpt.pt")
    torch.save({"state_dict": _state(seed=2), "global_step": 30, "epoch": 2}, run / "last.ckpt")
    for name in ("ckpt.pt", "last.ckpt"):
        raw = (run / name).read_bytes()
        (run / name).write_bytes(raw[: len(raw) * 9 // 10])
    report = salvage(run / "ckpt.pt", tmp_path / "a", fill_from=run / "last.ckpt")
    assert report["step"] == 400 and report["counts"]["intact"] > 0
    assert {r["source"]["step"] for r in report["tensors"] if r["source"]} <= {30}
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "last.ckpt"), "--out",
                        str(tmp_path / "b")], capture_output=True, text=True)
    assert r.returncode == 0 and "step 30" in r.stdout and "step unknown" not in r.stdout, (r.stdout, r.stderr)


def test_an_rng_tensor_beside_the_model_dict_keeps_the_load_hint_stripping_model(tmp_path):
    """A new user's loop saved ``{"model": sd, "optimizer": …, "rng": torch.get_rng_state()}``: the top-level
    ``rng`` tensor made the weights prefix "" and the printed hint loaded nothing (strict=False, every key
    unexpected).  The hint, run as printed, now fills the model."""
    run = tmp_path / "run"
    run.mkdir()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 64)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
                "step": 140}, run / "ckpt_000140.pt")
    raw = (run / "ckpt_000140.pt").read_bytes()
    (run / "ckpt_000140.pt").write_bytes(raw[: len(raw) * 95 // 100])
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "ckpt_000140.pt"), "--out",
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    hint = r.stdout.split("a warm start, not a resume: ", 1)[1].split(" (keys are", 1)[0]
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    scope = {"model": fresh, "safetensors": __import__("safetensors.torch")}
    exec(hint, scope)  # the hint as printed
    assert scope["unexpected"] == [] and len(scope["missing"]) < 4
    for k, v in fresh.state_dict().items():
        if k not in scope["missing"]:
            assert torch.equal(v, model.state_dict()[k])


def test_refused_inside_the_run_or_over_an_existing_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    torch.save(_state(), run / "ckpt_000030.pt")
    with pytest.raises(SalvageRefused, match="inside the run folder"):
        salvage(run / "ckpt_000030.pt", run / "salvaged")
    (tmp_path / "exists").mkdir()
    with pytest.raises(SalvageRefused, match="already exists"):
        salvage(run / "ckpt_000030.pt", tmp_path / "exists")
    with pytest.raises(SalvageRefused, match="no such"):
        salvage(run / "missing.pt", tmp_path / "o")
    assert sorted(os.listdir(run)) == ["ckpt_000030.pt"]


def test_cli_exit_codes_and_summary(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    sd = _state()
    torch.save(sd, run / "ckpt_000030.pt")
    raw = (run / "ckpt_000030.pt").read_bytes()
    (run / "ckpt_000030.pt").write_bytes(raw[: len(raw) // 2])
    cmd = [sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "ckpt_000030.pt")]
    r = subprocess.run(cmd + ["--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "proven intact" in r.stdout and "model.load_state_dict({k[6:]: v" in r.stdout
    r = subprocess.run(cmd + ["--out", str(run / "x")], capture_output=True, text=True)
    assert r.returncode == 3 and "inside the run folder" in r.stderr
    (run / "empty.pt").write_bytes(raw[:100])  # not even data.pkl
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "empty.pt"), "--out",
                        str(tmp_path / "none")], capture_output=True, text=True)
    assert r.returncode == 1 and "nothing of the unit itself is proven intact" in r.stdout, (r.stdout, r.stderr)


@pytest.mark.slow
def test_dcp_unit_missing_one_rank_keeps_the_tensors_without_a_chunk_there(tmp_path):
    """FSDP2 + DCP on 2 gloo ranks (tests/frameworks/fw_fsdp_dcp), rank 1's __1_0.distcp of the newest save
    deleted: every tensor with a chunk in that file is lost, every other one is recovered equal to what
    torch's own dcp_to_torch_save reads from the untouched save."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from tests.frameworks import fw_fsdp_dcp as D

    run, _, _ = D._run(tmp_path / "gen")
    unit = run / "checkpoint" / "step-30"
    dcp_to_torch_save(str(unit), str(tmp_path / "whole.pt"))
    whole = _flat(torch.load(tmp_path / "whole.pt", weights_only=False))
    meta = FileSystemReader(str(unit)).read_metadata()
    tensor_fqns = {k for k, v in meta.state_dict_metadata.items() if hasattr(v, "chunks")}
    on_rank1 = {idx.fqn for idx, info in meta.storage_data.items() if info.relative_path == "__1_0.distcp"}
    os.unlink(unit / "__1_0.distcp")
    report = salvage(unit, tmp_path / "out")
    rows = {r["name"]: r for r in report["tensors"]}
    assert set(rows) == tensor_fqns
    assert {n for n, r in rows.items() if r["status"] == "lost"} == tensor_fqns & on_rank1
    assert report["counts"]["intact"] == len(tensor_fqns - on_rank1) > 0
    assert any(f["file"] == "__1_0.distcp" and f["kind"] == "missing" for f in report["files"])
    got = _salvaged(tmp_path / "out")
    assert set(got) == tensor_fqns - on_rank1
    for n, t in got.items():
        assert torch.equal(t, whole[n]), n


@pytest.mark.slow
def test_deepspeed_tag_missing_one_partition_keeps_every_other_file(tmp_path):
    """DeepSpeed ZeRO-2 on 2 gloo ranks (tests/frameworks/fw_deepspeed), rank 1's optimizer partition of the
    newest tag deleted: the module weights and rank 0's partition are recovered bit-exact, and the report
    names the missing partition as the audit's layout does (ds_rank_files_missing)."""
    from tests.frameworks import fw_deepspeed as D

    run, _, _ = D._run(tmp_path / "gen", 2)
    unit = run / "global_step30"
    gone = unit / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    want = {}
    for p in sorted(unit.glob("*.pt")):
        if p != gone:
            want.update({f"{p.name}:{k}": v for k, v in _flat(torch.load(p, weights_only=False)).items()})
    os.unlink(gone)
    report = salvage(unit, tmp_path / "out")
    assert report["counts"]["lost"] == 0 and report["counts"]["intact"] == len(want)
    missing = [f for f in report["files"] if f["kind"] == "missing"]
    assert [f["file"] for f in missing] == [gone.name], report["files"]
    got = {}
    for f, out_name in report["outputs"].items():
        got.update({f"{f}:{k}": v for k, v in load_file(str(tmp_path / "out" / out_name)).items()})
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k].contiguous()) for k in got)
    weights = [k for k in got if k.startswith("mp_rank_00_model_states.pt:module.")]
    assert weights, sorted(got)[:5]


def test_warm_start_from_a_salvaged_unit_is_closer_to_its_step_than_the_older_unit(tmp_path):
    """A small regression trained 400 steps, saved at 100 and 400; the step-400 save cut short in its
    optimizer state (torch.save writes the model first) and salvaged with --fill-from the step-100 save:
    warm-started from the result, the loss is the step-400 model's, far below the step-100 model's."""
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = torch.sin(x @ torch.randn(16, 1))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    run = tmp_path / "run"
    run.mkdir()

    def loss_of(m) -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(m(x), y))

    for step in range(1, 401):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step in (100, 400):
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step},
                       run / f"ckpt_{step:06d}.pt")
            if step == 100:
                loss_100 = loss_of(model)
    loss_400 = loss_of(model)
    newest = run / "ckpt_000400.pt"
    raw = newest.read_bytes()
    newest.write_bytes(raw[: int(len(raw) * 0.6)])
    report = salvage(newest, tmp_path / "out", fill_from=run / "ckpt_000100.pt")
    sd = load_file(str(tmp_path / "out" / "ckpt_000400.pt.safetensors"))
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    res = fresh.load_state_dict({k[6:]: v for k, v in sd.items() if k.startswith("model.")}, strict=False)
    assert not res.missing_keys and report["filled"] > 0
    warm = loss_of(fresh)
    assert abs(warm - loss_400) < abs(loss_100 - loss_400), (warm, loss_400, loss_100)
    assert warm == pytest.approx(loss_400, rel=1e-6)


def _run_with_cut_newest(run: Path, fraction: float) -> None:
    run.mkdir(parents=True)
    for step in (100, 200, 300):
        sd = _state(seed=step)
        sd["iter_num"] = step
        torch.save(sd, run / f"ckpt_{step:06d}.pt")
    p = run / "ckpt_000300.pt"
    raw = p.read_bytes()
    p.write_bytes(raw[: int(len(raw) * fraction)])


def test_verdict_offers_salvage_with_a_command_that_runs_as_printed(tmp_path):
    """The newest unit cut after its weights (torch.save writes the model first): the verdict rolls back to
    step 200 and offers a salvage of step 300 with --fill-from step 200; the printed command runs."""
    import shlex

    from ckptaudit.pipeline import audit_in_process

    run = tmp_path / "run"
    _run_with_cut_newest(run, 0.45)
    v = audit_in_process(run, out_dir=tmp_path / "audit")
    assert v["rollback"]["unit"] == "ckpt_000200.pt"
    s = v["salvage"]
    assert s["unit"] == "ckpt_000300.pt" and s["weights_share"] == 1.0 and s["steps_kept"] == 100
    assert s["sentence"] in v["reasons"] and "--fill-from" in s["command"]
    import html

    assert html.escape(s["command"], quote=False) in (tmp_path / "audit" / "report.html").read_text()  # postmortem
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli"] + shlex.split(s["command"])[1:], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads((Path(shlex.split(s["command"])[4]) / "salvage.json").read_text())
    assert rep["counts"]["intact"] + rep["filled"] == len(rep["tensors"])
    assert list(run.iterdir()) and sorted(p.name for p in run.iterdir()) == [
        "ckpt_000100.pt", "ckpt_000200.pt", "ckpt_000300.pt"]


def test_verdict_offers_no_salvage_when_the_weights_are_lost_or_below_the_share(tmp_path):
    from ckptaudit.pipeline import audit_in_process

    run = tmp_path / "run"
    _run_with_cut_newest(run, 0.10)  # inside the first weights: most of them lost
    assert audit_in_process(run, out_dir=tmp_path / "a")["salvage"] is None
    run2 = tmp_path / "run2"
    _run_with_cut_newest(run2, 0.45)
    v = audit_in_process(run2, {"salvage": {"min_weights_share": 1.0}}, out_dir=tmp_path / "b")
    assert v["salvage"] is not None  # every weight intact: 1.0 is met
    healthy = tmp_path / "healthy"
    healthy.mkdir()
    torch.save(_state(), healthy / "ckpt_000100.pt")
    assert audit_in_process(healthy, out_dir=tmp_path / "c")["salvage"] is None


def test_what_a_new_user_tried(tmp_path):
    """Cases from a new user's trial: a unit through a symbolic link, a run folder given as the unit, a
    manifest listing text files, a complex64 tensor, --fill-from that cannot fill, the load hint of a
    Lightning-shaped dict, and the exit code when nothing of the unit itself is intact."""
    from ckptaudit.cli.salvage import load_hint

    run = tmp_path / "run"
    run.mkdir()
    sd = _state()
    torch.save(sd, run / "ckpt_000300.pt")
    links = tmp_path / "links"
    links.mkdir()
    (links / "ck.pt").symlink_to(run / "ckpt_000300.pt")
    with pytest.raises(SalvageRefused, match="inside the run folder"):
        salvage(links / "ck.pt", run / "via-link")  # the link's target decides the run folder
    rep = salvage(links / "ck.pt", tmp_path / "o1")
    assert rep["step"] == 300 and rep["unit"] == str((run / "ckpt_000300.pt").resolve())
    with pytest.raises(SalvageRefused, match="not a checkpoint unit: it holds 1 units"):
        salvage(run, tmp_path / "o2")

    with P.publish(tmp_path / "pub", 5, folder=True) as pub:  # a sealed folder with text files beside the data
        pub.save({"model": {"w": torch.ones(3)}}, "model.pt")
        pub.open("config.json").write(b"{}")
    rep = salvage(tmp_path / "pub" / "checkpoint-5", tmp_path / "o3")
    assert [f for f in rep["files"] if f["kind"] == "missing"] == []

    odd = tmp_path / "odd"
    odd.mkdir()
    torch.save({"model": {"z": torch.ones(4, dtype=torch.complex64), "w": torch.ones(2)}}, odd / "ckpt_000001.pt")
    rep = salvage(odd / "ckpt_000001.pt", tmp_path / "o4")
    z = _salvaged(tmp_path / "o4")["model.z"]
    assert rep["written"] == 2 and torch.equal(z, torch.ones(4, dtype=torch.complex64))

    other = tmp_path / "other"
    other.mkdir()
    torch.save({"net": {"x": torch.ones(2)}}, other / "ckpt_000100.pt")
    raw = (run / "ckpt_000300.pt").read_bytes()
    first = min(a for a, _ in _records(run / "ckpt_000300.pt").values())
    (run / "ckpt_000300.pt").write_bytes(raw[:first + 10])  # data.pkl whole, no storage: nothing of its own intact
    rep = salvage(run / "ckpt_000300.pt", tmp_path / "o5", fill_from=other / "ckpt_000100.pt")
    assert rep["filled"] == 0 and rep["not_filled"]["absent"] == len(rep["tensors"]) == len(_flat(sd))
    torch.save(sd, run / "ckpt_000200.pt")
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "salvage", str(run / "ckpt_000300.pt"), "--out",
                        str(tmp_path / "o6"), "--fill-from", str(run / "ckpt_000200.pt")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "filled from" in r.stdout, r.stdout  # all filled, none of its own: exit 1
    rows = json.loads((tmp_path / "o6" / "salvage.json").read_text())["tensors"]
    assert {x["status"] for x in rows} == {"filled"} and all(x["source"]["step"] == 200 for x in rows)

    light = tmp_path / "light"
    light.mkdir()
    m = torch.nn.Linear(4, 4)
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    torch.save({"state_dict": m.state_dict(), "optimizer_states": [opt.state_dict()], "global_step": 30},
               light / "epoch=2-step=30.ckpt")
    rep = salvage(light / "epoch=2-step=30.ckpt", tmp_path / "o7")
    hint = load_hint(rep, str(tmp_path / "o7"))
    assert "k.startswith('state_dict.')" in hint and "{k[11:]: v" in hint
    sd7 = load_file(str(tmp_path / "o7" / "epoch=2-step=30.ckpt.safetensors"))
    fresh = torch.nn.Linear(4, 4)
    res = fresh.load_state_dict({k[11:]: v for k, v in sd7.items() if k.startswith("state_dict.")}, strict=False)
    assert not res.missing_keys and torch.equal(fresh.weight, m.weight)


def test_a_symbolic_link_in_a_folder_unit_is_never_opened(tmp_path):
    """The trust boundary: a link inside a folder unit may lead out of the run; salvage names it, never reads
    it (its target's atime, set in the past, stays)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    torch.save({"secret": torch.ones(3)}, outside / "secret.pt")
    os.utime(outside / "secret.pt", ns=(1_577_836_800 * 10**9, (outside / "secret.pt").stat().st_mtime_ns))
    atime = (outside / "secret.pt").stat().st_atime_ns
    unit = tmp_path / "run" / "checkpoint-5"
    unit.mkdir(parents=True)
    torch.save({"model": {"w": torch.ones(2)}}, unit / "model.pt")
    (unit / "optimizer.pt").symlink_to(outside / "secret.pt")
    rep = salvage(unit, tmp_path / "out")
    assert [(f["file"], f["kind"]) for f in rep["files"] if f["kind"] == "not read"] == [("optimizer.pt", "not read")]
    assert [t["name"] for t in rep["tensors"]] == ["model.w"]
    assert (outside / "secret.pt").stat().st_atime_ns == atime


def test_verdict_offers_no_salvage_of_a_unit_whose_walk_was_cut(tmp_path, monkeypatch):
    """The same cut newest unit as above, with the walk's opcode budget made smaller than its data.pkl: the scan
    reports ``pickle_too_complex`` and the verdict offers no salvage, whose shares would then count only the
    tensors named before the cut."""
    from ckptaudit.pickle_walk import budgets
    from ckptaudit.pipeline import audit_in_process

    run = tmp_path / "run"
    _run_with_cut_newest(run, 0.45)
    monkeypatch.setattr(budgets, "MAX_OPS", 1500)  # of ~2,100 opcodes: most tensors named, then cut
    monkeypatch.setattr(budgets, "OPS_PER_RECORD", 1)
    v = audit_in_process(run, out_dir=tmp_path / "audit")
    newest = next(u for u in v["units"] if u["unit"] == "ckpt_000300.pt")
    cut = [f for f in newest["findings"] if f["kind"] == "pickle_too_complex"]
    assert [f["detail"]["cut"] for f in cut] == ["walk"]  # the walk stopped, not only the described tree
    assert newest["usable_for"] != "resume"
    assert v["salvage"] is None
    # `ckptaudit salvage` on the same unit says its list is partial instead of reporting shares as if whole
    from ckptaudit.intact import unit_tensors

    tensors, rows = unit_tensors(run / "ckpt_000300.pt", run)
    assert 0 < len(tensors) < 50 and "stopped at its work budget" in rows[0]["problem"], rows
