"""DCP's non-tensor items are torch.save blobs that dcp.load unpickles with weights_only=False: each is judged so.

Runs are written by ``torch.distributed.checkpoint.save`` itself (one process); the gadget's effect under
``dcp.load`` is checked with torch's own loader in a child process (it writes an empty file in tmp_path).
"""

import subprocess
import sys
import textwrap

import pytest

from ckptaudit.pipeline import audit_in_process

SAVE = textwrap.dedent("""
    import io, pickle, sys, warnings
    import torch
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")
    class W:
        def __reduce__(self):
            return (torch.serialization.save, ({}, sys.argv[2]))
    state = {"model": {"w": torch.zeros(4)}, "train_state": {"step": 30, "epoch": 2}}
    if sys.argv[3] == "torchtitan":
        # torchtitan's shapes: TrainState keeps its loss history as a torch.save'd BytesIO, the dataloader
        # its StatefulDataLoader state as pickle.dumps bytes per data-parallel rank
        losses = io.BytesIO()
        torch.save([0.5, 0.25], losses)
        state["train_state"]["global_avg_losses"] = losses
        state["dataloader"] = {"dp_rank_0": pickle.dumps({"epoch": 2, "batches_yielded": 10})}
    if sys.argv[3] == "gadget":
        state["train_state"]["x"] = W()
    dcp.save(state, checkpoint_id=sys.argv[1], no_dist=True)
""")
LOAD = textwrap.dedent("""
    import sys, warnings
    import torch
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")
    state = {"model": {"w": torch.ones(4)}, "train_state": {"step": 0, "epoch": 0, "x": 0}}
    dcp.load(state, checkpoint_id=sys.argv[1], no_dist=True)
""")


def _save(tmp_path, kind):
    pytest.importorskip("torch")
    unit = tmp_path / "run" / "step-30"
    subprocess.run([sys.executable, "-c", SAVE, str(unit), str(tmp_path / "written-by-load"), kind], check=True)
    return tmp_path / "run"


def test_a_gadget_in_a_non_tensor_item_is_an_error_and_runs_under_dcp_load(tmp_path):
    run = _save(tmp_path, "gadget")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    u = v["units"][0]
    assert (u["unit"], u["layout"], u["usable_for"], u["step"]) == ("step-30", "dcp", "none", 30)
    f = next(f for f in u["findings"] if f["kind"] == "unrestricted_load_imports_unknown")
    assert f["path"] == "step-30/__0_0.distcp" and f["severity"] == "error"
    assert "'torch.serialization.save'" in f["message"] and "(train_state.x)" in f["message"]
    assert "DefaultLoadPlanner.load_bytes: torch.load(weights_only=False)" in f["message"]
    assert not (tmp_path / "written-by-load").exists()  # the audit ran nothing
    # the framework's own loader is the truth: dcp.load calls the gadget
    subprocess.run([sys.executable, "-c", LOAD, str(run / "step-30")], check=False, capture_output=True)
    assert (tmp_path / "written-by-load").exists()


def test_plain_non_tensor_items_have_no_security_finding_and_give_their_values(tmp_path):
    run = _save(tmp_path, "clean")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    u = v["units"][0]
    assert [f["kind"] for f in u["findings"] if f["layer"] == "security"] == []
    assert u["step"] == 30 and u["usable_for"] != "none"


def test_torchtitan_shaped_items_have_no_security_finding(tmp_path):
    """A BytesIO value (pickled as _io.BytesIO, a module whose other names open files) and pickled bytes (a
    nested pickle that imports nothing) are data: walked, judged, and not called dangerous or obfuscated."""
    run = _save(tmp_path, "torchtitan")
    out = tmp_path / "out"
    v = audit_in_process(run, {}, out_dir=out)
    u = v["units"][0]
    sec = [f for f in u["findings"] if f["layer"] == "security"]
    # the one note: weights_only=True would refuse the buffer, dcp.load does not use it
    assert [(f["kind"], f["severity"]) for f in sec] == [("pickle_global_allowed_by_resume", "info")]
    assert "'_io.BytesIO'" in sec[0]["message"] and "(train_state.global_avg_losses)" in sec[0]["message"]
    assert u["step"] == 30 and u["usable_for"] == "warm-start"  # no optimizer state in this unit
    import pyarrow.parquet as pq

    rows = [r for r in pq.read_table(next(out.rglob("imports*.parquet"))).to_pylist()
            if "train_state.global_avg_losses" in (r.get("member") or "")]
    assert {(r["module"], r["name"], r["category"]) for r in rows} >= {("_io", "BytesIO", "benign")}
