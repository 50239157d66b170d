"""A scheduler or RNG state is missing only where the run had one: judged from the run, not per unit.

Real runs (Linear + AdamW, torch LR schedulers) are published with :func:`ckptaudit.publish.save`
and audited.  A run that never had a scheduler or never saved RNG state gets no warning; a unit that
lacks what its neighbours have, or whose optimizer was driven by a torch scheduler (``initial_lr``),
does; the fast-forward repair is run as printed against a rebuilt scheduler.
"""

from __future__ import annotations

import json

import pytest
import torch

from ckptaudit import publish as P
from ckptaudit.pipeline import audit_in_process


def _train(run, saves, scheduler=None, rng=True, drop=(), every=1):
    """Train for max(saves) steps; save at each step in ``saves``.  ``scheduler``: a function of the
    optimizer returning a torch LR scheduler (stepped once every ``every`` optimizer steps); units
    whose step is in ``drop`` are saved without their scheduler and RNG state."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sch = scheduler(opt) if scheduler else None
    for step in range(1, max(saves) + 1):
        model(torch.randn(2, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if sch is not None and step % every == 0:
            sch.step()
        if step in saves:
            ck = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            if sch is not None and step not in drop:
                ck["scheduler"] = sch.state_dict()
            if rng and step not in drop:
                ck["rng"] = torch.get_rng_state()
            P.save(ck, run, step)
    return opt


def _findings(v):
    return {u["unit"]: sorted(f["kind"] for f in u["findings"] if f["severity"] != "info") for u in v["units"]}


def _warmup(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))


def test_run_without_scheduler_or_rng_is_not_missing_them(tmp_path):
    _train(tmp_path, (2, 4, 6), rng=False)
    v = audit_in_process(tmp_path)
    assert _findings(v) == {"ckpt_000002.pt": [], "ckpt_000004.pt": [], "ckpt_000006.pt": []}


def test_unit_lacking_what_its_neighbours_have(tmp_path):
    _train(tmp_path, (2, 4, 6), scheduler=_warmup, drop=(4,))
    v = audit_in_process(tmp_path)
    assert _findings(v) == {"ckpt_000002.pt": [], "ckpt_000006.pt": [],
                            "ckpt_000004.pt": ["missing_rng_state", "missing_scheduler_state"]}
    u = next(u for u in v["units"] if u["unit"] == "ckpt_000004.pt")
    f = {f["kind"]: f for f in u["findings"]}
    assert "2 other unit(s) of the run have it (ckpt_000002.pt, ckpt_000006.pt)" in f["missing_rng_state"]["message"]
    assert "initial_lr" in f["missing_scheduler_state"]["message"]
    assert u["usable_for"] == "resume"


def _run_repair(repair, scheduler_factory, lr=1e-2):
    """Run a repair as printed in a fresh resume: model, optimizer, the rebuilt scheduler."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scheduler = scheduler_factory(optimizer)
    ns = {"torch": torch, "model": model, "optimizer": optimizer, "scheduler": scheduler}
    exec(compile(repair, "<repair>", "exec"), ns)  # noqa: S102 - the audit's own output
    return scheduler


def test_single_unit_scheduler_evidence_and_runnable_repair(tmp_path):
    """One unit, no neighbours: initial_lr in the param groups says a torch scheduler ran."""
    _train(tmp_path, (7,), scheduler=_warmup, drop=(7,), rng=False)
    v = audit_in_process(tmp_path)
    assert _findings(v) == {"ckpt_000007.pt": ["missing_scheduler_state"]}
    f = v["units"][0]["findings"][-1]
    assert f["repair"].startswith("for _ in range(7): scheduler.step()")
    s = _run_repair(f["repair"], _warmup)
    assert s.last_epoch == 7 and abs(s.get_last_lr()[0] - 1e-2 * 0.8) < 1e-12
    # a different schedule than the run's stops the resume instead of training on a wrong LR
    try:
        _run_repair(f["repair"], lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.5))
    except AssertionError as e:
        assert "does not reach the saved learning rate" in str(e)
    else:
        raise AssertionError("the repair accepted a schedule that does not reach the saved LR")


