"""ckptaudit.publish: the writer side (atomic publish, sidecars, manifest, latest, multi-rank,
retention, seal, preemption) and the audit's reading of what it writes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import blake3
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptaudit.stages import hash as hashing
from ckptaudit import discovery as inventory
from ckptaudit import publish as P
from ckptaudit.publish import names as publish_names
from ckptaudit.safe_load import safe_load_checkpoint

REPO = Path(__file__).resolve().parent.parent


def state(step: int, n: int = 64) -> dict:
    """A small real training state (Linear + AdamW after one step, scheduler, RNG)."""
    torch.manual_seed(step)
    m = torch.nn.Linear(n, n)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    m(torch.randn(2, n)).sum().backward()
    opt.step()
    sch = torch.optim.lr_scheduler.StepLR(opt, 10)
    return {"model": m.state_dict(), "optimizer": opt.state_dict(), "scheduler": sch.state_dict(),
            "rng": torch.get_rng_state(), "iter_num": step, "config": {"lr": 1e-3}}


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def names(d: Path) -> list:
    return sorted(os.listdir(d))


# ------------------------------------------------------------------ file units
def test_save_writes_file_sidecar_manifest_and_latest(tmp_path):
    res = P.save(state(100), tmp_path, 100, config={"lr": 1e-3, "obj": object}, metrics={"val_loss": 2.5},
                 chunk_bytes=16384)
    f = tmp_path / "ckpt_000100.pt"
    assert names(tmp_path) == ["ckpt_000100.pt", "ckpt_000100.pt.manifest.json", "ckpt_000100.pt.sha256", "latest"]
    data = f.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert (tmp_path / "ckpt_000100.pt.sha256").read_text() == f"{digest}  ckpt_000100.pt\n"
    raw = (tmp_path / "ckpt_000100.pt.manifest.json").read_bytes()
    assert raw[:64].startswith(b'{\n "schema": "ckptaudit.manifest/2"')
    doc = json.loads(raw)
    assert doc["step"] == 100 and doc["world_size"] == 1 and doc["unit"] == "ckpt_000100.pt"
    assert doc["config"] == {"lr": 1e-3, "obj": str(object)} and doc["metrics"] == {"val_loss": 2.5}
    assert doc["versions"]["torch"] == torch.__version__ and doc["versions"]["python"]
    (e,) = doc["files"]
    assert e["path"] == "ckpt_000100.pt" and e["size_bytes"] == len(data) and e["sha256_hex"] == digest
    assert e["chunk_bytes"] == 16384
    assert e["chunk_blake3_hex"] == [blake3.blake3(data[i:i + 16384]).hexdigest()
                                     for i in range(0, len(data), 16384)]
    assert len(e["chunk_blake3_hex"]) == -(-len(data) // 16384) >= 3
    assert (tmp_path / "latest").read_text() == "ckpt_000100.pt"
    assert res.unit == "ckpt_000100.pt" and res.size_bytes == len(data) and res.latest_updated
    assert res.seconds["fsync_seconds"] > 0 and res.seconds["total_seconds"] >= res.seconds["commit_seconds"]
    loaded = torch.load(f, weights_only=True)
    assert loaded["iter_num"] == 100 and torch.equal(loaded["model"]["weight"], state(100)["model"]["weight"])


@pytest.mark.skipif(shutil.which("sha256sum") is None, reason="coreutils sha256sum not installed")
def test_sidecars_and_marker_check_with_coreutils(tmp_path):
    P.save(state(1), tmp_path, 1)
    with P.publish(tmp_path, 2, folder=True) as pub:
        pub.save(state(2), "a.pt")
        pub.save({"x": torch.ones(3)}, "sub/b.pt")
    out = subprocess.run(["sha256sum", "-c", "ckpt_000001.pt.sha256"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ckpt_000001.pt: OK\n"
    out = subprocess.run(["sha256sum", "-c", "COMPLETE", "a.pt.sha256"], cwd=tmp_path / "checkpoint-2",
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "manifest.json: OK\na.pt: OK\n"


def test_exception_in_block_publishes_nothing(tmp_path):
    P.save(state(1), tmp_path, 1)
    before = names(tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        with P.publish(tmp_path, 2) as pub:
            with pub.open() as w:
                w.write(b"partial")
            raise RuntimeError("boom")
    assert names(tmp_path) == before and (tmp_path / "latest").read_text() == "ckpt_000001.pt"
    with pytest.raises(RuntimeError, match="boom"):
        with P.publish(tmp_path, 3, folder=True) as pub:
            pub.save(state(3), "model.pt")
            raise RuntimeError("boom")
    assert names(tmp_path) == before


def test_existing_unit_is_never_replaced(tmp_path):
    P.save(state(1), tmp_path, 1)
    digest = sha(tmp_path / "ckpt_000001.pt")
    with pytest.raises(P.PublishError) as ei:
        P.save(state(99), tmp_path, 1, supersede=False)
    assert "FileExistsError" in ei.value.causes["rank 0 (start)"]
    assert "a unit with this name already exists" in str(ei.value)
    assert sha(tmp_path / "ckpt_000001.pt") == digest


def test_a_resume_from_an_earlier_step_moves_the_old_unit_aside_and_goes_on(tmp_path, caplog):
    """A new user's trial: safe_load_checkpoint resumed at step 100 past a damaged ckpt_000120.pt, and the
    loop's save of step 120 raised 'a unit with this name already exists' at every restart.  The old unit
    (bytes, sidecar, manifest) now moves to .ckptaudit-superseded/ untouched; the audit never takes it."""
    import logging

    from ckptaudit import safe_load_checkpoint
    from ckptaudit.pipeline import audit_in_process

    run = tmp_path / "run"
    for step in (100, 120):
        P.save(state(step), run, step)
    raw = bytearray((run / "ckpt_000120.pt").read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # bit rot after the save
    (run / "ckpt_000120.pt").write_bytes(bytes(raw))
    old = {n: (run / n).read_bytes() for n in ("ckpt_000120.pt", "ckpt_000120.pt.sha256",
                                               "ckpt_000120.pt.manifest.json")}
    assert safe_load_checkpoint(run).step == 100
    with caplog.at_level(logging.WARNING, logger="ckptaudit.publish"):
        assert P.save(state(121), run, 120).unit == "ckpt_000120.pt"  # the resumed loop's next save
    [aside] = (run / ".ckptaudit-superseded").iterdir()
    assert aside.name.endswith("-ckpt_000120.pt") and {n: (aside / n).read_bytes() for n in old} == old
    assert any(str(aside) in r.getMessage() for r in caplog.records)
    assert safe_load_checkpoint(run).step == 121
    v = audit_in_process(run, out_dir=tmp_path / "out")
    assert [u["unit"] for u in v["units"]] == ["ckpt_000100.pt", "ckpt_000120.pt"]
    assert v["rollback"]["unit"] == "ckpt_000120.pt" and v["recommendation"] == "resume"


def test_verify_rejects_a_file_changed_before_the_commit(tmp_path):
    """verify=True (the default for multi-rank saves) re-reads every file: bytes that changed
    between the write and the commit must stop the publish."""
    with pytest.raises(P.PublishError) as ei:
        with P.publish(tmp_path, 1, folder=True, verify=True, chunk_bytes=1024) as pub:
            with pub.open("blob.bin") as w:
                w.write(bytes(4096))
            with open(pub.dir / "blob.bin", "r+b") as fh:
                fh.seek(2048)
                fh.write(b"\x01")
    assert ei.value.causes == {"verify 0": "rank 0's file blob.bin: chunk(s) [2] of 1024 bytes differ from what "
                                           "was written"}
    assert names(tmp_path) == []
    with P.publish(tmp_path, 2, folder=True, chunk_bytes=1024) as pub:  # one process: no re-read by default
        with pub.open("blob.bin") as w:
            w.write(bytes(4096))
    assert "verify_seconds" in pub.result.seconds and pub.result.seconds["verify_seconds"] < 0.05


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="step must be an int >= 0, got -1"):
        P.publish(tmp_path, -1)
    with pytest.raises(ValueError, match="a multi-rank publish writes a folder unit"):
        P.publish(tmp_path, 1, rank=0, world_size=2, folder=False)
    with pytest.raises(ValueError, match="needs an initialised torch.distributed process group"):
        P.publish(tmp_path, 1, rank=0, world_size=2)
    with P.publish(tmp_path, 5, folder=True) as pub:
        with pytest.raises(ValueError, match="reserved by the publish protocol"):
            pub.save({}, "manifest.json")
        with pytest.raises(ValueError, match="without '..'"):
            pub.path("../escape.pt")
        pub.save({"a": torch.zeros(1)}, "ok.pt")
    with P.publish(tmp_path, 6) as pub:
        pub.save({"a": torch.zeros(1)})
        with pytest.raises(ValueError, match="a file unit is written once"):
            pub.save({"a": torch.zeros(1)})


def test_latest_only_moves_forward_and_symlink_is_swapped(tmp_path):
    P.save(state(300), tmp_path, 300, latest_symlink="last.ckpt")
    assert os.readlink(tmp_path / "last.ckpt") == "ckpt_000300.pt"
    res = P.save(state(200), tmp_path, 200, latest_symlink="last.ckpt")
    assert res.latest_updated is False
    assert P.read_latest(tmp_path) == "ckpt_000300.pt" and os.readlink(tmp_path / "last.ckpt") == "ckpt_000300.pt"
    ino = os.lstat(tmp_path / "last.ckpt").st_ino
    P.save(state(400), tmp_path, 400, latest_symlink="last.ckpt")
    assert P.read_latest(tmp_path) == "ckpt_000400.pt" and os.readlink(tmp_path / "last.ckpt") == "ckpt_000400.pt"
    assert os.lstat(tmp_path / "last.ckpt").st_ino != ino  # a new link renamed over the old one
    assert not [n for n in names(tmp_path) if n.startswith(".ckptaudit-tmp-")]


# ------------------------------------------------------------------ folder units
def test_folder_unit_layout_marker_and_adoption(tmp_path):
    from safetensors.torch import save_file

    with P.publish(tmp_path, 7, folder=True, config={"n_layer": 2}) as pub:
        assert pub.dir.name.startswith(".ckptaudit-tmp-") and pub.dir.name.endswith("-checkpoint-7")
        pub.save(state(7)["optimizer"], "optimizer.pt")
        save_file({"w": torch.arange(6.0)}, str(pub.path("model.safetensors")))
        with pub.open("notes.bin") as w:
            w.write(b"\x00\x01" * 10)
        (pub.dir / "stray.json").write_text("{}")  # written by no API: adopted at commit
    d = tmp_path / "checkpoint-7"
    assert names(d) == ["COMPLETE", "manifest.json", "model.safetensors", "model.safetensors.sha256", "notes.bin",
                        "notes.bin.sha256", "optimizer.pt", "optimizer.pt.sha256", "stray.json", "stray.json.sha256"]
    doc = json.loads((d / "manifest.json").read_text())
    files = {e["path"]: e for e in doc["files"]}
    assert sorted(files) == ["model.safetensors", "notes.bin", "optimizer.pt", "stray.json"]
    assert files["stray.json"]["rank"] == -1 and files["notes.bin"]["rank"] == 0
    assert files["notes.bin"]["size_bytes"] == 20 and files["notes.bin"]["sha256_hex"] == sha(d / "notes.bin")
    assert (d / "COMPLETE").read_text() == f"{sha(d / 'manifest.json')}  manifest.json\n"
    assert pub.result.files and pub.result.unit == "checkpoint-7" and P.read_latest(tmp_path) == "checkpoint-7"
    units, _, _ = inventory.discover(tmp_path)
    (u,) = units
    assert u.unit == "checkpoint-7" and u.in_progress == "" and "checkpoint-7/COMPLETE" not in u.files
    assert P.verify_unit(tmp_path, u.to_dict()) == (True, "")


def test_folder_manifest_without_marker_is_in_progress(tmp_path):
    """A folder whose publish died between the rename and the marker must never be a rollback point."""
    from ckptaudit.pipeline import audit_in_process

    P.save(state(1), tmp_path, 1)
    with P.publish(tmp_path, 2, folder=True, name="checkpoint-2") as pub:
        pub.save(state(2)["model"], "pytorch_model.bin")
    os.unlink(tmp_path / "checkpoint-2" / "COMPLETE")
    units = {u.unit: u for u in inventory.discover(tmp_path)[0]}
    assert units["checkpoint-2"].in_progress == ("manifest.json written but no COMPLETE marker: a ckptaudit "
                                                 "publish or seal that did not finish")
    assert P.verify_unit(tmp_path, units["checkpoint-2"].to_dict())[0] is False
    v = audit_in_process(tmp_path)
    u2 = next(u for u in v["units"] if u["unit"] == "checkpoint-2")
    assert u2["usable_for"] == "none" and "unit_in_progress" in [f["kind"] for f in u2["findings"]]
    assert v["rollback"] == {"unit": "ckpt_000001.pt", "step": 1}
    # a manifest.json that is not ckptaudit's does not need the marker
    (tmp_path / "checkpoint-2" / "manifest.json").write_text('{"format": "something else"}')
    units = {u.unit: u for u in inventory.discover(tmp_path)[0]}
    assert units["checkpoint-2"].in_progress == ""


def test_temp_leftovers_are_in_progress(tmp_path):
    P.save(state(1), tmp_path, 1)
    tmp_file = tmp_path / P.tmp_name("ckpt_000002.pt")
    shutil.copy(tmp_path / "ckpt_000001.pt", tmp_file)
    ck = safe_load_checkpoint(tmp_path)
    assert ck.unit == "ckpt_000001.pt" and ck.skipped[tmp_file.name].startswith("in-progress save")


# ------------------------------------------------------------------ hashing of published units
@pytest.mark.parametrize("schema", ["ckptaudit.manifest/2", "ckptaudit.manifest/1"])
def test_chunk_mismatch_names_byte_range_and_tensor(tmp_path, schema):
    """Chunk digests as written now (BLAKE3, /2) and as written before (SHA-256, /1: the manifest is turned
    back into that form, every other byte as published) verify, and a flipped byte is found in its chunk."""
    big = {"model": {"a": torch.zeros(4096), "b": torch.ones(4096)}, "iter_num": 3}
    P.save(big, tmp_path, 3, chunk_bytes=4096)
    f = tmp_path / "ckpt_000003.pt"
    if schema.endswith("/1"):
        mp = tmp_path / "ckpt_000003.pt.manifest.json"
        doc = json.loads(mp.read_text())
        data = f.read_bytes()
        (e,) = doc["files"]
        del e["chunk_blake3_hex"]
        e["chunk_sha256_hex"] = [hashlib.sha256(data[i:i + 4096]).hexdigest() for i in range(0, len(data), 4096)]
        doc["schema"] = schema
        mp.write_text(json.dumps(doc, indent=1))
    units = {u.unit: u.to_dict() for u in inventory.discover(tmp_path)[0]}
    (row,) = hashing.hash_unit(tmp_path, units["ckpt_000003.pt"])
    assert row["verified"] is True and row["sha256_hex"] == sha(f) and row["expected_source"] == "manifest"
    # flip one byte inside tensor "model.b" (16 KiB of float32 ones)
    import zipfile

    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo("archive/data/1")
    with open(f, "rb") as fh:
        fh.seek(info.header_offset + 26)
        n, x = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
    off = info.header_offset + 30 + n + x + 5000
    with open(f, "r+b") as fh:
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0xFF]))
    (row,) = hashing.hash_unit(tmp_path, units["ckpt_000003.pt"])
    assert row["verified"] is False and row["sha256_hex"] == sha(f)
    (fd,) = [x for x in json.loads(row["findings_json"]) if x["kind"] == "chunk_checksum_mismatch"]
    chunk = off // 4096
    assert fd["detail"]["start"] == chunk * 4096 and fd["detail"]["last"] == chunk * 4096 + 4095
    assert fd["detail"]["chunks"] == str(chunk) and fd["severity"] == "error"
    assert "model.b" in fd["message"] and "model.a" not in fd["message"]
    algorithm = "BLAKE3" if schema.endswith("/2") else "SHA-256"
    assert f"{algorithm} chunk digest(s) recorded in the manifest" in fd["message"]
    assert not [x for x in json.loads(row["findings_json"]) if x["kind"] == "checksum_mismatch"]
    assert P.verify_unit(tmp_path, units["ckpt_000003.pt"])[0] is False


def test_manifest_file_missing(tmp_path):
    with P.publish(tmp_path, 4, folder=True, name="global_step4") as pub:
        pub.save({"module": state(4)["model"]}, "mp_rank_00_model_states.pt")
        pub.save({"optimizer_state_dict": {}}, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    os.unlink(tmp_path / "global_step4" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    units = {u.unit: u.to_dict() for u in inventory.discover(tmp_path)[0]}
    rows = {r["file"]: r for r in hashing.hash_unit(tmp_path, units["global_step4"])}
    miss = rows["global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    (fd,) = json.loads(miss["findings_json"])
    assert fd["kind"] == "manifest_file_missing" and miss["verified"] is False and miss["size_bytes"] is None
    assert fd["message"].startswith("global_step4/zero_pp_rank_0_mp_rank_00_optim_states.pt is listed in "
                                    "global_step4/manifest.json (")
    assert rows["global_step4/mp_rank_00_model_states.pt"]["verified"] is True


# ------------------------------------------------------------------ multi-rank (gloo)
def _rank_main(rank, world_size, store, run_dir, mode, out):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    result = {"rank": rank}
    try:
        with P.publish(run_dir, 10, folder=True, name="global_step10", config={"ws": world_size}) as pub:
            if mode == "dcp":
                import torch.distributed.checkpoint as dcp

                dcp.save({"w": torch.full((8,), float(rank))}, checkpoint_id=pub.dir)
            else:
                if rank == 0:
                    pub.save({"module": {"w": torch.ones(4)}}, "mp_rank_00_model_states.pt")
                if mode == "fail" and rank == 1:
                    raise RuntimeError("rank 1 ran out of memory")
                pub.save({"optimizer_state_dict": {"rank": rank}}, f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        result["unit"] = pub.result.unit
        result["files"] = sorted(f.path for f in pub.result.files)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(e).__name__}: {e}"
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _run_ranks(tmp_path, mode, world_size=2):
    import torch.multiprocessing as mp

    run = tmp_path / "run"
    out = tmp_path / "out"
    out.mkdir()
    mp.start_processes(_rank_main, args=(world_size, str(tmp_path / "store"), str(run), mode, str(out)),
                       nprocs=world_size, start_method="fork")
    return run, [json.loads((out / f"rank{r}.json").read_text()) for r in range(world_size)]


def test_multi_rank_publish_with_gloo(tmp_path):
    run, res = _run_ranks(tmp_path, "ok")
    want = ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert [r.get("error") for r in res] == [None, None]
    assert res[0]["files"] == res[1]["files"] == want and res[1]["unit"] == "global_step10"
    doc = json.loads((run / "global_step10" / "manifest.json").read_text())
    assert {e["path"]: e["rank"] for e in doc["files"]} == dict(zip(want, [0, 0, 1]))
    assert doc["world_size"] == 2 and doc["config"] == {"ws": 2}
    assert (run / "global_step10" / "COMPLETE").exists() and P.read_latest(run) == "global_step10"
    (u,) = inventory.discover(run)[0]
    assert P.verify_unit(run, u.to_dict()) == (True, "")


def test_multi_rank_failure_on_one_rank_publishes_nothing(tmp_path):
    run, res = _run_ranks(tmp_path, "fail")
    assert res[1]["error"] == "RuntimeError: rank 1 ran out of memory"
    assert res[0]["error"].startswith("PublishError: global_step10: not published (1 cause(s))\n  rank 1: "
                                      "RuntimeError: rank 1 ran out of memory")
    assert names(run) == []


def test_multi_rank_dcp_files_are_adopted(tmp_path):
    run, res = _run_ranks(tmp_path, "dcp")
    assert res[0]["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    d = run / "global_step10"
    assert names(d) == [".metadata", ".metadata.sha256", "COMPLETE", "__0_0.distcp", "__0_0.distcp.sha256",
                        "__1_0.distcp", "__1_0.distcp.sha256", "manifest.json"]
    doc = json.loads((d / "manifest.json").read_text())
    assert {e["path"]: e["rank"] for e in doc["files"]} == {".metadata": -1, "__0_0.distcp": -1, "__1_0.distcp": -1}


# ------------------------------------------------------------------ retention
def _units(run):
    return sorted(n for n in names(run) if n.endswith(".pt") and not n.startswith("."))


def test_prune_rules_and_dry_run(tmp_path, capsys):
    for s in range(10, 110, 10):
        P.save(state(s), tmp_path, s, metrics={"val_loss": abs(s - 40) / 10})
    plan = P.prune(tmp_path, keep_last=2, keep_every=50, keep_best=1, metric="val_loss", dry_run=True)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"would delete ckpt_{s:06d}.pt (step {s}): verified, older than the rollback point "
                       "ckpt_000100.pt, kept by no rule" for s in (80, 70, 60, 30, 20, 10)]
    assert len(_units(tmp_path)) == 10 and plan.rollback == "ckpt_000100.pt"
    reasons = {d.unit: d.reason for d in plan.decisions if d.action == "keep"}
    assert reasons == {"ckpt_000100.pt": "rollback point (newest verified unit)",
                       "ckpt_000090.pt": "one of the 2 newest (keep_last)",
                       "ckpt_000050.pt": "step is a multiple of 50 (keep_every)",
                       "ckpt_000040.pt": "val_loss=0 is among the 1 best (keep_best)"}
    P.prune(tmp_path, keep_last=2, keep_every=50, keep_best=1, metric="val_loss")
    assert _units(tmp_path) == ["ckpt_000040.pt", "ckpt_000050.pt", "ckpt_000090.pt", "ckpt_000100.pt"]
    assert not [n for n in names(tmp_path) if n.startswith(("ckpt_000010", ".ckptaudit-tmp-"))]
    with pytest.raises(ValueError, match="prune needs at least one of keep_last, keep_every, keep_best"):
        P.prune(tmp_path)
    with pytest.raises(ValueError, match="keep_best needs metric="):
        P.prune(tmp_path, keep_best=1)


def test_prune_never_deletes_unverified_or_latest_and_protects_rollback(tmp_path):
    for s in (1, 2, 3, 4):
        P.save(state(s), tmp_path, s)
    # newest is damaged: the rollback point is step 3, and nothing newer than it may go
    with open(tmp_path / "ckpt_000004.pt", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff\xff")
    # an older unit that does not verify is left for the audit
    with open(tmp_path / "ckpt_000001.pt", "r+b") as fh:
        fh.seek(200)
        fh.write(b"\x00\x00\x01")
    P.update_latest(tmp_path, "ckpt_000002.pt", 2)  # not forward: stays at step 4
    assert P.read_latest(tmp_path) == "ckpt_000004.pt"
    (tmp_path / "latest").write_text("ckpt_000002.pt")
    plan = P.prune(tmp_path, keep_last=1)
    d = {x.unit: (x.action, x.reason) for x in plan.decisions}
    assert plan.rollback == "ckpt_000003.pt"
    # the damaged newest unit is kept as evidence but is not one of the keep_last=1 verified units
    assert d["ckpt_000004.pt"][0] == "keep" and d["ckpt_000004.pt"][1].startswith("does not verify (")
    assert d["ckpt_000003.pt"] == ("keep", "rollback point (newest verified unit)")
    assert d["ckpt_000002.pt"] == ("keep", "named by latest")
    assert d["ckpt_000001.pt"][0] == "keep" and d["ckpt_000001.pt"][1].startswith("does not verify (chunk_checksum")
    assert _units(tmp_path) == ["ckpt_000001.pt", "ckpt_000002.pt", "ckpt_000003.pt", "ckpt_000004.pt"]


def test_retention_after_publish_and_sweep_of_dead_writers(tmp_path):
    leftover = tmp_path / f"{P.TMP_PREFIX}{publish_names.host_tag()}-999999999-deadbeef-ckpt_000001.pt"
    tmp_path.mkdir(exist_ok=True)
    leftover.write_bytes(b"PK\x03\x04 half a save")
    alive = tmp_path / P.tmp_name("ckpt_000002.pt")  # this process is alive: never swept
    alive.write_bytes(b"PK\x03\x04")
    r = None
    for s in (10, 20, 30):
        r = P.save(state(s), tmp_path, s, retention=P.Retention(keep_last=2, sweep_stale=True))
    assert r.pruned == ["ckpt_000010.pt"]
    assert _units(tmp_path) == ["ckpt_000020.pt", "ckpt_000030.pt"]
    assert not leftover.exists() and alive.exists()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["save", "save", "save", "crash", "crash_folder", "corrupt",
                                               "delete", "prune"]),
                              st.integers(1, 4), st.integers(0, 3), st.booleans()),
                    min_size=1, max_size=14))
def test_retention_property_newest_verified_unit_survives(tmp_path_factory, ops):
    """Over random saves, crashes (temp leftovers, folders without marker), corruption, user
    deletions and prunes, prune never deletes the newest verified unit nor any unit that does
    not verify, and never leaves a unit torn."""
    run = tmp_path_factory.mktemp("prop")
    step = 0
    for op, k, every, flag in ops:
        step += 1
        if op == "save":
            if flag:
                with P.publish(run, step, folder=True) as pub:
                    pub.save(state(step, 8), "pytorch_model.bin")
            else:
                P.save(state(step, 8), run, step, metrics={"loss": float(k)})
        elif op == "crash":  # killed before the commit rename
            (run / P.tmp_name(f"ckpt_{step:06d}.pt")).write_bytes(b"PK\x03\x04torn")
        elif op == "crash_folder":  # killed between the folder rename and the marker
            with P.publish(run, step, folder=True) as pub:
                pub.save(state(step, 8), "pytorch_model.bin")
            os.unlink(run / f"checkpoint-{step}" / "COMPLETE")
        elif op == "corrupt":
            cands = _units(run)
            if cands:
                victim = run / cands[k % len(cands)]
                data = bytearray(victim.read_bytes())
                data[len(data) // 2] ^= 0xFF
                victim.write_bytes(bytes(data))
        elif op == "delete":
            cands = _units(run)
            if cands:
                os.unlink(run / cands[k % len(cands)])
        else:
            units = [u.to_dict() for u in inventory.discover(run)[0]]
            status = {u["unit"]: P.verify_unit(run, u)[0] for u in units}
            stepped = [u for u in units if u["step_from_name"] is not None and not u["in_progress"]]
            newest = max((u for u in stepped if status[u["unit"]]), key=lambda u: u["step_from_name"], default=None)
            P.prune(run, keep_last=k, keep_every=(every or None), keep_best=(1 if flag else None),
                    metric="loss", sweep_stale=flag)
            after = {u.unit: u.to_dict() for u in inventory.discover(run)[0]}
            if newest is not None:
                assert newest["unit"] in after and P.verify_unit(run, after[newest["unit"]]) == (True, "")
            for name, ok in status.items():
                if not ok:
                    assert name in after or name.startswith(P.TMP_PREFIX), f"prune deleted unverified {name}"
            for u in after.values():  # nothing torn: every unit is in progress or verifies as before
                if not u["in_progress"] and u["unit"] in status:
                    assert P.verify_unit(run, u)[0] == status[u["unit"]]


# ------------------------------------------------------------------ seal
def _data_files(run: Path) -> dict:
    out = {}
    for dirpath, _, filenames in os.walk(run):
        for fn in filenames:
            if fn.endswith((".sha256", ".manifest.json")) or fn in ("manifest.json", "COMPLETE"):
                continue
            p = Path(dirpath) / fn
            out[str(p.relative_to(run))] = (p.stat().st_mtime_ns, sha(p))
    return out


def test_seal_demo_run_refuses_damaged_units(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    for sc in run.glob("*.sha256"):
        sc.unlink()  # a run that never had sidecars
    (run / "hf").mkdir()
    with P.publish(run / "hf", 1, folder=True) as pub:  # a folder unit to seal after the fact
        pub.save(state(1)["model"], "pytorch_model.bin")
    for extra in ("COMPLETE", "manifest.json", "pytorch_model.bin.sha256"):
        os.unlink(run / "hf" / "checkpoint-1" / extra)
    before = _data_files(run)
    out = {o.unit: o for o in P.seal(run)}
    assert _data_files(run) == before  # never touches data files
    assert out[demo_run.truncated].action == "refused"
    assert "truncated_zip_no_central_directory" in out[demo_run.truncated].reason
    assert out[demo_run.flipped].action == "refused" and "zip_crc_mismatch" in out[demo_run.flipped].reason
    for name in demo_run.intact:
        assert out[name].action == "sealed" and out[name].written == [f"{name}.sha256", f"{name}.manifest.json"]
        assert (run / f"{name}.sha256").read_text() == f"{sha(run / name)}  {name}\n"
    hf = out["hf/checkpoint-1"]
    assert hf.action == "sealed" and hf.written == ["hf/checkpoint-1/pytorch_model.bin.sha256",
                                                     "hf/checkpoint-1/COMPLETE", "hf/checkpoint-1/manifest.json"]
    units = {u.unit: u.to_dict() for u in inventory.discover(run)[0]}
    assert units["hf/checkpoint-1"]["in_progress"] == ""
    for name in demo_run.intact + ["hf/checkpoint-1"]:
        assert P.verify_unit(run, units[name]) == (True, "")
    again = {o.unit: o.action for o in P.seal(run)}
    assert again[demo_run.intact[0]] == "already sealed" and again["hf/checkpoint-1"] == "already sealed"
    r = CliRunner().invoke(_cli(), ["seal", str(run)])
    assert r.exit_code == 1 and f"refused         {demo_run.truncated}: " in r.output


def _cli():
    from ckptaudit.cli import main

    return main


def test_prune_cli(tmp_path):
    for s in (1, 2, 3):
        P.save(state(s), tmp_path, s)
    r = CliRunner().invoke(_cli(), ["prune", str(tmp_path), "--keep-last", "1", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [
        "rollback point: ckpt_000003.pt",
        "keep    ckpt_000003.pt (step 3): rollback point (newest verified unit)",
        "would delete ckpt_000002.pt (step 2): verified, older than the rollback point ckpt_000003.pt, kept by no rule",
        "would delete ckpt_000001.pt (step 1): verified, older than the rollback point ckpt_000003.pt, kept by no rule"]
    assert _units(tmp_path) == ["ckpt_000001.pt", "ckpt_000002.pt", "ckpt_000003.pt"]
    r = CliRunner().invoke(_cli(), ["prune", str(tmp_path), "--keep-last", "1"])
    assert r.exit_code == 0 and _units(tmp_path) == ["ckpt_000003.pt"]
    assert r.output.splitlines()[2:] == [
        "deleted ckpt_000002.pt (step 2): verified, older than the rollback point ckpt_000003.pt, kept by no rule",
        "deleted ckpt_000001.pt (step 1): verified, older than the rollback point ckpt_000003.pt, kept by no rule"]
    r = CliRunner().invoke(_cli(), ["prune", str(tmp_path)])
    assert r.exit_code == 3 and "prune needs at least one of" in r.output


# ------------------------------------------------------------------ preemption
def test_preemption_guard_records_and_restores():
    prev = signal.getsignal(signal.SIGUSR1)
    with P.PreemptionGuard() as g:
        assert not g.should_stop
        os.kill(os.getpid(), signal.SIGUSR1)
        assert g.requested == signal.SIGUSR1 and g.should_stop
    assert signal.getsignal(signal.SIGUSR1) is prev


def test_preemption_abandon_mode_leaves_nothing(tmp_path):
    P.save(state(1), tmp_path, 1)
    before = names(tmp_path)
    with P.PreemptionGuard(mode="abandon") as g:
        with pytest.raises(P.Preempted):
            with P.publish(tmp_path, 2) as pub:
                with pub.open() as w:
                    w.write(b"PK\x03\x04" + b"\x00" * 1000)
                    os.kill(os.getpid(), signal.SIGTERM)
                    w.write(b"never")  # the handler raises before this line
    assert g.requested == signal.SIGTERM and names(tmp_path) == before
    # outside a save the same signal is only recorded
    with P.PreemptionGuard(mode="abandon") as g:
        os.kill(os.getpid(), signal.SIGTERM)
        P.save(state(3), tmp_path, 3)
    assert g.requested == signal.SIGTERM and P.read_latest(tmp_path) == "ckpt_000003.pt"


# ------------------------------------------------------------------ README
def _readme_section() -> str:
    text = (REPO / "docs" / "training-loop.md").read_text()
    start = text.index("## Use in your training loop")
    end = text.find("\n## ", start + 10)
    return text[start:end if end >= 0 else len(text)]


def test_readme_training_loop_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", _readme_section(), re.S)
    assert len(blocks) >= 3
    for b in blocks:
        compile(b, "<README>", "exec")  # the framework callbacks: syntax only (frameworks are optional)
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(blocks[0], "<README loop>", "exec"), ns)  # noqa: S102 - our own README
    assert P.read_latest(tmp_path / "out") == "ckpt_000060.pt"
    assert sorted(n for n in names(tmp_path / "out") if n.endswith(".pt")) == [
        "ckpt_000040.pt", "ckpt_000050.pt", "ckpt_000060.pt"]
    ck = safe_load_checkpoint(tmp_path / "out")
    assert ck.step == 60 and ck["iter_num"] == 60


def test_sweep_removes_orphan_sidecars_and_manifests_only(tmp_path):
    """A kill between writing X.sha256 / X.manifest.json and the rename (or in the middle of
    a prune's delete) leaves them without X; sweep_stale removes exactly those."""
    run = tmp_path
    for s in (1, 2):
        P.save(state(s), run, s)
    sc, mf = (run / "ckpt_000002.pt.sha256").read_text(), (run / "ckpt_000002.pt.manifest.json").read_text()
    # killed before the rename of ckpt_000003.pt, its temp file already swept: both orphaned
    (run / "ckpt_000003.pt.sha256").write_text(sc.replace("ckpt_000002.pt", "ckpt_000003.pt"))
    (run / "ckpt_000003.pt.manifest.json").write_text(mf.replace('"ckpt_000002.pt"', '"ckpt_000003.pt"'))
    # being written right now by another host: its temp file exists, so nothing is touched
    (run / "ckpt_000004.pt.sha256").write_text(sc.replace("ckpt_000002.pt", "ckpt_000004.pt"))
    (run / f"{P.TMP_PREFIX}0badc0de-1-deadbeef-ckpt_000004.pt").write_bytes(b"PK\x03\x04")
    # not ours: a checksum list of several files, and a hand-written sidecar naming another file
    (run / "release-5.sha256").write_text(sc.replace("ckpt_000002.pt", "a.bin") + sc.replace("ckpt_000002.pt", "b.bin"))
    (run / "ckpt_000006.pt.sha256").write_text(sc.replace("ckpt_000002.pt", "other.pt"))
    before = sorted(os.listdir(run))
    plan = P.prune(run, keep_last=5, sweep_stale=True, dry_run=True, echo=None)
    assert sorted(d.unit for d in plan.decisions if d.action == "sweep") == [
        "ckpt_000003.pt.manifest.json", "ckpt_000003.pt.sha256"]
    assert sorted(os.listdir(run)) == before
    P.prune(run, keep_last=5, sweep_stale=False)
    assert sorted(os.listdir(run)) == before
    P.prune(run, keep_last=5, sweep_stale=True)
    assert sorted(set(before) - set(os.listdir(run))) == ["ckpt_000003.pt.manifest.json", "ckpt_000003.pt.sha256"]
    assert _units(run) == ["ckpt_000001.pt", "ckpt_000002.pt"]


def test_replace_swaps_a_file_unit_and_its_digests(tmp_path, monkeypatch):
    """publish(..., replace=True) of a name that exists (Lightning's last.ckpt): the new bytes with their own
    sidecar and manifest; a crash between the steps leaves the old or the new bytes, never beside the other's
    digest (the old digests go first, the new ones come after the rename)."""
    with P.publish(tmp_path, 10, name="last.ckpt") as pub:
        pub.save(state(10))
    with pytest.raises(P.PublishError):
        with P.publish(tmp_path, 20, name="last.ckpt", supersede=False) as pub:
            pub.save(state(20))
    with pytest.raises(ValueError, match="file units"):
        P.publish(tmp_path, 20, name="x", folder=True, replace=True)

    import ckptaudit.publish.commit as C

    seen = []
    real_rename = C.rename_nfs_safe

    def rename(src, dst):  # what is beside last.ckpt at the moment of the rename
        seen.append(sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".ckptaudit-tmp-")))
        return real_rename(src, dst)

    monkeypatch.setattr(C, "rename_nfs_safe", rename)
    with P.publish(tmp_path, 20, name="last.ckpt", replace=True, update_latest=False) as pub:
        pub.save(state(20))
    assert seen == [["last.ckpt", "latest"]]  # old digests gone before the new bytes move in
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["iter_num"] == 20
    digest = hashlib.sha256((tmp_path / "last.ckpt").read_bytes()).hexdigest()
    assert (tmp_path / "last.ckpt.sha256").read_text().split()[0] == digest
    doc = json.loads((tmp_path / "last.ckpt.manifest.json").read_text())
    assert doc["step"] == 20 and doc["files"][0]["sha256_hex"] == digest
    (row,) = hashing.hash_unit(tmp_path, {u.unit: u.to_dict() for u in inventory.discover(tmp_path)[0]}["last.ckpt"])
    assert row["verified"] is True
