"""NVIDIA Resiliency Extension (NVRx) local checkpoints: a ``.dirty`` file, and an iteration some rank lacks, are
saves in progress (``ckptaudit/producers/nvrx.py``).

Source: NVIDIA/nvidia-resiliency-ext ``src/nvidia_resiliency_ext/checkpointing/local/ckpt_managers/`` at commit
d8686d9c7015c39ce91dd01788c0ab111a24818b: ``local_manager.py`` :107-125 ``_save`` torch.saves into
``<root>/<session>/<rank>/iter_{iteration:07d}_{rank}_local.dirty.pt`` (:158-173) and renames it to
``iter_…_local.pt``; :79-88 ``_my_ckpt_ids`` lists only ``iter_\\d+_\\d+_local\\.pt``; ``base_manager.py``
:156-203 ``find_latest`` takes the newest iteration every rank holds.

The runs in tests/producer_runs/nvrx_* were written by NVRx itself (nvidia-resiliency-ext 0.4.1, whose
``local_manager.py`` is that commit's, two gloo ranks on the CPU: tests/producer_runs/make_nvrx_runs.py), which
also checked NVRx's own ``find_latest`` on them: 30 for the clean run, 20 for the killed one.  nvidia-resiliency-ext
is not in the project's environment, so the tests read those files and never import it.
"""

from __future__ import annotations


from ckptaudit import discovery as inventory
from ckptaudit.pipeline import audit_in_process
from ckptaudit.producers import nvrx
from ckptaudit.units import in_progress_reason, step_from_name

from .conftest import copy_producer_run, unit_rows



def _why(v, unit):
    u = next(u for u in v["units"] if u["unit"] == unit)
    return next(f["message"] for f in u["findings"] if f["kind"] == "unit_in_progress")


def test_the_dirty_name_is_nvrxs_save_under_way():
    why = in_progress_reason("iter_0000030_0_local.dirty.pt")
    assert why.startswith("NVRx local checkpoint still being written") and "never lists a .dirty file" in why
    assert in_progress_reason("iter_0000030_0_local.pt") is None
    assert in_progress_reason("model.dirty.pt") is None  # a bare ".dirty" is no producer's rule
    assert step_from_name("iter_0000030_0_local.dirty.pt") == 30


def test_rank_killed_before_its_rename_rolls_back_to_the_iteration_every_rank_holds(tmp_path):
    """Rank 0 died between torch.save and the rename of iteration 30; rank 1 finished its file of 30."""
    v = audit_in_process(copy_producer_run("nvrx_killed", tmp_path), out_dir=tmp_path / "out")
    assert unit_rows(v) == {
        "run1/0/iter_0000020_0_local.pt": ("nvrx-local", 20, "resume"),
        "run1/1/iter_0000020_1_local.pt": ("nvrx-local", 20, "resume"),
        "run1/0/iter_0000030_0_local.dirty.pt": ("nvrx-local", 30, "none"),
        "run1/1/iter_0000030_1_local.pt": ("nvrx-local", 30, "none"),
    }
    assert v["rollback"] == {"unit": "run1/1/iter_0000020_1_local.pt", "step": 20}  # find_latest: 20
    assert "NVRx local checkpoint still being written" in _why(v, "run1/0/iter_0000030_0_local.dirty.pt")
    assert ("NVRx local checkpoint of iteration 30 is not finished on every rank (rank 0 holds no "
            "iter_0000030_<rank>_local.pt)") in _why(v, "run1/1/iter_0000030_1_local.pt")


def test_clean_run_resumes_from_its_one_iteration(tmp_path):
    v = audit_in_process(copy_producer_run("nvrx_clean", tmp_path), out_dir=tmp_path / "out")
    assert unit_rows(v) == {"run1/0/iter_0000030_0_local.pt": ("nvrx-local", 30, "resume"),
                        "run1/1/iter_0000030_1_local.pt": ("nvrx-local", 30, "resume")}
    assert v["rollback"]["step"] == 30
    kinds = {f["kind"] for u in v["units"] for f in u["findings"]}
    assert "unit_in_progress" not in kinds and "load_failed" not in kinds  # NVRx loads with weights_only=False
    assert "pickle_global_allowed_by_resume" in kinds


