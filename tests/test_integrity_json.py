"""Megatron-Core's ``integrity.json`` is read, checked and written: a stale rank file that keeps every CRC-32 is caught.

The failure this guards against: iteration 20's rank file copied over iteration 30's (same size, every record's
CRC-32 valid).  Megatron-Core >= 0.17.1 with ``--verify-integrity`` refuses iteration 30 (hash mismatch), a load
without it silently takes iteration 20's values, and the audit called iteration 30 usable because it ignored the
manifest.

Runs are written by ``torch.distributed.checkpoint.save`` itself (one process, ``no_dist=True``) into Megatron's
folder names (``iter_0000010``…) beside its tracker; ``integrity.json`` is written by :func:`facts_write`, a
re-implementation of Megatron's ``save_integrity_manifest`` from the format's facts (megatron-core 0.16.1, the newest
installable, predates the format).  :func:`facts_verify` re-implements Megatron's ``verify_integrity_manifest`` from
the same facts, independently of ckptaudit: what ckptaudit writes must pass it, what ckptaudit calls damaged must
fail it.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest

from ckptaudit import tables
from ckptaudit.formats import integrity_json as IJ
from ckptaudit.pipeline import audit_in_process

SAVE = textwrap.dedent("""
    import sys, warnings
    import torch
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for it in (10, 20, 30):
        for _ in range(2):
            model(torch.randn(4, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "train_state": {"step": it}}
        dcp.save(state, checkpoint_id=f"{sys.argv[1]}/iter_{it:07d}", no_dist=True)
    open(f"{sys.argv[1]}/latest_checkpointed_iteration.txt", "w").write("30")
""")
ITERS = ("iter_0000010", "iter_0000020", "iter_0000030")


class FactsVerifyError(Exception):
    """What Megatron's ``CheckpointingException`` from ``verify_integrity_manifest`` stands for here."""


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):  # the facts: 1 MiB reads
            h.update(block)
    return h.hexdigest()


def facts_write(folder) -> None:
    """Megatron's ``save_integrity_manifest`` as the facts describe it: every regular top-level file but itself,
    dot-files included, not recursive, bare names in path order, ``json.dumps(..., indent=2)``, a plain write."""
    files = {p.name: _sha256(p) for p in sorted(folder.iterdir(), key=str) if p.is_file() and p.name != IJ.NAME}
    (folder / IJ.NAME).write_text(json.dumps({"algorithm": "sha256", "files": files}, indent=2))


def facts_verify(folder) -> None:
    """Megatron's ``verify_integrity_manifest`` as the facts describe it (rank 0's part): the manifest read with
    ``json.load`` (a torn or empty one raises), a missing ``algorithm`` is sha256 and any other raises, every listed
    file re-hashed, a missing one or a mismatch raises naming each; files not listed are ignored."""
    path = folder / IJ.NAME
    if not path.exists():
        raise FactsVerifyError(f"integrity manifest not found at {path}")
    with open(path) as f:
        doc = json.load(f)
    algorithm = doc.get("algorithm", "sha256")
    if algorithm != "sha256":
        raise FactsVerifyError(f"unsupported hash algorithm {algorithm!r}")
    bad = []
    for name, want in doc["files"].items():
        try:
            got = _sha256(folder / name)
        except OSError as e:
            bad.append(f"{name}: file missing or unreadable ({e})")
            continue
        if got != want:
            bad.append(f"{name}: hash mismatch")
    if bad:
        raise FactsVerifyError("\n".join(bad))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    pytest.importorskip("torch")
    run = tmp_path_factory.mktemp("megatron-dcp") / "run"
    subprocess.run([sys.executable, "-c", SAVE, str(run)], check=True)
    return run


@pytest.fixture
def sealed(saved, tmp_path):
    """A copy of the run with an ``integrity.json`` in every iteration folder, as Megatron's save writes it."""
    run = tmp_path / "run"
    shutil.copytree(saved, run)
    for it in ITERS:
        facts_write(run / it)
    return run


def _audit(run, out):
    v = audit_in_process(run, {}, out_dir=out)
    rows = tables.read_rows(out / "tables" / "hash.parquet")  # every part's rows: the table written once
    return v, {u["unit"]: u for u in v["units"]}, rows


