"""The answer fits what the user pointed the audit at (issue 43).

Pointed at ``/checkpoints/`` holding two runs, the audit named one run's checkpoint as the other's rollback
point; pointed at one ``checkpoint-40/`` folder, it judged the folder's ``optimizer.pt`` and ``rng_state.pth`` as
units without weights and said warm-start; ``safe_load_checkpoint`` refused a checkpoint file that exists; and a
mistyped ``last_good`` path started training from step 0 without a word.  Each test runs the user's command as
written.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptaudit import safe_load_checkpoint
from ckptaudit.integrations import dcp as dcp_int
from ckptaudit.integrations import hf
from ckptaudit.pipeline import audit_in_process

from .conftest import REPO

HF_CASE = REPO / "tests" / "cases" / "fw_hf_trainer_optimizer_deleted"
SHARED = REPO.parent / "shared" / "cases"


def _two_runs(root: Path) -> Path:
    import torch

    for run, width in (("runA", 8), ("runB", 16)):  # two models, each saving steps 100, 200, 300
        (root / run).mkdir(parents=True)
        for step in (100, 200, 300):
            m = torch.nn.Linear(width, width)
            opt = torch.optim.AdamW(m.parameters())
            m(torch.randn(2, width)).sum().backward()
            opt.step()
            torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": step},
                       root / run / f"ckpt_{step:06d}.pt")
    return root


def test_two_runs_in_one_folder_stop_with_one_line_naming_both(tmp_path):
    root = _two_runs(tmp_path / "checkpoints")
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "audit", str(root), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"{root}: holds 2 runs of their own" in r.stderr
    assert f"ckptaudit audit {root}/runA --out" in r.stderr and f"ckptaudit audit {root}/runB --out" in r.stderr
    assert "RESUME" not in r.stdout
    with pytest.raises(ValueError, match="holds 2 runs of their own"):
        audit_in_process(root, {}, out_dir=tmp_path / "o2")
    with pytest.raises(ValueError, match="holds 2 runs of their own"):
        safe_load_checkpoint(root, load=False)
    # each run alone is audited as usual
    v = audit_in_process(root / "runB", {}, out_dir=tmp_path / "o3")
    assert (v["recommendation"], v["rollback"]["unit"]) == ("resume", "ckpt_000300.pt")


def test_rank_folders_and_a_continued_series_are_one_run(tmp_path):
    """``0/`` and ``1/`` hold the ranks of one run (NVRx's layout); ``stage2/`` continuing after ``stage1/``
    ended is the same run saved elsewhere."""
    from ckptaudit.stages.inventory.run_folder import runs_in

    def units(*paths):
        return {"units": [{"unit": p, "step_from_name": int(p.rsplit("_", 1)[-1].split(".")[0])} for p in paths]}

    assert runs_in(units("0/ckpt_10.pt", "0/ckpt_20.pt", "1/ckpt_10.pt", "1/ckpt_20.pt")) == {}
    assert runs_in(units("stage1/ckpt_10.pt", "stage1/ckpt_20.pt", "stage2/ckpt_30.pt", "stage2/ckpt_40.pt")) == {}
    assert runs_in(units("a/ckpt_10.pt", "a/ckpt_20.pt", "b/ckpt_20.pt", "b/ckpt_30.pt")) == {"a": [10, 20],
                                                                                               "b": [20, 30]}


def test_one_trainer_checkpoint_folder_is_audited_as_that_unit(tmp_path):
    ck = tmp_path / "out" / "checkpoint-20"
    shutil.copytree(HF_CASE / "checkpoint-20", ck)
    r = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "audit", str(ck), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RESUME from checkpoint-20 (step 20)" in r.stdout
    v = audit_in_process(ck, {}, out_dir=tmp_path / "o2")
    assert [(u["unit"], u["layout"], u["usable_for"]) for u in v["units"]] == [
        ("checkpoint-20", "hf-trainer", "resume")]
    assert v["run_dir"] == str(ck.parent)
    assert hf.last_good(ck) == str(ck)


def test_one_file_and_one_dcp_folder_are_audited_as_that_unit(tmp_path):
    f = SHARED / "ok_full_torch" / "ckpt.pt"
    ckpt = safe_load_checkpoint(f)
    assert (ckpt.unit, ckpt.path, ckpt.step) == ("ckpt.pt", f, 6)
    assert "model" in ckpt.state
    step = SHARED / "ok_dcp" / "step-6"
    assert dcp_int.last_good(step) == str(step)
    v = audit_in_process(step, {}, out_dir=tmp_path / "o")
    assert (v["recommendation"], v["rollback"]["unit"]) == ("resume", "step-6")


def test_last_good_of_a_missing_path_warns_and_must_exist_raises(tmp_path, caplog):
    typo = tmp_path / "ouptut_dir"
    with caplog.at_level(logging.WARNING, logger="ckptaudit"):
        assert hf.last_good(typo) is None
    assert os.path.abspath(typo) in caplog.text and "step 0" in caplog.text
    with pytest.raises(FileNotFoundError, match=str(typo)):
        hf.last_good(typo, must_exist=True)


def test_an_unsealed_trainer_run_is_never_called_intact(tmp_path):
    """A bit flipped inside an unsealed ``model.safetensors`` passes every check (the format has no checksum):
    the summary says no damage was found and that it cannot be verified, never "intact"; a torch.save run,
    whose every record a CRC-32 covers, is intact."""
    from ckptaudit.outputs.summary import NO_DAMAGE_FOUND, summary, unverified

    run = tmp_path / "out"
    shutil.copytree(HF_CASE / "checkpoint-20", run / "checkpoint-20")
    st = run / "checkpoint-20" / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[-100] ^= 0x01  # inside the last tensor's bytes
    st.write_bytes(bytes(data))
    v = audit_in_process(run, {}, out_dir=tmp_path / "o")
    text = summary(v, tmp_path / "o")
    assert v["units"][0]["usable_for"] == "resume"
    assert f"checkpoint-20 (step 20): {NO_DAMAGE_FOUND}" in text, text
    assert "intact" not in text.replace(NO_DAMAGE_FOUND, "")

    root = _two_runs(tmp_path / "zips")
    v = audit_in_process(root / "runA", {}, out_dir=tmp_path / "o2")
    assert [unverified(u) for u in v["units"]] == [0, 0, 0]  # each record's CRC-32 proved its bytes


def test_one_flipped_byte_is_told_by_its_crc_not_by_genuine_zeros(tmp_path):
    """An embedding whose rows no batch touched keeps zero AdamW moments in every checkpoint; one flipped byte in
    that moment's record made the summary lead with "NUL bytes … a lost or unflushed block"."""
    import torch
    import zipfile

    from ckptaudit.outputs.summary import summary

    run = tmp_path / "run"
    run.mkdir()
    emb = torch.nn.Embedding(4096, 8)
    opt = torch.optim.AdamW(emb.parameters())
    for step in (1, 2):
        emb(torch.tensor([0, 1, 2])).sum().backward()  # rows 3.. never seen: their moments stay 0
        opt.step()
        opt.zero_grad()
        torch.save({"model": emb.state_dict(), "optimizer": opt.state_dict(), "step": step},
                   run / f"ckpt_{step:06d}.pt")
    p = run / "ckpt_000002.pt"
    names = {i.filename: i for i in zipfile.ZipFile(p).infolist()}
    moments = sorted((i for n, i in names.items() if "/data/" in n and not n.endswith("/data/0")),
                     key=lambda i: -i.file_size)
    rec = moments[0]  # exp_avg (or exp_avg_sq) of the embedding: zero on every row no batch touched
    with open(p, "r+b") as fh:
        fh.seek(rec.header_offset + 26)
        n_name, n_extra = int.from_bytes(fh.read(2), "little"), int.from_bytes(fh.read(2), "little")
        fh.seek(rec.header_offset + 30 + n_name + n_extra + 100)  # a byte of the record's data
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x40]))
    v = audit_in_process(run, {}, out_dir=tmp_path / "o")
    kinds = [f["kind"] for f in next(u for u in v["units"] if u["unit"] == p.name)["findings"]]
    assert "zip_crc_mismatch" in kinds and "zero_filled_span" not in kinds
    line = next(ln for ln in summary(v, tmp_path / "o").splitlines() if ln.startswith(f"  {p.name}"))
    assert "CRC32" in line and "NUL" not in line and "lost" not in line, line
