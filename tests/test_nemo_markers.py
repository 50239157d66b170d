"""NeMo's unfinished-checkpoint marker: the checkpoint beside it is a save (or deletion) in progress.

Source: NVIDIA/NeMo ``nemo/utils/callbacks/nemo_model_checkpoint.py``, ``NeMoModelCheckpoint``:
``format_checkpoint_unfinished_marker_path`` (rank folder un-injected, ``.nemo``, ``.ckpt``, ``-EMA`` removed as
suffixes, ``-unfinished`` added) names an empty file that ``_save_checkpoint`` (and ``_remove_checkpoint``) touches
before the save (deletion) and removes once every rank finished; ``is_checkpoint_unfinished`` is that file
existing, and NeMo's resume skips such checkpoints and deletes them with every marker.

nemo_toolkit cannot be imported here (``pip download nemo_toolkit --no-deps`` gets 3.0.0, whose
``nemo.utils.callbacks`` import needs hydra and the rest of its dependencies), so the markers are made from
that documented rule; ``ckptaudit.producers.nemo.marker_of`` was checked once against NeMo 3.0.0's own
``format_checkpoint_unfinished_marker_path`` (lifted from the wheel) on the names of
``test_marker_name_is_nemos_rule``.  The checkpoint files are real Lightning 2.6 saves: the clean 30-step run of
tests/cases/ok_fw_lightning (written by ``ModelCheckpoint(every_n_train_steps=10, save_top_k=-1)``,
tests/frameworks/fw_lightning.py), as NeMo leaves such a run when it is killed while saving step 30.
"""

from __future__ import annotations

import shutil

import pytest

from ckptaudit import discovery as inventory
from ckptaudit.pipeline import audit_in_process
from ckptaudit.producers import nemo

from .conftest import CASES, REPO

LIGHTNING = REPO / "tests" / "cases" / "ok_fw_lightning" / "checkpoints"
SAVES = ("epoch=0-step=10.ckpt", "epoch=1-step=20.ckpt", "epoch=2-step=30.ckpt")


@pytest.mark.parametrize("unit,marker", [
    ("epoch=0-step=10.ckpt", "epoch=0-step=10-unfinished"),
    ("checkpoints/epoch=0-step=10-EMA.ckpt", "checkpoints/epoch=0-step=10-unfinished"),  # EMA copy: same marker
    ("checkpoints/epoch=0-step=10", "checkpoints/epoch=0-step=10-unfinished"),  # dist-ckpt folder (ckpt_to_dir)
    ("checkpoints/mp_rank_01/gpt--step=10.ckpt", "checkpoints/gpt--step=10-unfinished"),  # rank folder un-injected
    ("checkpoints/tp_rank_00_pp_rank_001/gpt-EMA.ckpt", "checkpoints/gpt-unfinished"),
    ("model.nemo", "model-unfinished"),
    ("ckpt_100.pt", "ckpt_100.pt-unfinished"),  # only .nemo/.ckpt/-EMA are taken off
])
def test_marker_name_is_nemos_rule(unit, marker):
    assert nemo.marker_of(unit) == marker


def _run(tmp_path, *markers):
    ck = tmp_path / "run" / "checkpoints"
    ck.mkdir(parents=True)
    for n in SAVES:
        shutil.copy2(LIGHTNING / n, ck / n)
    for m in markers:
        (ck / m).touch()  # set_checkpoint_unfinished_marker: Path.touch() on rank 0
    return tmp_path / "run"


def _judged(v):
    return [(u["unit"], u["step"], u["usable_for"], sorted(f["kind"] for f in u["findings"])) for u in v["units"]]


def test_killed_mid_save_rolls_back_past_the_marked_checkpoint(tmp_path):
    """NeMo killed while saving step 30: epoch=2-step=30.ckpt is complete on disk, but its marker is still there."""
    run = _run(tmp_path, "epoch=2-step=30-unfinished")
    v = audit_in_process(run, out_dir=tmp_path / "out")
    assert v["rollback"]["unit"] == "checkpoints/epoch=1-step=20.ckpt"
    assert [u["unit"] for u in v["units"]] == [f"checkpoints/{n}" for n in SAVES]  # the marker is no unit
    s30 = v["units"][-1]
    assert s30["usable_for"] == "none"
    f = next(f for f in s30["findings"] if f["kind"] == "unit_in_progress")
    assert "NeMo unfinished marker epoch=2-step=30-unfinished" in f["message"]
    assert [u["usable_for"] for u in v["units"][:2]] == ["resume", "resume"]