def _kinds(unit):
    return [f["kind"] for f in unit["findings"]]


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x10]))


# ------------------------------------------------------------------ the format itself
def test_parse_reads_a_document_as_megatron_verification_does():
    good = {"algorithm": "sha256", "files": {".metadata": "a" * 64, "__0_0.distcp": "b" * 64}}
    p = IJ.parse(json.dumps(good).encode())
    assert p.problems == [] and p.digests == good["files"]
    assert IJ.parse(json.dumps({"files": good["files"]}).encode()).problems == []  # no algorithm: sha256
    cases = {
        b"": ("empty (0 bytes)", "json.JSONDecodeError"),
        json.dumps(good, indent=2).encode()[:60]: ("not JSON", "json.JSONDecodeError"),
        b"[]": ("not an object", "AttributeError"),
        b'{"algorithm": "sha256"}': ('no "files" object', "KeyError: 'files'"),
        json.dumps({**good, "algorithm": "md5"}).encode(): ("algorithm is 'md5'", "CheckpointingException"),
        json.dumps({"files": {"x.distcp": "A" * 64}}).encode(): ("not 64 lowercase hex", "CheckpointingException"),
        json.dumps({"files": {"../iter_0000020/x": "a" * 64}}).encode(): ("not a bare file name", "Checkpointing"),
    }
    for raw, (problem, raises) in cases.items():
        p = IJ.parse(raw)
        assert p.problems and problem in p.problems[0] and p.raises.startswith(raises), (raw, p)


def test_render_is_the_bytes_megatron_writes():
    digests = {"__1_0.distcp": "c" * 64, ".metadata": "a" * 64, "__0_0.distcp": "b" * 64, "common.pt": "d" * 64}
    raw = IJ.render(digests)
    assert raw == json.dumps({"algorithm": "sha256", "files": digests}, indent=2, sort_keys=True).encode()
    assert not raw.endswith(b"\n") and list(json.loads(raw)["files"]) == sorted(digests)


# ------------------------------------------------------------------ read and verified in the hash stage
def test_an_intact_run_is_verified_by_its_integrity_json(sealed, tmp_path):
    v, u, rows = _audit(sealed, tmp_path / "out")
    assert v["recommendation"] == "resume" and v["rollback"]["unit"] == "iter_0000030"
    for it in ITERS:
        assert not [f for f in u[it]["findings"] if f["severity"] == "error"], u[it]["findings"]
        assert "sidecar_missing" not in _kinds(u[it])
        assert not [f for f in u[it]["findings"] if f["path"].endswith(IJ.NAME)]  # no unit, leftover or unknown file
    assert set(u) == set(ITERS)
    mine = {r["file"]: r for r in rows if r["unit"] == "iter_0000030"}
    assert set(mine) == {"iter_0000030/.metadata", "iter_0000030/__0_0.distcp"}  # integrity.json: no row of its own
    listed = json.loads((sealed / "iter_0000030" / IJ.NAME).read_text())["files"]
    for rel, r in mine.items():
        assert (r["expected_source"], r["verified"]) == ("integrity.json", True)
        assert r["expected_sha256_hex"] == r["sha256_hex"] == listed[rel.split("/")[1]]


