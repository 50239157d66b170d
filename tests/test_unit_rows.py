"""tables.UnitRows gives each unit's rows as read_rows does, a batch of dicts at a time (issue 22)."""

from ckptaudit import tables


def test_unit_rows_equal_read_rows_grouped(tmp_path, monkeypatch):
    rows = [{"unit": u, "file": f, "name": f"t{i}", "dtype": "float32", "data_offset": i, "nbytes": 4}
            for i, (u, f) in enumerate([("a", "a.pt")] * 5 + [("b", "b/x.bin")] * 3 + [("a", "a.pt")] * 2)]
    path = tmp_path / "tensors.parquet"
    tables.write("tensors", rows, path)
    cols = ["unit", "file", "name", "dtype", "data_offset", "nbytes"]
    monkeypatch.setattr(tables, "UNIT_BATCH_ROWS", 2)  # batches cross inside a unit's run of rows
    ur = tables.UnitRows(path, columns=cols)
    want = tables.read_rows(path, columns=cols)
    assert list(ur.rows("a")) == [r for r in want if r["unit"] == "a"]  # both runs of "a", in table order
    assert [r["name"] for r in ur.rows("a")] == ["t0", "t1", "t2", "t3", "t4", "t8", "t9"]
    assert list(ur.rows("b")) == [r for r in want if r["unit"] == "b"]
    assert list(ur.rows("no such unit")) == []
    a = list(ur.rows("a"))
    assert a[0]["file"] is a[1]["file"]  # a repeated value is one object within a batch


def test_unit_rows_of_an_empty_table(tmp_path):
    path = tmp_path / "tensors.parquet"
    tables.write("tensors", [], path)
    assert list(tables.UnitRows(path, columns=["unit", "name"]).rows("a")) == []