def test_repair_steps_at_the_run_cadence(tmp_path):
    """A scheduler stepped once every 5 optimizer steps: the other units show last_epoch/step = 0.2."""
    decay = lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.9)  # noqa: E731 - chainable form
    _train(tmp_path, (10, 20, 30), scheduler=decay, every=5, drop=(20,))
    v = audit_in_process(tmp_path)
    f = next(f for u in v["units"] if u["unit"] == "ckpt_000020.pt" for f in u["findings"]
             if f["kind"] == "missing_scheduler_state")
    assert f["repair"].startswith("for _ in range(4): scheduler.step()")
    s = _run_repair(f["repair"], decay)
    assert s.last_epoch == 4


def test_scheduler_never_in_run_and_no_initial_lr(tmp_path):
    """nanoGPT sets the LR by hand from iter_num: no scheduler object, no initial_lr, nothing missing."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in (1, 2):
        for g in opt.param_groups:
            g["lr"] = 1e-2 * step / 2
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        P.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "rng": torch.get_rng_state()}, tmp_path, step)
    assert _findings(audit_in_process(tmp_path)) == {"ckpt_000001.pt": [], "ckpt_000002.pt": []}


def _trainer_folder(run, steps: int = 1):
    """A Trainer checkpoint folder ``checkpoint-<steps>`` without scheduler.pt and rng_state.pth (a restore rule of
    its producer), after ``steps`` AdamW steps."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    d = run / f"checkpoint-{steps}"
    d.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(d / "model.safetensors"))
    torch.save(opt.state_dict(), d / "optimizer.pt")
    (d / "trainer_state.json").write_text(json.dumps({"global_step": steps, "epoch": 1.0}))


@pytest.mark.parametrize("contracts", ["1", "0"])
def test_trainer_folder_without_rng_state_is_missing_it(tmp_path, monkeypatch, contracts):
    """A Trainer saves rng_state.pth and scheduler.pt in every checkpoint: one alone without them lacks them, and
    its resume then starts the optimizer fresh too (the fast-forward repair cannot run inside it)."""
    monkeypatch.setenv("CKPTAUDIT_PRODUCER_CONTRACTS", contracts)
    _trainer_folder(tmp_path, 3)
    v = audit_in_process(tmp_path)
    f = {f["kind"]: f for f in v["units"][0]["findings"]}
    # the Trainer's resume restores optimizer.pt only beside scheduler.pt (a rule of the producer, by layout)
    assert _findings(v) == {"checkpoint-3": ["missing_rng_state", "resume_starts_component_fresh"]}
    g = f["resume_starts_component_fresh"]
    assert g["detail"]["component"] == "optimizer" and g["detail"]["needs"] == "scheduler" and g["caps"] == "warm-start"
    assert "_load_optimizer_and_scheduler" in g["message"] and g["repair"] == ""
    assert v["units"][0]["usable_for"] == "warm-start"


@pytest.mark.parametrize("make", [
    lambda run: _train(run, (2, 4, 6, 8), scheduler=_warmup, drop=(4, 6)),
    _trainer_folder,
], ids=["scheduler-and-rng-dropped", "trainer-restore-rule"])
def test_the_state_stage_needs_judge_as_the_scan_tree_does(tmp_path, make):
    """The report reads each unit's ``run_needs_json`` (written by the state stage) instead of collecting its
    components from the scan tree again: the run's findings are the same either way, repairs included."""
    from ckptaudit import tables
    from ckptaudit.run_findings import missing_components

    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir()
    make(run)
    v = audit_in_process(run, out_dir=out)
    state = {r["unit"]: r for r in tables.read_rows(str(out / "tables" / "state.parquet"))}
    scan = {r["unit"]: r for r in tables.read_rows(str(out / "tables" / "scan.parquet"))}
    units = [{"unit": u["unit"], "layout": u["layout"]} for u in v["units"]]
    assert all(r["run_needs_json"] for r in state.values())
    via_state = missing_components(units, state, scan)
    via_scan = missing_components(units, {k: {**r, "run_needs_json": None} for k, r in state.items()}, scan)
    assert via_state and [(n, f.to_dict()) for n, f in via_state] == [(n, f.to_dict()) for n, f in via_scan]
