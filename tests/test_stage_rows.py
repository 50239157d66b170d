"""Issue 44: the stages' rows are typed values (``ckptaudit.stages.rows``): findings as ``Finding`` values, one
conversion to the table record (``to_record``) and one back (``of``), losing nothing through the Parquet file."""

from __future__ import annotations

import pytest

from .conftest import CASES


@pytest.fixture(scope="module")
def stage_rows(tmp_path_factory):
    """Every per-part stage's rows of a real case folder (a torch.save checkpoint whose optimizer's param
    groups disagree with its weights), handed from stage to stage in memory as the in-process audit does, with
    a target torch release the checkpoint was not saved with (a ``configdiff`` finding)."""
    from ckptaudit import fs
    from ckptaudit.pipeline import merged_config
    from ckptaudit.stages import cli, configdiff, hash as hashing, load, scan, state, structure
    from ckptaudit.stages.context import Part, StageContext
    from ckptaudit.stages.rows import EarlierRows

    run = CASES / "optimizer_param_group_mismatch"
    if not run.is_dir():
        pytest.skip(f"no case folder {run}")
    tmp = tmp_path_factory.mktemp("rows")
    inv = cli.stage_inventory(str(run), "auto", str(tmp / "inventory.parquet"), str(tmp / "inventory.json"),
                              str(tmp / "pointers.parquet"))
    cfg = merged_config({"target": {"torch_version": "1.13.1"}})
    ctx = StageContext(fs.path(inv["run_dir"]), inv, cfg, work=tmp / "work")
    (name,) = sorted(inv["parts"])
    part = Part(name, tuple(cli.part_units(inv, name)))
    h = hashing.run(ctx, part, EarlierRows())
    s = scan.run(ctx, part, EarlierRows(hash=h))
    return {"hash": h.rows, "imports": s.imports, "load": load.run(ctx, part, EarlierRows(hash=h, scan=s)).rows,
            "structure": structure.run(ctx, part, EarlierRows(scan=s)).rows,
            "configdiff": configdiff.run(ctx, part, EarlierRows(scan=s)).rows,
            "state": state.run(ctx, part, EarlierRows(hash=h, scan=s)).rows}, tmp


def test_the_stages_hand_on_typed_rows_with_finding_values(stage_rows):
    from ckptaudit.findings import Finding
    from ckptaudit.stages.rows import TableRow

    got, _ = stage_rows
    for table, rows in got.items():
        assert rows and all(isinstance(r, TableRow) and r.TABLE == table for r in rows), table
    kinds = {t: sorted(f.kind for r in got[t] for f in r.findings) for t in got if t != "imports"}
    assert all(isinstance(f, Finding) for t in kinds for r in got[t] for f in r.findings)
    assert kinds == {"hash": ["sidecar_missing"], "load": [], "structure": ["optimizer_param_group_size_mismatch"],
                     "configdiff": ["torch_version_differs"],
                     "state": ["optimizer_state_incomplete", "optimizer_step_mismatch"]}
    assert kinds["configdiff"] == ["torch_version_differs"]
    (cd,) = [r for r in got["configdiff"] if r.key == "torch_version"]
    assert cd.target == "1.13.1" and cd.klass == "risky"
    assert got["load"][0].status == "ok" and got["load"][0].findings == ()
    assert {i.module for i in got["imports"]} == {"collections", "torch", "torch._utils"}


def test_a_typed_row_is_its_table_record_and_back_through_parquet(stage_rows):
    """``to_record`` writes what the table holds, ``of`` reads it back equal, and rewriting the read-back rows
    gives the same Parquet bytes."""
    from ckptaudit import tables
    from ckptaudit.stages.rows import records

    got, tmp = stage_rows
    for table, rows in got.items():
        first = tmp / f"{table}.parquet"
        tables.write(table, records(rows), first)
        back = [type(rows[0]).of(rec) for rec in tables.read_rows(first)]
        assert back == list(rows), table
        again = tmp / f"{table}.again.parquet"
        tables.write(table, records(back), again)
        assert again.read_bytes() == first.read_bytes(), table
