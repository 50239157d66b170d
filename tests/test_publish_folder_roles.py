"""A folder unit of ``publish(folder=True)`` is judged by what its manifest says each file is, not by file names.

Real training (Linear + AdamW + a torch LR scheduler) publishes folder units whose weights are in
``model.pt``; the audit finds them there (``ckptaudit-publish`` layout), as it does in
``pytorch_model.bin``, and weighs a damaged file by its declared role.
"""

from __future__ import annotations

import json

import torch

from ckptaudit import publish as P
from ckptaudit.pipeline import audit_in_process


def _run(run, weights_name, steps=(5, 10), writer=None, name=None):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    for step in range(1, max(steps) + 1):
        model(torch.randn(2, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sch.step()
        if step in steps:
            with P.publish(run, step, folder=True, name=name and f"{name}{step}") as pub:
                if writer is None:
                    pub.save(model.state_dict(), weights_name)
                else:
                    with pub.open(weights_name) as w:  # no role given and the object not seen
                        torch.save(model.state_dict(), w)
                pub.save(opt.state_dict(), "optimizer.pt")
                pub.save({"scheduler": sch.state_dict(), "rng": torch.get_rng_state(), "step": step},
                         "training_state.pt")


def _loud(v):
    return {u["unit"]: [(f["kind"], f["severity"]) for f in u["findings"] if f["severity"] != "info"]
            for u in v["units"]}


def test_weights_in_model_pt_are_found_by_the_manifest(tmp_path):
    _run(tmp_path, "model.pt")
    doc = json.loads((tmp_path / "checkpoint-10" / "manifest.json").read_text())
    assert {e["path"]: e["role"] for e in doc["files"]} == {
        "model.pt": "weights", "optimizer.pt": "optimizer", "training_state.pt": "mixed"}
    v = audit_in_process(tmp_path, out_dir=tmp_path.parent / "out")
    assert [(u["unit"], u["layout"], u["usable_for"]) for u in v["units"]] == [
        ("checkpoint-5", "ckptaudit-publish", "resume"), ("checkpoint-10", "ckptaudit-publish", "resume")]
    assert _loud(v) == {"checkpoint-5": [], "checkpoint-10": []}
    assert v["recommendation"] == "resume" and v["rollback"] == {"unit": "checkpoint-10", "step": 10}
    import pyarrow.parquet as pq

    st = {r["unit"]: r for r in pq.read_table(tmp_path.parent / "out" / "tables" / "state.parquet").to_pylist()}
    assert st["checkpoint-10"]["has_weights"] and st["checkpoint-10"]["has_scheduler"] and st["checkpoint-10"]["has_rng"]
    assert st["checkpoint-10"]["step"] == 10
    sr = {r["unit"]: r for r in pq.read_table(tmp_path.parent / "out" / "tables" / "structure.parquet").to_pylist()}
    assert sr["checkpoint-10"]["weights_component"].startswith("model.pt:")


def test_same_unit_as_pytorch_model_bin_and_under_any_name(tmp_path):
    _run(tmp_path / "a", "model.pt", name="step-")
    _run(tmp_path / "b", "pytorch_model.bin", name="step-")
    va, vb = audit_in_process(tmp_path / "a"), audit_in_process(tmp_path / "b")
    assert [(u["unit"], u["layout"], u["usable_for"]) for u in va["units"]] == [
        ("step-5", "ckptaudit-publish", "resume"), ("step-10", "ckptaudit-publish", "resume")]
    assert _loud(va) == _loud(vb) == {"step-5": [], "step-10": []}


def test_a_file_without_a_declared_role_is_recognised_by_structure(tmp_path):
    _run(tmp_path, "weights.bin", writer="open")
    doc = json.loads((tmp_path / "checkpoint-10" / "manifest.json").read_text())
    assert {e["path"]: e["role"] for e in doc["files"]}["weights.bin"] == ""
    v = audit_in_process(tmp_path)
    assert _loud(v) == {"checkpoint-5": [], "checkpoint-10": []}


def test_a_damaged_file_costs_what_its_declared_role_is_worth(tmp_path):
    """A flipped byte in optimizer.pt leaves the weights for a warm start; in model.pt it leaves nothing."""
    _run(tmp_path, "model.pt", steps=(5, 10, 15))
    for unit, victim in (("checkpoint-15", "optimizer.pt"), ("checkpoint-10", "model.pt")):
        p = tmp_path / unit / victim
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))
    v = audit_in_process(tmp_path)
    use = {u["unit"]: u["usable_for"] for u in v["units"]}
    assert use == {"checkpoint-5": "resume", "checkpoint-10": "none", "checkpoint-15": "warm-start"}
    assert v["rollback"] == {"unit": "checkpoint-5", "step": 5}
