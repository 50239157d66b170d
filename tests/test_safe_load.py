"""safe_load_checkpoint falls back past damaged units and explains every skip."""

import logging
import shutil

import pytest

from ckptaudit import safe_load_checkpoint
from ckptaudit.safe_load import NoUsableCheckpointError

from .conftest import CASES


def test_demo_run_falls_back_past_the_truncated_save(demo_run, caplog):
    with caplog.at_level(logging.WARNING, logger="ckptaudit"):
        ckpt = safe_load_checkpoint(demo_run.run_dir)
    assert ckpt.unit == "ckpt_000250.pt"
    assert ckpt.step == 250 == ckpt["iter_num"]
    assert sorted(ckpt.skipped) == ["ckpt_000300.pt"]
    assert ckpt.skipped["ckpt_000300.pt"].startswith("truncated_zip_no_central_directory: ")
    assert "skipping ckpt_000300.pt: truncated_zip_no_central_directory" in caplog.text
    assert set(ckpt.keys()) >= {"model", "optimizer", "model_args", "iter_num", "best_val_loss", "config"}


def test_flipped_byte_is_skipped_when_newer_units_are_gone(demo_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    for s in (200, 250, 300):
        (run / f"ckpt_{s:06d}.pt").unlink()
    ckpt = safe_load_checkpoint(run)
    assert ckpt.unit == "ckpt_000100.pt"
    assert ckpt.skipped["ckpt_000150.pt"].split(":")[0] in ("zip_crc_mismatch", "checksum_mismatch")


def test_every_unit_damaged_lists_each_reason(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(CASES / "empty_file" / "ckpt.pt", run / "ckpt_000100.pt")
    shutil.copy(CASES / "trunc_zip_at_50pct" / "ckpt.pt", run / "ckpt_000200.pt")
    shutil.copy(CASES / "security_malicious_reduce_zip" / "ckpt.pt", run / "ckpt_000300.pt")
    with pytest.raises(NoUsableCheckpointError) as ei:
        safe_load_checkpoint(run)
    e = ei.value
    assert list(e.reasons) == ["ckpt_000300.pt", "ckpt_000200.pt", "ckpt_000100.pt"]
    assert e.reasons["ckpt_000300.pt"].startswith("malicious_pickle_code_exec: ")
    assert e.reasons["ckpt_000200.pt"].startswith("truncated_zip_no_central_directory: ")
    assert e.reasons["ckpt_000100.pt"].startswith("empty_file: ")
    assert str(e).splitlines()[0] == f"{run}: no usable checkpoint (3 unit(s) checked)"


def test_missing_folder_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        safe_load_checkpoint(tmp_path / "nope")
