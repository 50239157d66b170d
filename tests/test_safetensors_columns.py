"""A safetensors header parsed into columns says what ``json.loads`` and ``safetensors`` itself say of it.

Issue 45: a 1,000,000-entry header parsed as one JSON document held the scan job at 1,398 MiB.  Large headers are
now parsed entry by entry into arrays (:mod:`ckptaudit.formats.safetensors_columns`) and their spans checked over
arrays (:mod:`ckptaudit.formats.safetensors_spans`); these tests force that path on small files
(``COLUMNS_MIN_HEADER_BYTES = 0``) and hold it equal to the dict path and to the ``safetensors`` library.
"""

import json
import struct
from dataclasses import asdict
from pathlib import Path

import pytest

from ckptaudit.formats import safetensors_check as sc
from ckptaudit.formats import safetensors_columns

CASES = Path("/work/shared/cases")


def _blob(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def _check(path, columns: bool):
    """``(header, findings as dicts)`` of :func:`check_safetensors` on the columns path or the dict path."""
    old = sc.COLUMNS_MIN_HEADER_BYTES
    sc.COLUMNS_MIN_HEADER_BYTES = 0 if columns else 1 << 40
    try:
        h, fl = sc.check_safetensors(path)
    finally:
        sc.COLUMNS_MIN_HEADER_BYTES = old
    return h, [f.to_dict() for f in fl]


def _same_both_ways(path):
    hc, fc = _check(path, True)
    hd, fd = _check(path, False)
    assert fc == fd
    assert (hc is None) == (hd is None)
    if hd is not None:
        assert sc.valid_entries(hc) == sc.valid_entries(hd)
        assert list(hc) == list(hd)
        assert hc.get("__metadata__") == hd.get("__metadata__")
    return hc, fc


def _real_file(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    tensors = {"a.weight": torch.randn(3, 4), "b": torch.zeros(0, 2, dtype=torch.float16),
               "c.scalar": torch.tensor(7, dtype=torch.int64), "d": torch.ones(5, dtype=torch.bfloat16),
               "e": torch.tensor([True, False]), "f": torch.arange(6, dtype=torch.uint8).reshape(2, 3)}
    p = tmp_path / "model.safetensors"
    save_file(tensors, str(p), metadata={"format": "pt", "step": "3"})
    return p


def test_columns_agree_with_safetensors_own_reader(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    p = _real_file(tmp_path)
    h, fl = _same_both_ways(p)
    assert fl == [] and isinstance(h, safetensors_columns.HeaderColumns)  # forced: the columns path
    raw = p.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    cols, why = safetensors_columns.parse(raw[8:8 + n].decode())
    assert why == "" and cols.source is None
    want = json.loads(raw[8:8 + n])
    with safetensors.safe_open(str(p), framework="pt") as f:
        keys = list(f.keys())
        assert sorted(cols.name(i) for i in range(len(cols))) == sorted(keys)
        for i in range(len(cols)):
            name = cols.name(i)
            sl = f.get_slice(name)
            assert cols.dtype(i) == sl.get_dtype() == want[name]["dtype"]
            assert cols.shape(i) == list(sl.get_shape()) == want[name]["shape"]
            assert [cols.begin[i], cols.end[i]] == want[name]["data_offsets"]
        assert cols.metadata == f.metadata() == {"format": "pt", "step": "3"}
    assert [cols.name(i) for i in range(len(cols))] == [k for k in want if k != "__metadata__"]


def test_every_safetensors_case_is_judged_the_same_both_ways():
    paths = [p for p in CASES.glob("**/*.safetensors") if p.is_file()]
    assert len(paths) >= 5
    for p in paths:
        _same_both_ways(p)


def test_columns_give_the_same_tensor_rows(tmp_path):
    """The scan's ``tensors`` table from the columns equals the one made a TensorRow per tensor."""
    pytest.importorskip("torch")
    from ckptaudit.layouts.base import UnitScan, scan_file

    p = _real_file(tmp_path)
    tables = []
    for columns in (True, False):
        old = sc.COLUMNS_MIN_HEADER_BYTES
        sc.COLUMNS_MIN_HEADER_BYTES = 0 if columns else 1 << 40
        try:
            s = UnitScan("u", "single")
            info = scan_file(tmp_path, p.name, "u", s, {"security": {"allow_globals": []}})
        finally:
            sc.COLUMNS_MIN_HEADER_BYTES = old
        assert s.n_tensors() == 6 and s.row()["n_tensors"] == 6
        assert bool(s.tensor_tables) == columns  # a table from the columns, TensorRows from the dict
        tables.append(([asdict(t) for t in s.iter_tensors()], s.tree, sorted(info["header"])))
    (rows_c, tree_c, keys_c), (rows_d, tree_d, keys_d) = tables
    assert rows_c == rows_d and tree_c == tree_d and keys_c == keys_d
    assert {r["name"]: (r["dtype"], r["shape"], r["numel"], r["nbytes"]) for r in rows_c}["a.weight"] == \
        ("float32", [3, 4], 12, 48)
    assert {r["name"]: r["numel"] for r in rows_c}["c.scalar"] == 1


def _entry(dtype="F32", shape=(1,), off=(0, 4)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(off)}


HOSTILE = {
    "duplicate": b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],'
                 b'"data_offsets":[0,4]}}',
    "gap": json.dumps({"a": _entry(), "b": _entry(off=(8, 12))}).encode(),
    "overlap": json.dumps({"a": _entry(off=(0, 8), shape=(2,)), "b": _entry(off=(4, 8))}).encode(),
    "equal spans": json.dumps({"b": _entry(), "a": _entry()}).encode(),
    "end before begin": json.dumps({"a": _entry(off=(4, 0))}).encode(),
    "wrong size": json.dumps({"a": _entry(shape=(3,))}).encode(),
    "not whole bytes": json.dumps({"a": _entry(dtype="F4", shape=(1,), off=(0, 1))}).encode(),
    "unknown dtype": json.dumps({"a": _entry(dtype="F33")}).encode(),
    "bad shape": json.dumps({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}).encode(),
    "bad metadata": json.dumps({"__metadata__": {"k": 1}, "a": _entry()}).encode(),
    "two metadata": b'{"__metadata__":{"a":"1"},"__metadata__":{"a":"2"},"a":{"dtype":"F32","shape":[1],'
                    b'"data_offsets":[0,4]}}',
    "not utf-8": b'{"\xff":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
    "lone surrogate": b'{"\\ud800x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}',
    "beyond int64": json.dumps({"a": _entry(off=(0, 2 ** 64))}).encode(),
    "syntax error": b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":',
    "extra data": b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x',
    "array": b'[1,2]',
    "empty object": b'{}',
    "entry not an object": b'{"a":3}',
    "padded": json.dumps({"a": _entry()}).encode() + b"       ",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_headers_are_judged_as_json_loads_judges_them(tmp_path, name):
    p = tmp_path / "x.safetensors"
    p.write_bytes(_blob(HOSTILE[name], b"\x01\x02\x03\x04" * 2))
    h, fl = _same_both_ways(p)
    if name in ("duplicate", "gap", "overlap", "wrong size", "beyond int64", "syntax error", "not utf-8"):
        assert any(f["severity"] == "error" for f in fl), fl


def test_huge_header_length_is_refused_before_any_parse(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", sc.MAX_HEADER_BYTES + 1) + b"{}")
    h, fl = _same_both_ways(p)
    assert h is None and [f["kind"] for f in fl] == ["header_too_large"]


def test_truncated_data_and_zeroed_span_are_worded_the_same(tmp_path):
    names = [f"t.{i:04d}" for i in range(64)]  # 64 float32 tensors of 256 elements: 1,024 bytes each
    head = json.dumps({k: _entry(shape=(256,), off=(1024 * i, 1024 * i + 1024)) for i, k in enumerate(names)}).encode()
    data = (bytes(range(1, 256)) * 258)[:65536]  # non-zero values
    p = tmp_path / "cut.safetensors"
    p.write_bytes(_blob(head, data[:10_001]))
    _, fl = _same_both_ways(p)
    assert [f["kind"] for f in fl] == ["truncated_in_data"]
    assert "9 of 64 tensors lie wholly inside the file; the cut falls inside 't.0009' after 785 of its 1024 " \
           "bytes" in fl[0]["message"]
    z = tmp_path / "zeroed.safetensors"
    body = bytearray(data)
    body[1500:1500 + 8192] = bytes(8192)  # a lost block across tensor boundaries
    z.write_bytes(_blob(head, bytes(body)))
    _, fl = _same_both_ways(z)
    assert [f["kind"] for f in fl] == ["zero_filled_span"], fl
    assert "'t.0001'..'t.0009'" in fl[0]["message"]


def test_columns_hold_no_object_per_entry():
    """The columns of 100,000 entries are arrays: a few dozen bytes per entry, not a dict of dicts."""
    n = 100_000
    head = "{" + ",".join(f'"t.{i}":{{"dtype":"F32","shape":[1],"data_offsets":[{4 * i},{4 * i + 4}]}}'
                          for i in range(n)) + "}"
    cols, why = safetensors_columns.parse(head)
    assert why == "" and len(cols) == n and cols.source is None
    held = sum(len(memoryview(a).cast("B")) for a in (cols.names, cols.name_ends, cols.dtype_code, cols.valid,
                                                       cols.dims, cols.dim_ends, cols.begin, cols.end,
                                                       cols.need_bytes, cols.name_hash))
    assert held < 70 * n
    assert cols.name(n - 1) == f"t.{n - 1}" and cols.shape(7) == [1] and cols.dtype(7) == "F32"
    assert (cols.begin[n - 1], cols.end[n - 1]) == (4 * n - 4, 4 * n)
