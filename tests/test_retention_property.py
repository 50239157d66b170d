"""Retention keeps verified units: after any saves, corruptions and prunes, ``keep_last`` of them survive.

A property test (hypothesis) over short random sequences of publishes (file and folder units),
corruptions (truncate, flip a byte, delete a file of the unit, remove the ``COMPLETE`` marker)
and prunes.  At each prune, at least ``min(keep_last, verified units before)`` verified units
survive, every verified unit kept still verifies, and no unit that did not verify is deleted.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptaudit import discovery as inventory
from ckptaudit import publish as P


def _state(step: int) -> dict:
    m = torch.nn.Linear(4, 4)
    return {"model": m.state_dict(), "iter_num": step}


def _units(run: Path) -> dict:
    return {u.unit: u.to_dict() for u in inventory.discover(run)[0]
            if u.step_from_name is not None and u.unit != "."}


def _verified(run: Path) -> set:
    return {n for n, u in _units(run).items() if P.verify_unit(run, u)[0]}


def _data_files(run: Path, unit: dict) -> list:
    return [run / f for f in unit["files"]]


def _corrupt(run: Path, how: str, pick: int) -> None:
    units = _units(run)
    if not units:
        return
    name = sorted(units, key=lambda n: units[n]["step_from_name"])[pick % len(units)]
    u = units[name]
    files = _data_files(run, u)
    if how == "unmark":
        if u["kind"] == "folder":
            (run / name / "COMPLETE").unlink(missing_ok=True)
        return
    if not files:
        return
    f = files[pick % len(files)]
    if how == "truncate":
        with open(f, "r+b") as fh:
            fh.truncate(max(0, f.stat().st_size // 2))
    elif how == "flip":
        data = bytearray(f.read_bytes())
        if data:
            data[len(data) // 3] ^= 0x5A
            f.write_bytes(bytes(data))
    elif how == "delete":
        f.unlink()


OPS = st.lists(st.one_of(
    st.tuples(st.just("save"), st.booleans()),
    st.tuples(st.sampled_from(["truncate", "flip", "delete", "unmark"]), st.integers(0, 7)),
    st.tuples(st.just("prune"), st.integers(1, 3)),
), min_size=2, max_size=10)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_keep_last_counts_verified_units(tmp_path_factory, ops):
    run = tmp_path_factory.mktemp("ret")
    step = 0
    for op, arg in ops + [("prune", 2)]:
        if op == "save":
            step += 10
            if arg:
                with P.publish(run, step, folder=True) as pub:
                    pub.save(_state(step), "model.pt")
            else:
                P.save(_state(step), run, step)
        elif op == "prune":
            before = _verified(run)
            everything = set(_units(run))
            P.prune(run, keep_last=arg)
            after_units = _units(run)
            after = _verified(run)
            assert len(after) >= min(arg, len(before)), (
                f"keep_last={arg}: {sorted(before)} verified before, only {sorted(after)} after")
            assert after <= before, "prune changed what verifies"
            lost = everything - set(after_units)
            assert lost <= before, f"prune deleted units that did not verify: {sorted(lost - before)}"
            newest = max(before, key=lambda n: _units_step(n), default=None)
            assert newest is None or newest in after
        else:
            _corrupt(run, op, arg)
    assert not [n for n in os.listdir(run) if n.startswith(P.TMP_PREFIX)], "a prune left a temp name"


def _units_step(name: str) -> int:
    from ckptaudit.units import step_from_name

    return step_from_name(name.rsplit("/", 1)[-1]) or 0


def test_damaged_newest_units_do_not_push_intact_ones_out(tmp_path):
    """The issue's case: truncated newest, a corrupt one behind it, keep_last=2 keeps two intact units."""
    for s in (1, 2, 3, 4, 5):
        P.save(_state(s), tmp_path, s)
    with open(tmp_path / "ckpt_000005.pt", "r+b") as fh:
        fh.truncate(300)
    data = bytearray((tmp_path / "ckpt_000004.pt").read_bytes())
    data[200] ^= 0xFF
    (tmp_path / "ckpt_000004.pt").write_bytes(bytes(data))
    plan = P.prune(tmp_path, keep_last=2)
    assert plan.rollback == "ckpt_000003.pt"
    assert sorted(plan.deleted) == ["ckpt_000001.pt"]
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".pt")) == [
        "ckpt_000002.pt", "ckpt_000003.pt", "ckpt_000004.pt", "ckpt_000005.pt"]
    reasons = {d.unit: d.reason for d in plan.decisions}
    assert reasons["ckpt_000002.pt"] == "one of the 2 newest (keep_last)"
    assert reasons["ckpt_000005.pt"] == "named by latest"  # kept anyway, and not counted as a keeper
    assert reasons["ckpt_000004.pt"].startswith("does not verify (")
