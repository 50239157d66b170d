"""The walk's opcode budget grows with a torch zip's records: a real torch.save of many tensors is walked to
its end, a hostile stream of the same length in a zip of few records is still cut.

At the default budget this needs a torch.save of ~170,000 tensors (~5,000,000 opcodes); here the budget is
lowered (``pickle_walk.MAX_OPS``, mirrored into the walk's budgets) so the same shapes stay small.
"""

from __future__ import annotations

import pytest

from ckptaudit import pickle_walk
from ckptaudit.pickle_walk.budgets import OPS_PER_RECORD, ops_for
from ckptaudit.pipeline import audit_in_process

torch = pytest.importorskip("torch")


def _kinds(v, unit):
    return [f["kind"] for u in v["units"] if u["unit"] == unit for f in u["findings"]]


def test_budget_follows_records(monkeypatch):
    monkeypatch.setattr(pickle_walk, "MAX_OPS", 20_000)
    assert ops_for(10) == 20_000 and ops_for(1_006) == 1_006 * OPS_PER_RECORD


def test_many_tensors_are_walked_to_the_end_and_padding_is_still_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(pickle_walk, "MAX_OPS", 20_000)
    run = tmp_path / "run"
    run.mkdir()
    # 1,000 tensors, each its own storage: ~30 opcodes each, 1,006 records
    torch.save({"model": {f"layers.{i}.w": torch.zeros(1) for i in range(1_000)}, "step": 20},
               run / "ckpt_000020.pt")
    # the same number of opcodes as a list of ints: 5 records
    torch.save({"model": {"w": torch.zeros(1)}, "pad": list(range(30_000)), "step": 10}, run / "ckpt_000010.pt")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    assert "pickle_too_complex" not in _kinds(v, "ckpt_000020.pt")
    assert "pickle_too_complex" in _kinds(v, "ckpt_000010.pt")
    import pyarrow.parquet as pq

    names = pq.read_table(tmp_path / "out" / "tables" / "tensors.parquet", columns=["unit", "name"]).to_pylist()
    assert sum(r["unit"] == "ckpt_000020.pt" for r in names) == 1_000


def test_two_walks_on_two_threads_take_turns_so_neither_counts_the_others_objects(monkeypatch):
    """The walk's memory budget is the growth of the interpreter's block count, which two walks on two threads
    (the hash stage's plan walks of a part's units; the reader's read-ahead beside its metadata pass) would each
    see the other add to.  Walks take turns (``machine.WALKS``): a pickle that fits the budget alone still fits
    with another walk of the same size started beside it."""
    import pickle
    import sys
    import threading

    from ckptaudit.pickle_walk import budgets, machine

    data = pickle.dumps([(i, str(i)) for i in range(60_000)], protocol=4)  # ~3 objects per item, no memo reuse
    b0 = sys.getallocatedblocks()
    alone = pickle_walk.walk(data)
    grown = sys.getallocatedblocks() - b0
    assert alone.error is None and grown > 100_000
    del alone
    monkeypatch.setattr(budgets, "MAX_WALK_BLOCKS", int(grown * 1.5))  # fits one walk, not two at once
    results, go = [], threading.Barrier(2)

    def one():
        go.wait()
        results.append(pickle_walk.walk(data))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.error for r in results] == [None, None]
    assert not machine.WALKS._is_owned()  # released after both
    with machine.WALKS:  # re-entrant: a nested pickle is walked inside its parent's walk
        assert pickle_walk.walk(pickle.dumps([1, 2])).error is None