def test_a_flipped_byte_is_an_error_naming_the_file_and_its_digests(sealed, tmp_path):
    from torch.distributed.checkpoint import FileSystemReader

    unit = sealed / "iter_0000030"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = FileSystemReader(str(unit)).read_metadata()
    place = next(info for idx, info in meta.storage_data.items() if idx.fqn == "model.0.weight")
    want = json.loads((unit / IJ.NAME).read_text())["files"]["__0_0.distcp"]
    _flip(unit / "__0_0.distcp", place.offset + place.length // 2)  # inside the tensor's record
    v, u, _ = _audit(sealed, tmp_path / "out")
    f = next(f for f in u["iter_0000030"]["findings"] if f["kind"] == "integrity_mismatch")
    got = _sha256(unit / "__0_0.distcp")
    assert f["severity"] == "error" and f["layer"] == "file" and f["path"] == "iter_0000030/__0_0.distcp"
    assert f"SHA-256 is {got} but iter_0000030/integrity.json records {want}" in f["message"]
    assert "dcp_chunk_crc_mismatch" in _kinds(u["iter_0000030"])  # the record's own CRC-32 fails too
    assert u["iter_0000030"]["usable_for"] == "none" and v["rollback"]["unit"] == "iter_0000020"
    with pytest.raises(FactsVerifyError, match="__0_0.distcp: hash mismatch"):
        facts_verify(unit)


def test_a_stale_rank_file_from_an_older_iteration_is_caught_only_by_integrity_json(sealed, tmp_path):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    unit = sealed / "iter_0000030"
    old = sealed / "iter_0000020" / "__0_0.distcp"
    assert old.stat().st_size == (unit / "__0_0.distcp").stat().st_size
    shutil.copyfile(old, unit / "__0_0.distcp")
    v, u, _ = _audit(sealed, tmp_path / "out")
    assert "dcp_chunk_crc_mismatch" not in _kinds(u["iter_0000030"])  # every record's CRC-32 verifies
    assert "integrity_mismatch" in _kinds(u["iter_0000030"]) and u["iter_0000030"]["usable_for"] == "none"
    assert v["recommendation"] == "resume" and v["rollback"]["unit"] == "iter_0000020"
    with pytest.raises(FactsVerifyError, match="hash mismatch"):
        facts_verify(unit)
    # an unverified load takes iteration 20's state without a word; without the manifest the audit has only what
    # the stale file says: here rank 0's copy holds train_state.step 20 inside iteration 30, a step going back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(unit), str(tmp_path / "stale.pt"))
    assert torch.load(tmp_path / "stale.pt", weights_only=False)["train_state"]["step"] == 20
    os.unlink(unit / IJ.NAME)
    v2, u2, _ = _audit(sealed, tmp_path / "out-unsealed")
    assert "integrity_mismatch" not in _kinds(u2["iter_0000030"])
    assert "step_not_increasing" in _kinds(u2["iter_0000030"]) and u2["iter_0000030"]["usable_for"] != "resume"
    assert v2["rollback"]["unit"] == "iter_0000020"


@pytest.mark.parametrize("damage,why,raises", [
    (lambda raw: raw[: len(raw) // 2], "it is not JSON", "json.JSONDecodeError"),
    (lambda raw: b"", "it is empty (0 bytes)", "json.JSONDecodeError"),
    (lambda raw: raw.replace(b'"sha256"', b'"md5"', 1), "its algorithm is 'md5'", "CheckpointingException"),
], ids=["torn", "empty", "other-algorithm"])
def test_an_unusable_manifest_is_its_own_finding_and_megatron_refuses_the_iteration(sealed, tmp_path, damage, why,
                                                                                    raises):
    from ckptaudit.findings import CATALOGUE

    path = sealed / "iter_0000030" / IJ.NAME
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises((FactsVerifyError, ValueError)):
        facts_verify(path.parent)
    v, u, rows = _audit(sealed, tmp_path / "out")
    f = next(f for f in u["iter_0000030"]["findings"] if f["kind"] == "integrity_manifest_unusable")
    assert f["severity"] == "error" and f["path"] == "iter_0000030/integrity.json"
    assert why in f["message"] and f"raises on it ({raises}" in f["message"]
    assert "does not resume with --verify-integrity" in f["message"] and "roll back" in f["next_step"]
    assert f["repair"] == (f"mv {path} {path}.unusable && ckptaudit seal {sealed}")
    assert CATALOGUE["integrity_manifest_unusable"].caps == "none"
    assert "sidecar_missing" not in _kinds(u["iter_0000030"])
    assert u["iter_0000030"]["usable_for"] == "none" and v["rollback"]["unit"] == "iter_0000020"
    assert any(r["file"] == "iter_0000030/integrity.json" for r in rows)


def test_a_listed_file_missing_is_an_error_and_an_unlisted_data_file_is_said(sealed, tmp_path):
    unit = sealed / "iter_0000030"
    doc = json.loads((unit / IJ.NAME).read_text())
    doc["files"]["common.pt"] = "e" * 64  # listed, never there
    (unit / IJ.NAME).write_text(json.dumps(doc, indent=2))
    older = sealed / "iter_0000020"
    doc = json.loads((older / IJ.NAME).read_text())
    del doc["files"][".metadata"]
    (older / IJ.NAME).write_text(json.dumps(doc, indent=2))
    with pytest.raises(FactsVerifyError, match="common.pt: file missing"):
        facts_verify(unit)
    facts_verify(older)  # Megatron ignores what is not listed
    v, u, _ = _audit(sealed, tmp_path / "out")
    f = next(f for f in u["iter_0000030"]["findings"] if f["kind"] == "integrity_file_missing")
    assert f["path"] == "iter_0000030/common.pt" and "e" * 64 in f["message"] and "is not in the folder" in f["message"]
    g = next(f for f in u["iter_0000020"]["findings"] if f["kind"] == "integrity_unlisted")
    assert g["severity"] == "info" and "(iter_0000020/.metadata)" in g["message"]
    assert u["iter_0000020"]["usable_for"] == "resume" and v["rollback"]["unit"] == "iter_0000020"


# ------------------------------------------------------------------ written by seal and the publisher
def test_seal_writes_the_format_megatron_verifies_and_refuses_once_tampered(saved, tmp_path):
    from ckptaudit.publish import seal

    run = tmp_path / "run"
    shutil.copytree(saved, run)
    before = {it: {p.name: _sha256(p) for p in (run / it).iterdir()} for it in ITERS}
    out = seal(run)
    assert [o.action for o in out] == ["sealed"] * 3
    for it in ITERS:
        raw = (run / it / IJ.NAME).read_bytes()
        assert raw == json.dumps({"algorithm": "sha256", "files": before[it]}, indent=2, sort_keys=True).encode()
        facts_verify(run / it)
        assert f"{it}/{IJ.NAME}" in out[ITERS.index(it)].written
    v, u, rows = _audit(run, tmp_path / "out")
    assert not [f for x in v["units"] for f in x["findings"] if f["severity"] == "error"]
    assert all(r["verified"] for r in rows if r["unit"] == "iter_0000030")
    stamp = os.stat(run / "iter_0000030" / IJ.NAME).st_mtime_ns
    assert [o.action for o in seal(run)] == ["already sealed"] * 3  # an existing one that agrees: left alone
    assert os.stat(run / "iter_0000030" / IJ.NAME).st_mtime_ns == stamp

    raw = (run / "iter_0000030" / IJ.NAME).read_bytes()
    _flip(run / "iter_0000030" / "__0_0.distcp", 100)
    with pytest.raises(FactsVerifyError, match="hash mismatch"):
        facts_verify(run / "iter_0000030")
    _, u, _ = _audit(run, tmp_path / "out-tampered")
    assert "integrity_mismatch" in _kinds(u["iter_0000030"])
    last = seal(run)[-1]
    assert last.action == "refused" and "integrity_mismatch" in last.reason
    assert "integrity.json is not overwritten" in last.reason and "evidence" in last.reason
    assert (run / "iter_0000030" / IJ.NAME).read_bytes() == raw


def test_seal_adds_integrity_json_to_a_folder_sealed_before(saved, tmp_path, monkeypatch):
    from ckptaudit.publish import seal

    run = tmp_path / "run"
    shutil.copytree(saved, run)
    with monkeypatch.context() as m:  # a ckptaudit that did not write it yet
        m.setattr(IJ, "iteration_folder", lambda *a, **k: False)
        seal(run)
    assert not (run / "iter_0000030" / IJ.NAME).exists()
    out = seal(run)
    assert [o.action for o in out] == ["sealed"] * 3 and all("wrote integrity.json" in o.reason for o in out)
    listed = json.loads((run / "iter_0000030" / IJ.NAME).read_text())["files"]
    assert set(listed) == {".metadata", ".metadata.sha256", "COMPLETE", "__0_0.distcp", "__0_0.distcp.sha256",
                           "manifest.json"}  # every regular top-level file at the time, as Megatron lists them
    facts_verify(run / "iter_0000030")
    v, u, rows = _audit(run, tmp_path / "out")
    assert not [f for x in v["units"] for f in x["findings"] if f["severity"] == "error"]
    mine = {r["file"]: r for r in rows if r["unit"] == "iter_0000030"}
    assert mine["iter_0000030/COMPLETE"]["verified"] and mine["iter_0000030/manifest.json"]["verified"]

    os.unlink(run / "iter_0000010" / IJ.NAME)  # one the ckptaudit manifest does not list: written again, same bytes
    assert seal(run)[0].action == "sealed"
    facts_verify(run / "iter_0000010")


def test_seal_leaves_a_dcp_folder_that_is_no_megatron_iteration_alone(saved, tmp_path):
    from ckptaudit.publish import seal

    run = tmp_path / "run"
    shutil.copytree(saved / "iter_0000010", run / "step-10")
    assert not IJ.iteration_folder(run / "step-10")
    assert [o.action for o in seal(run)] == ["sealed"]
    assert not (run / "step-10" / IJ.NAME).exists()
    shutil.copytree(saved / "iter_0000010", run / "iter_0000010")
    assert IJ.iteration_folder(run / "iter_0000010") and IJ.iteration_folder(run / "step-10", "release")


def test_write_folder_never_overwrites_a_manifest_that_disagrees(saved, tmp_path):
    folder = tmp_path / "iter_0000010"
    shutil.copytree(saved / "iter_0000010", folder)
    assert IJ.write_folder(folder) == "written"
    raw = (folder / IJ.NAME).read_bytes()
    facts_verify(folder)
    assert IJ.write_folder(folder) == "agrees" and (folder / IJ.NAME).read_bytes() == raw
    _flip(folder / "__0_0.distcp", 100)
    with pytest.raises(IJ.IntegrityConflict, match=r"records other bytes than the folder holds \(__0_0.distcp: "):
        IJ.write_folder(folder)
    (folder / IJ.NAME).write_bytes(raw[:40])
    with pytest.raises(IJ.IntegrityConflict, match="already there and unusable"):
        IJ.write_folder(folder)
    assert (folder / IJ.NAME).read_bytes() == raw[:40]
    assert not [n for n in os.listdir(folder) if n.startswith(".ckptaudit-tmp-")]


def test_the_publisher_writes_it_into_an_iteration_folder(tmp_path):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    from ckptaudit import publish as P

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with P.publish(tmp_path, 30, folder=True, name="iter_0000030") as pub:
            dcp.save({"w": torch.arange(8.0)}, checkpoint_id=pub.dir, no_dist=True)
        with P.publish(tmp_path, 40, folder=True, name="checkpoint-40") as pub:
            dcp.save({"w": torch.arange(8.0)}, checkpoint_id=pub.dir, no_dist=True)
    unit = tmp_path / "iter_0000030"
    facts_verify(unit)
    listed = json.loads((unit / IJ.NAME).read_text())["files"]
    assert {".metadata", "__0_0.distcp"} <= set(listed) and IJ.NAME not in listed
    assert any(e["path"] == IJ.NAME for e in json.loads((unit / "manifest.json").read_text())["files"])
    assert not (tmp_path / "checkpoint-40" / IJ.NAME).exists()


# ------------------------------------------------------------------ a proof for the reader and for salvage
def test_the_reader_passes_over_a_unit_its_integrity_json_refuses(sealed):
    from ckptaudit import safe_load_checkpoint

    shutil.copyfile(sealed / "iter_0000020" / "__0_0.distcp", sealed / "iter_0000030" / "__0_0.distcp")
    ckpt = safe_load_checkpoint(sealed, load=False)
    # the metadata pass already sees the stale rank's train_state.step (20 inside iteration 30) and passes over it
    # before any byte is read; integrity.json's mismatch is then not needed to skip it
    assert ckpt.unit == "iter_0000020" and ckpt.skipped["iter_0000030"].split(":")[0] in (
        "integrity_mismatch", "step_not_increasing")


def test_salvage_takes_a_rank_file_integrity_json_refuses_as_lost(sealed):
    from ckptaudit.intact import INTACT, LOST, unit_tensors

    ts, _ = unit_tensors(sealed / "iter_0000030")
    assert ts and all(t.status == INTACT and "SHA-256 of __0_0.distcp as integrity.json records" in t.proof for t in ts)
    shutil.copyfile(sealed / "iter_0000020" / "__0_0.distcp", sealed / "iter_0000030" / "__0_0.distcp")
    ts, _ = unit_tensors(sealed / "iter_0000030")
    assert ts and all(t.status == LOST and "differs from the one integrity.json records" in t.proof for t in ts)
