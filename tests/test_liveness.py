"""A unit that changes during the audit, or that makes one stage raise, is a finding: the audit still ends
with a verdict (liveness.py)."""

import torch

from ckptaudit.stages import cli as stages
from ckptaudit.stages import inventory
from ckptaudit.stages import structure
from ckptaudit.pipeline import audit_in_process


def _run(tmp_path, steps=(100, 200, 300)):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters())
    for s in steps:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": s,
                    "rng": torch.get_rng_state()}, tmp_path / f"ckpt_{s:06d}.pt")
    return tmp_path


def _units(v):
    return {u["unit"]: u for u in v["units"]}


def test_unit_deleted_after_inventory_is_changed_not_a_crash(tmp_path, monkeypatch):
    """Regression: a retention job deleting a unit between inventory and scan ended the audit (exit 3)."""
    (tmp_path / "run").mkdir()
    run = _run(tmp_path / "run")
    real = inventory.run_inventory

    def inventory_then_prune(run_dir, *args, **kwargs):
        doc = real(run_dir, *args, **kwargs)
        (run / "ckpt_000300.pt").unlink()  # the writer's retention, just after the listing
        return doc

    monkeypatch.setattr(inventory, "run_inventory", inventory_then_prune)
    v = audit_in_process(run, out_dir=tmp_path / "out")
    u = _units(v)
    kinds = {f["kind"] for f in u["ckpt_000300.pt"]["findings"]}
    assert "unit_changed_during_audit" in kinds, kinds
    assert u["ckpt_000300.pt"]["usable_for"] == "none"
    assert v["recommendation"] == "resume" and v["rollback"]["unit"] == "ckpt_000200.pt"


def test_unit_rewritten_during_audit_is_excluded(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    run = _run(tmp_path / "run")
    real = inventory.run_inventory

    def inventory_then_rewrite(run_dir, *args, **kwargs):
        doc = real(run_dir, *args, **kwargs)
        p = run / "ckpt_000300.pt"
        p.write_bytes(p.read_bytes() + b"\0")  # rewritten in place by a second writer
        return doc

    monkeypatch.setattr(inventory, "run_inventory", inventory_then_rewrite)
    v = audit_in_process(run, out_dir=tmp_path / "out")
    f = next(f for f in _units(v)["ckpt_000300.pt"]["findings"] if f["kind"] == "unit_changed_during_audit")
    assert "rewritten" in f["message"] and f["detail"]["files"] == ["ckpt_000300.pt"]
    assert v["rollback"]["unit"] == "ckpt_000200.pt"


def test_one_unit_raising_in_a_stage_is_an_audit_error(tmp_path, monkeypatch):
    """Regression: one hostile file's exception (RecursionError, OverflowError…) left the run with no verdict."""
    run = _run(tmp_path)
    real = structure.analyse_unit

    def boom(unit, *a, **k):
        if unit["unit"] == "ckpt_000200.pt":
            raise RecursionError("maximum recursion depth exceeded")
        return real(unit, *a, **k)

    monkeypatch.setattr(structure, "analyse_unit", boom)
    v = audit_in_process(run, out_dir=tmp_path / "out")
    u = _units(v)
    err = next(f for f in u["ckpt_000200.pt"]["findings"] if f["kind"] == "audit_error")
    assert err["layer"] == "structure" and err["detail"]["error_type"] == "RecursionError"
    assert err["detail"]["stage"] == "structure"
    assert u["ckpt_000200.pt"]["usable_for"] == "none"
    assert u["ckpt_000300.pt"]["usable_for"] == "resume"
    assert v["rollback"]["unit"] == "ckpt_000300.pt"


def test_scan_raising_gives_a_scan_row(tmp_path, monkeypatch):
    run = _run(tmp_path, steps=(100, 200))
    from ckptaudit import layouts

    single = layouts.single.ADAPTER
    real = single.scan

    def boom(run_dir, unit, cfg, byte_facts=None):
        if unit["unit"] == "ckpt_000200.pt":
            raise OverflowError("Python int too large to convert to C long")
        return real(run_dir, unit, cfg, byte_facts)

    monkeypatch.setattr(single, "scan", boom)
    v = audit_in_process(run, out_dir=tmp_path / "out")
    u = _units(v)
    assert [f["kind"] for f in u["ckpt_000200.pt"]["findings"] if f["severity"] == "error"] == ["audit_error"]
    assert v["rollback"]["unit"] == "ckpt_000100.pt"
    assert stages  # the stage functions are the ones the workflow's rules call
