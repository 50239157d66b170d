"""Progress markers of saves that never finished: NeMo Automodel's ``.incomplete`` inside a checkpoint folder and
training_hub's ``.incomplete-checkpoint-<step>`` beside a Trainer's ``checkpoint-<step>``
(ckptaudit/producers/nemo_automodel.py, ckptaudit/producers/training_hub.py).

A folder whose every file is in place is still not a rollback point while its producer's marker is there: the
save was killed after the bytes and before the publication (Automodel moves ``LATEST`` and then clears the marker;
training_hub clears its sidecar after the Trainer's save returned), and the producer's own resume skips it.
The Trainer checkpoints are the bytes the HF Trainer wrote (tests/cases/fw_hf_trainer_optimizer_deleted); the
Automodel folders are ``torch.distributed.checkpoint.save`` output in the folder names Automodel uses
(``epoch_<E>_step_<S>/model``, ``…/optim``: recipes/base_recipe.py ``save_checkpoint``), the marker touched as
``mark_checkpoint_incomplete`` does.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ckptaudit.pipeline import audit_in_process

from .conftest import REPO

HF_CASE = REPO / "tests" / "cases" / "fw_hf_trainer_optimizer_deleted"


def _trainer_run(root: Path) -> Path:
    """checkpoint-20 as the Trainer wrote it, and checkpoint-30: the same files with ``global_step`` 30 (a
    complete-looking folder of a later save)."""
    run = root / "out"
    shutil.copytree(HF_CASE / "checkpoint-20", run / "checkpoint-20")
    shutil.copytree(HF_CASE / "checkpoint-20", run / "checkpoint-30")
    ts = run / "checkpoint-30" / "trainer_state.json"
    state = json.loads(ts.read_text())
    state["global_step"] = 30
    ts.write_text(json.dumps(state))
    return run


def _in_progress(v: dict) -> dict:
    return {u["unit"]: next((f["message"] for f in u["findings"] if f["kind"] == "unit_in_progress"), None)
            for u in v["units"]}


def test_training_hub_sidecar_marks_the_trainer_checkpoint_in_progress(tmp_path):
    run = _trainer_run(tmp_path)
    before = audit_in_process(run, {}, out_dir=tmp_path / "before")
    assert _in_progress(before)["checkpoint-30"] is None

    (run / ".incomplete-checkpoint-30").touch()  # mark_checkpoint_incomplete(output_dir, 30)
    v = audit_in_process(run, {}, out_dir=tmp_path / "after")
    why = _in_progress(v)
    assert why["checkpoint-30"] and ".incomplete-checkpoint-30" in why["checkpoint-30"]
    assert "find_latest_valid_checkpoint" in why["checkpoint-30"]
    assert why["checkpoint-20"] is None
    assert v["rollback"]["unit"] == "checkpoint-20"
    assert ".incomplete-checkpoint-30" not in {u["unit"] for u in v["units"]}  # the marker is no unit


def test_training_hub_legacy_sentinel_inside_the_folder(tmp_path):
    run = _trainer_run(tmp_path)
    (run / "checkpoint-30" / ".incomplete").touch()
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    why = _in_progress(v)
    assert why["checkpoint-30"] and "checkpoint-30/.incomplete" in why["checkpoint-30"]
    assert v["rollback"]["unit"] == "checkpoint-20"


def _automodel_checkpoint(folder: Path, scale: float) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    model = {"embed.weight": torch.full((8, 4), scale), "head.weight": torch.full((2, 4), scale)}
    dcp.save(model, checkpoint_id=str(folder / "model"))
    optim = {"state.embed.weight.exp_avg": torch.zeros(8, 4), "state.embed.weight.step": torch.tensor(10.0),
             "param_groups.embed.weight.lr": 1e-3}
    dcp.save(optim, checkpoint_id=str(folder / "optim"))
    (folder / "losses.json").write_text(json.dumps({"train_loss": 1.0}))


def test_automodel_marker_makes_every_part_of_its_checkpoint_in_progress(tmp_path):
    root = tmp_path / "checkpoints"
    for step, scale in ((10, 1.0), (20, 2.0)):
        _automodel_checkpoint(root / f"epoch_0_step_{step}", scale)
    (root / "epoch_0_step_20" / ".incomplete").touch()  # reserve_local_directory: marker made with the folder
    os.symlink("epoch_0_step_20", root / "LATEST")  # _publish_checkpoint moved LATEST, then the kill came
    v = audit_in_process(root, {}, out_dir=tmp_path / "out")
    why = _in_progress(v)
    marked = {u: w for u, w in why.items() if u.startswith("epoch_0_step_20/")}
    assert set(marked) == {"epoch_0_step_20/model", "epoch_0_step_20/optim"}, why
    assert all(w and "epoch_0_step_20/.incomplete" in w and "find_latest_checkpoint" in w for w in marked.values())
    assert all(w is None for u, w in why.items() if u.startswith("epoch_0_step_10/")), why
    assert v["rollback"]["unit"].startswith("epoch_0_step_10/")