def test_orphan_marker_is_judged_as_if_absent(tmp_path):
    """A marker beside no checkpoint (a deletion that removed the checkpoint, not yet the marker): no unit, no
    finding; it stays a file that is no checkpoint, as any other."""
    plain = audit_in_process(_run(tmp_path / "a"), out_dir=tmp_path / "a" / "out")
    run = _run(tmp_path / "b", "epoch=3-step=40-unfinished")
    v = audit_in_process(run, out_dir=tmp_path / "b" / "out")
    assert _judged(v) == _judged(plain)
    assert v["rollback"] == plain["rollback"] == {"unit": "checkpoints/epoch=2-step=30.ckpt", "step": 30}
    _, _, stray = inventory.discover(run)
    assert stray == ["checkpoints/epoch=3-step=40-unfinished"]


def test_marker_covers_ema_copy_folder_and_rank_folders(tmp_path):
    """The inventory's side of the rule: a file, its -EMA copy, a distributed-checkpoint folder and the
    per-rank files under mp_rank_NN/ all take the one marker; the marker is neither a unit nor a stray."""
    src = LIGHTNING / SAVES[-1]
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    for n in ("epoch=2-step=30.ckpt", "epoch=2-step=30-EMA.ckpt", "epoch=1-step=20.ckpt"):
        shutil.copy2(src, ck / n)
    for rank in ("mp_rank_00", "mp_rank_01"):
        (ck / rank).mkdir()
        shutil.copy2(src, ck / rank / "gpt--step=40.ckpt")
    if (CASES / "ok_dcp" / "step-6").is_dir():  # a torch.distributed.checkpoint folder, NeMo's dist-ckpt format
        shutil.copytree(CASES / "ok_dcp" / "step-6", ck / "epoch=3-step=50")
        (ck / "epoch=3-step=50-unfinished").touch()
    for m in ("epoch=2-step=30-unfinished", "gpt--step=40-unfinished"):
        (ck / m).touch()
    units, _, stray = inventory.discover(tmp_path)
    marked = {u.unit: u.in_progress for u in units if u.in_progress}
    expect = {"checkpoints/epoch=2-step=30.ckpt": "epoch=2-step=30-unfinished",
              "checkpoints/epoch=2-step=30-EMA.ckpt": "epoch=2-step=30-unfinished",
              "checkpoints/mp_rank_00/gpt--step=40.ckpt": "gpt--step=40-unfinished",
              "checkpoints/mp_rank_01/gpt--step=40.ckpt": "gpt--step=40-unfinished"}
    if (ck / "epoch=3-step=50").is_dir():
        expect["checkpoints/epoch=3-step=50"] = "epoch=3-step=50-unfinished"
        assert next(u for u in units if u.unit == "checkpoints/epoch=3-step=50").layout == "dcp"
    assert sorted(marked) == sorted(expect)
    for unit, marker in expect.items():
        assert marked[unit].startswith(f"NeMo unfinished marker {marker} beside it")
    assert not [u for u in units if u.unit.endswith("-unfinished")] and stray == []
    assert "checkpoints/epoch=1-step=20.ckpt" not in marked


def test_folder_named_unfinished_is_still_in_progress(tmp_path):
    """The older name rule stays: a folder whose own name ends in -unfinished is a save in progress."""
    (tmp_path / "step-6-unfinished").mkdir()
    shutil.copy2(LIGHTNING / SAVES[0], tmp_path / "step-6-unfinished" / "model.ckpt")
    units, _, _ = inventory.discover(tmp_path)
    assert [(u.unit, u.in_progress) for u in units] == [("step-6-unfinished", "folder marked unfinished")]