def test_rank_killed_before_it_opened_its_file(tmp_path):
    """No file of iteration 30 at all on rank 0 (killed before ``open(…, "bx")``): rank 1's is still skipped."""
    run = copy_producer_run("nvrx_killed", tmp_path)
    (run / "run1" / "0" / "iter_0000030_0_local.dirty.pt").unlink()
    units, _, _ = inventory.discover(run)
    assert {u.unit: bool(u.in_progress) for u in units} == {
        "run1/0/iter_0000020_0_local.pt": False, "run1/1/iter_0000020_1_local.pt": False,
        "run1/1/iter_0000030_1_local.pt": True}


def test_the_rank_rule():
    done = ["s/0/iter_0000030_0_local.pt", "s/1/iter_0000030_1_local.pt"]
    assert nvrx.incomplete(done) == {}
    # a replica: rank 1's file kept in rank 0's folder too (replication strategies)
    assert nvrx.incomplete(["s/0/iter_0000030_0_local.pt", "s/0/iter_0000030_1_local.pt"]) == {}
    got = nvrx.incomplete(done + ["s/2/iter_0000030_2_local.dirty.pt", "t/0/iter_0000010_0_local.pt"])
    assert sorted(got) == done and "(rank 2 holds no iter_0000030_<rank>_local.pt)" in got[done[0]]
    assert nvrx.incomplete(["flat/iter_0000030_0_local.pt", "iter_0000030_1_local.pt"]) == {}  # no rank folder


def test_a_damaged_rank_file_spoils_its_iteration_for_every_rank(tmp_path):
    """Rank 1's finished file of iteration 30 cut short (a disk full after the rename): NVRx's find_latest still
    picks 30 (both ranks hold it) and rank 1's load fails, so rank 0's intact file of 30 is no rollback point
    either.  Before, the audit said RESUME from rank 0's file."""
    import torch

    run = copy_producer_run("nvrx_killed", tmp_path)
    (run / "run1" / "0" / "iter_0000030_0_local.dirty.pt").rename(run / "run1" / "0" / "iter_0000030_0_local.pt")
    cut = run / "run1" / "1" / "iter_0000030_1_local.pt"
    raw = cut.read_bytes()
    cut.write_bytes(raw[: len(raw) // 2])
    try:
        torch.load(cut, weights_only=True)  # NVRx's _load is torch.load: the archive itself does not open
        raise AssertionError("a cut zip loaded")
    except RuntimeError as e:
        assert "zip archive" in str(e) or "central directory" in str(e)
    v = audit_in_process(run, out_dir=tmp_path / "out")
    rows = unit_rows(v)
    assert rows["run1/0/iter_0000030_0_local.pt"] == ("nvrx-local", 30, "none")
    assert rows["run1/1/iter_0000030_1_local.pt"][2] == "none"
    u = next(u for u in v["units"] if u["unit"] == "run1/0/iter_0000030_0_local.pt")
    [f] = [f for f in u["findings"] if f["kind"] == "save_spoiled_by_another_rank"]
    assert "rank 1 file (iter_0000030_1_local.pt) is not usable" in f["message"]
    assert v["rollback"]["step"] == 20 and v["recommendation"] == "resume"


def test_the_spoiled_rule_counts_a_replica_as_a_copy():
    ok, bad = "resume", "none"
    assert nvrx.spoiled({"s/0/iter_0000030_0_local.pt": ok, "s/1/iter_0000030_1_local.pt": ok}) == {}
    got = nvrx.spoiled({"s/0/iter_0000030_0_local.pt": ok, "s/1/iter_0000030_1_local.pt": bad})
    assert list(got) == ["s/0/iter_0000030_0_local.pt"]
    # rank 1's file damaged in its own folder but intact as a replica in rank 0's: NVRx can still load rank 1
    assert nvrx.spoiled({"s/0/iter_0000030_0_local.pt": ok, "s/1/iter_0000030_1_local.pt": bad,
                         "s/0/iter_0000030_1_local.pt": ok}) == {}
    # another iteration, or another session, is not touched
    assert nvrx.spoiled({"s/0/iter_0000020_0_local.pt": ok, "s/1/iter_0000030_1_local.pt": bad,
                         "t/0/iter_0000030_0_local.pt": ok}) == {}
