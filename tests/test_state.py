"""The streamed value scan: NaN/Inf by bit pattern, norms, bounded reads."""

import json
import math

import numpy as np
import pytest

from ckptaudit.stages import state


def _tensor_file(tmp_path, arr: np.ndarray, dtype: str):
    p = tmp_path / "t.bin"
    raw = arr.tobytes()
    p.write_bytes(b"\xff" * 16 + raw)  # data starts at offset 16
    return p, [{"file": "t.bin", "name": "w", "dtype": dtype, "data_offset": 16, "nbytes": len(raw)}]


@pytest.mark.parametrize("chunk", [4, 64, 1 << 20])
def test_float32_nan_inf_and_norm(tmp_path, chunk):
    a = np.arange(1000, dtype=np.float32)
    a[7], a[500] = np.nan, np.inf
    p, t = _tensor_file(tmp_path, a, "float32")
    r = state.scan_values(tmp_path, t, chunk)["w"]
    finite = np.delete(a, [7, 500]).astype(np.float64)
    assert r["nonfinite"] == 2 and not r["short"]
    assert r["norm"] == pytest.approx(math.sqrt(float(finite @ finite)))


def test_bfloat16_by_bit_pattern(tmp_path):
    f32 = np.array([1.0, -2.0, np.nan, np.inf, 3.0], dtype=np.float32)
    bf16 = (f32.view(np.uint32) >> 16).astype(np.uint16)
    p, t = _tensor_file(tmp_path, bf16, "bfloat16")
    r = state.scan_values(tmp_path, t, 1 << 20)["w"]
    assert r["nonfinite"] == 2
    assert r["norm"] == pytest.approx(math.sqrt(1 + 4 + 9))


def test_float16_and_short_file(tmp_path):
    a = np.array([1, 2, np.nan], dtype=np.float16)
    p, t = _tensor_file(tmp_path, a, "float16")
    t[0]["nbytes"] += 100  # the file ends before the tensor does
    r = state.scan_values(tmp_path, t, 1 << 20)["w"]
    assert r["short"] is True


def test_tied_tensors_are_read_once(tmp_path, monkeypatch):
    a = np.ones(10, dtype=np.float32)
    p, t = _tensor_file(tmp_path, a, "float32")
    t.append(dict(t[0], name="alias"))
    calls = []
    real = state.chunk_stats
    monkeypatch.setattr(state, "chunk_stats", lambda *x: calls.append(1) or real(*x))
    r = state.scan_values(tmp_path, t, 1 << 20)
    assert r["w"] == r["alias"] and len(calls) == 1


def test_a_walk_cut_by_its_budget_is_not_a_unit_without_weights(tmp_path):
    """A torch.save of 200,000 tensors (a 14 MB data.pkl) ran past the static walk's 5 M-opcode budget before
    the top-level dict was built: the empty tree became `missing_model_weights`, an error, and the verdict
    said retrain for an intact checkpoint.  A cut walk leaves the state unknown, never "no weights"."""
    from ckptaudit.findings import make

    unit = {"unit": "ckpt_001000.pt", "step_from_name": 1000, "files": ["ckpt_001000.pt"]}
    too_complex = make("pickle_too_complex", path="ckpt_001000.pt", member="archive/data.pkl",
                       why="gave up after max_ops=5000000 opcodes at byte 14248990", imports="none").to_dict()
    cut = {"file_ok": True, "security_ok": True, "tree_json": "", "findings_json": json.dumps([too_complex])}
    row = state.analyse_unit(unit, cut, [], tmp_path, {})
    assert row.findings == () and row.has_weights is None
    assert row.step == 1000 and row.step_source == "name"
    partial = {**cut, "tree_json": '{"root": null}'}  # what the scan stage writes for that cut walk
    row = state.analyse_unit(unit, partial, [], tmp_path, {})
    assert row.findings == () and row.has_weights is None
    empty = {**cut, "findings_json": "[]"}  # nothing cut: an empty unit still has no weights
    row = state.analyse_unit(unit, empty, [], tmp_path, {})
    assert [f.kind for f in row.findings] == ["missing_model_weights"]
    assert row.has_weights is False


