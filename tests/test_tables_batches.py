"""Tables read and joined a batch at a time (issue 22): UnitRows gives each unit's rows as read_rows does; concat_batches
joins part tables without a Python row per tensor."""

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


def test_concat_batches_equals_concat(tmp_path):
    parts = []
    for k in range(3):
        rows = [{"unit": f"u{k}", "file": f"u{k}.pt", "name": f"t{i}", "dtype": "float32", "shape": [i, 2],
                 "numel": 2 * i, "nbytes": 8 * i, "storage_key": str(i), "data_offset": i, "is_parameter": True,
                 "storage_offset": 0} for i in range(k * 7)]  # the first part is empty
        parts.append(tmp_path / f"p{k}.parquet")
        tables.write("tensors", rows, parts[-1])
    assert tables.concat_batches("tensors", [str(p) for p in parts], tmp_path / "a.parquet") == 21
    want = tables.concat("tensors", [str(p) for p in parts], tmp_path / "b.parquet")
    assert tables.read_rows(tmp_path / "a.parquet") == want and len(want) == 21
    assert tables.concat_batches("tensors", [], tmp_path / "none.parquet") == 0
    assert tables.read_rows(tmp_path / "none.parquet") == []


def test_concat_of_a_part_written_before_a_column_existed(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    new = tmp_path / "new.parquet"
    tables.write("state", [{"unit": "b", "step": 2, "run_needs_json": "{}"}], new)
    old = tmp_path / "old.parquet"  # the state table of a part written before run_needs_json existed
    schema = tables.SCHEMAS["state"]
    two = pa.schema([schema.field("unit"), schema.field("step")])
    pq.write_table(pa.table({"unit": ["a"], "step": [1]}, schema=two), old)
    rows = tables.concat("state", [str(old), str(new)], tmp_path / "all.parquet")
    assert [(r["unit"], r["step"], r["run_needs_json"]) for r in rows] == [("a", 1, None), ("b", 2, "{}")]
    assert rows == tables.read_rows(tmp_path / "all.parquet") and list(rows[0]) == schema.names
    assert tables.concat("state", [], tmp_path / "none.parquet") == []
    assert pq.read_table(tmp_path / "none.parquet").schema == schema
