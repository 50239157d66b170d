"""Whole modules pickled (``torch.save(model)`` loops): weights found by structure, the weights_only refusal read
as what the resume needs, and the printed repair run as printed on the loop's own file.

The run is written by the loop of ``tests/frameworks/fw_plain.py`` (``train_whole_module``: ``{epoch, step,
model: <the nn.Module>, optimizer}``), in a child process as the fixtures are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from ckptaudit.pipeline import audit_in_process
from tests.frameworks import _util as U

REPO = Path(__file__).resolve().parent.parent


def test_a_whole_module_loop_is_resumable_and_its_repair_gives_a_state_dict(tmp_path):
    run = tmp_path / "run"
    U.run_child("tests.frameworks.fw_plain:train_whole_module", {"run": str(run)}, cwd=str(REPO))
    v = audit_in_process(run)
    assert (v["recommendation"], v["rollback"]["unit"]) == ("resume", "ckpt_000030.pt")
    u = {x["unit"]: x for x in v["units"]}["ckpt_000030.pt"]
    f = {x["kind"]: x for x in u["findings"]}
    assert u["usable_for"] == "resume" and "load_failed" not in f
    wm = f["whole_module_pickle"]
    assert wm["severity"] == "info" and wm["layer"] == "security" and wm["detail"]["n_classes"] == 5
    assert wm["detail"]["top"] == "tests.frameworks.fw_plain.WholeNet" and "LayerNorm" in wm["detail"]["classes"]
    # the reader returns the verified unit without loading it, and says why it does not load it
    from ckptaudit import safe_load_checkpoint
    from ckptaudit.safe_load import NoUsableCheckpointError

    assert safe_load_checkpoint(run, load=False).unit == "ckpt_000030.pt"
    try:
        safe_load_checkpoint(run)
        raise AssertionError("the reader loaded a whole-module pickle")
    except NoUsableCheckpointError as e:
        assert "weights_only=False" in e.reasons["ckpt_000030.pt"]
    # the printed repair, run as printed where the model's class is importable (the user's training code)
    prelude = "import tests.frameworks.fw_plain as m; m._whole_net()\n"
    r = subprocess.run([sys.executable, "-c", prelude + wm["repair"]], cwd=str(run), capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    sd = torch.load(run / "ckpt_000030.pt.state_dict.pt", weights_only=True)  # now loads without trusting code
    assert sd["step"] == 30 and sorted(sd["model"]) == ["body.0.bias", "body.0.weight", "body.2.bias",
                                                       "body.2.weight", "norm.bias", "norm.weight"]
    assert len(sd["optimizer"]["state"]) == 6