def test_a_cut_walk_is_settled_by_what_torch_load_found():
    """The cut walk leaves has_weights unknown; the load test's count decides.  A unit whose every file loaded
    with no tensor (a pickle of 20 million integers) holds no weights; one with tensors, or one a file of which
    was not loaded, stays open (tests/test_hostile.py runs both through the workflow)."""
    from ckptaudit import cut_walk
    from ckptaudit.findings import make

    too_complex = make("pickle_too_complex", path="c.pt", member="archive/data.pkl", why="gave up",
                       imports="none").to_dict()
    scans = {u: {"findings_json": json.dumps([too_complex])} for u in ("empty", "full", "unloaded")}
    scans["whole"] = {"findings_json": "[]"}
    states = {u: {"has_weights": None} for u in scans} | {"whole": {"has_weights": None}}
    ok = {"status": "ok", "n_top_level_keys": -1}
    loads = {"empty": [{"unit": "empty", "file": "c.pt", **ok, "n_tensors": 0}],
             "full": [{"unit": "full", "file": "c.pt", **ok, "n_tensors": 200_000}],
             "unloaded": [{"unit": "unloaded", "file": "c.pt", "status": "timeout", "n_tensors": None}],
             "whole": [{"unit": "whole", "file": "c.pt", **ok, "n_tensors": 0}]}
    out = cut_walk.findings(list(scans), scans, states, loads)
    assert list(out) == ["empty"]
    (f,) = out["empty"]
    assert f["kind"] == "missing_model_weights" and f["severity"] == "error"
    assert "c.pt: an object that is not a dict with no tensor" in f["message"]


def test_norms_json_writes_what_json_dumps_wrote():
    """Issue 45: ``json.dumps`` of 1,000,000 weights' norms held ~130 MiB of chunks in the state job; the text
    written entry by entry is the same text, infinities and escapes included."""
    import json

    from ckptaudit.stages.weight_norms import norms_json

    for norms in ({}, {"a": 1.0}, {'lm_head.wé"x': 1.23456789, "b": float("inf"), "c": 0.0, "d": 1e-7,
                                   "e": 123456789.0}):
        assert norms_json(norms) == json.dumps({k: round(v, 6) for k, v in norms.items()})
    assert norms_json({"w": 2.0000004}) == '{"w": 2.0}'


def test_weight_norms_answer_as_the_dict_they_replace():
    """Issue 45: the state job kept a dict of every weight's norm (~120 MiB at 1,000,000 weights); the columns
    that replace it give the same pairs in the same order, a name judged twice and a dropped name included."""
    from ckptaudit.stages.weight_norms import WeightNorms, norms_json

    def both(ops):
        d, w = {}, WeightNorms()
        for op, name, v in ops:
            if op == "set":
                d[name] = v
                w.set(name, v)
            else:
                d.pop(name, None)
                w.drop(name)
        assert list(w.items()) == list(d.items()) and bool(w) == bool(d)
        assert norms_json(w) == norms_json(d)
        return list(w.items())

    assert both([]) == []
    assert both([("set", "a", 1.0), ("set", "b\ud800", 2.0)]) == [("a", 1.0), ("b\ud800", 2.0)]
    assert both([("set", "a", 1.0), ("set", "b", 2.0), ("set", "a", 3.0)]) == [("a", 3.0), ("b", 2.0)]
    assert both([("set", "a", 1.0), ("drop", "a", None), ("set", "b", 2.0)]) == [("b", 2.0)]
    assert both([("drop", "x", None), ("set", "a", 1.0), ("set", "x", 5.0)]) == [("a", 1.0), ("x", 5.0)]
    assert both([("set", "a", 1.0), ("drop", "a", None), ("set", "a", 4.0)]) == [("a", 4.0)]
