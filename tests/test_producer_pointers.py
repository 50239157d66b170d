"""Producers' pointer files, judged by the producer's own rules (ckptaudit/producers/*.py ``pointers``).

Megatron-LM's ``latest_checkpointed_iteration.txt`` holds an iteration number that names ``iter_<N:07d>``,
or ``release`` (Megatron-LM ``training/checkpointing.py``: ``read_metadata``, ``get_checkpoint_name``); any
other text fails its resume, which the audit reports as ``megatron_tracker_invalid``.  The run is the shared
Megatron case (two iterations, the newer with a stale rank file), copied so the tracker can be rewritten.
"""

from __future__ import annotations

import shutil

import pytest

from ckptaudit.pipeline import audit_in_process
from ckptaudit.producers import megatron

from .conftest import CASES


@pytest.fixture
def megatron_run(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(CASES / "megatron_mixed_step_shards", run, ignore=shutil.ignore_patterns("expected.json"))
    return run


def _tracker(v: dict) -> dict:
    return next(p for p in v["pointers"] if p["path"] == megatron.TRACKER)


def _kinds(v: dict) -> list:
    return [f["kind"] for f in v.get("pointer_findings") or []]


def test_an_iteration_number_names_its_iter_folder(megatron_run, tmp_path):
    (megatron_run / megatron.TRACKER).write_text("6\n")
    v = audit_in_process(megatron_run, out_dir=tmp_path / "out")
    assert _tracker(v) == {"path": megatron.TRACKER, "target": "6", "ok": True, "kind": ""}  # iter_0000006
    assert v["rollback"]["unit"] == "iter_0000006" and not _kinds(v)


def test_text_that_is_no_iteration_is_megatron_tracker_invalid(megatron_run, tmp_path):
    (megatron_run / megatron.TRACKER).write_text("iter_9\n")
    v = audit_in_process(megatron_run, out_dir=tmp_path / "out")
    bad = [f for f in v["pointer_findings"] if f["kind"] == "megatron_tracker_invalid"]
    assert len(bad) == 1 and bad[0]["severity"] == "error"
    assert "'iter_9'" in bad[0]["message"] and "iter_0000006" in bad[0]["next_step"]
    assert bad[0]["detector"] == "ckptaudit.producers.megatron:tracker_check"


def test_release_is_a_valid_tracker(megatron_run, tmp_path):
    (megatron_run / megatron.TRACKER).write_text("release")
    v = audit_in_process(megatron_run, out_dir=tmp_path / "out")
    assert _kinds(v) == ["latest_pointer_dangling"]  # a valid text; this run has no release folder
    assert megatron.tracker_unit("release") == "release" and megatron.tracker_unit("42") == "iter_0000042"


def test_a_tracker_naming_a_broken_iteration_is_repaired_with_an_iteration_number(megatron_run, tmp_path):
    """The tracker's repair used to write the folder name (``iter_0000006``), which ``read_metadata`` rejects
    (``int()`` fails and it is not ``release``): it must write the iteration number."""
    (megatron_run / megatron.TRACKER).write_text("9")
    v = audit_in_process(megatron_run, out_dir=tmp_path / "out")
    bad = [f for f in v["pointer_findings"] if f["kind"] == "latest_pointer_incomplete"]
    assert len(bad) == 1 and "iter_0000006" in bad[0]["next_step"]
    assert bad[0]["repair"] == (f"echo -n 6 > {megatron.TRACKER}.tmp && mv {megatron.TRACKER}.tmp {megatron.TRACKER}")
    assert megatron.tracker_text("iter_0000006") == "6" and megatron.tracker_text("release") == "release"


def test_a_tracker_behind_a_newer_usable_iteration_is_a_warning_with_its_repair(tmp_path):
    """A tracker left at an older complete iteration while a newer one is complete (NeMo Automodel #3390):
    Megatron resumes the older one; the audit keeps the newer as rollback point and says how to re-point."""
    run = tmp_path / "run"
    shutil.copytree(CASES / "megatron_mixed_step_shards", run, ignore=shutil.ignore_patterns("expected.json"))
    # iteration 9 made whole: its rank-1 file is rank 0's copy (both record iteration 9; the weights do not matter)
    shutil.copyfile(run / "iter_0000009/mp_rank_00/model_optim_rng.pt", run / "iter_0000009/mp_rank_01/model_optim_rng.pt")
    (run / megatron.TRACKER).write_text("6")
    v = audit_in_process(run, out_dir=tmp_path / "out")
    f = next(f for f in v["pointer_findings"] if f["kind"] == "megatron_tracker_behind")
    assert f["severity"] == "warning" and f["detector"] == "ckptaudit.producers.megatron:tracker_behind"
    assert f["repair"] == f"echo -n 9 > {megatron.TRACKER}.tmp && mv {megatron.TRACKER}.tmp {megatron.TRACKER}"
    assert v["pointers"][0]["ok"] and any("names iteration 6" in r for r in v["reasons"])
