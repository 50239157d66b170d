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


# ---------------------------------------------------------------------------------------------------------
# Shared containers (issue 43): a pickle memoises an object met twice and fetches it again (BINGET), so a
# few hundred bytes can hold a DAG whose rebuilt tree has 2**40 paths.

def _put(i: int) -> bytes:
    return b"r" + i.to_bytes(4, "little")  # LONG_BINPUT


def _get(i: int) -> bytes:
    return b"j" + i.to_bytes(4, "little")  # LONG_BINGET


def _str(s: bytes) -> bytes:
    return b"X" + len(s).to_bytes(4, "little") + s  # BINUNICODE


def _dict_dag(levels: int) -> bytes:
    """d0 = {}; d_{i+1} = {'a': d_i, 'b': d_i}: each dict memoised once and fetched twice."""
    return (b"\x80\x02}" + _put(0) + b"".join(b"}(" + _str(b"a") + _get(i) + _str(b"b") + _get(i) + b"u" + _put(i + 1)
                                              for i in range(levels)) + b".")


def _nodes(tree) -> int:
    if isinstance(tree, dict):
        return 1 + sum(_nodes(v) for v in tree.values())
    if isinstance(tree, list):
        return 1 + sum(_nodes(v) for v in tree)
    return 1


def _describe(data: bytes):
    from ckptaudit.layouts.tree import PruneBudget, prune

    budget = PruneBudget()
    return prune(pickle_walk.walk(data).obj, {}, budget=budget), budget


def test_a_dag_of_shared_dicts_is_described_within_the_repeat_budget():
    """Guards against a 500-byte DAG of shared dicts being re-expanded up to the million-node tree budget, which
    every later stage then parsed again (past 1 GiB over the audit's process tree)."""
    import json

    from ckptaudit.layouts.tree import SHARED, SHARED_REPEAT_NODES

    tree, budget = _describe(_dict_dag(40))
    assert not budget.exhausted and budget.shared_cut > 0
    assert _nodes(tree) <= SHARED_REPEAT_NODES + 41 * 3
    assert SHARED in json.dumps(tree)
    # the first place a shared dict appears is always described: the spine down to d0 is whole
    node = tree
    for _ in range(40):
        node = node["a"]
    assert node == {}


def test_small_shared_containers_are_still_described_at_every_place():
    """Guards against the sharing bound dropping what a real checkpoint shares (one config dict under two keys,
    a small DAG): these are described at every place, as torch.load would rebuild them."""
    import pickle

    cfg = {"lr": 0.1, "layers": [1, 2, 3]}
    data = pickle.dumps({"hparams": cfg, "config": cfg}, protocol=2)  # the test's own object: safe to load
    tree, budget = _describe(data)
    assert tree == pickle.loads(data) and budget.shared_cut == 0
    small = _dict_dag(10)  # 2**11 - 1 dicts when rebuilt
    tree, budget = _describe(small)
    assert tree == pickle.loads(small) and budget.shared_cut == 0 and not budget.exhausted
    # EMPTY_TUPLE is one object however often a pickle pushes it: 200,000 of them are no sharing to bound
    many = b"\x80\x02](" + (b"](" + b")" * 4000 + b"e") * 50 + b"e."
    tree, budget = _describe(many)
    assert tree == [[[]] * 4000] * 50 and budget.shared_cut == 0


def test_a_long_string_shared_many_times_spends_the_budget_by_its_length():
    """Guards against one memoised 1 MB string fetched 4,096 times (20 KB of opcodes) writing a 4 GB tree."""
    import json

    from ckptaudit.layouts.tree import CHARS_PER_NODE, PRUNE_NODE_BUDGET

    data = b"\x80\x02" + _str(b"x" * (1 << 20)) + _put(0) + b"0](" + _get(0) * 4096 + b"e."
    tree, budget = _describe(data)
    assert budget.exhausted
    assert len(json.dumps(tree)) <= (PRUNE_NODE_BUDGET + 4096) * CHARS_PER_NODE + (1 << 20)


def test_the_scan_row_and_components_of_a_dict_dag_stay_small(tmp_path):
    """Guards against a consumer of the scan tree (the tree JSON, components) expanding a shared-dict DAG: the
    row's tree is bounded and its components are collected from it."""
    import zipfile

    from ckptaudit import components
    from ckptaudit.stages.inventory import run_inventory
    from ckptaudit.stages.scan import scan_units

    run = tmp_path / "run"
    run.mkdir()
    with zipfile.ZipFile(run / "ckpt_000300.pt", "w") as z:
        z.writestr("archive/data.pkl", _dict_dag(40))
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
    inv = run_inventory(str(run))
    (row,), _, _ = scan_units(run, inv["units"], {})
    assert "pickle_too_complex" in row["findings_json"] and "shared references" in row["findings_json"]
    assert len(row["tree_json"]) < 4 << 20
    c, tree, _ = components.of_scan_row(row)
    assert not c.weights
