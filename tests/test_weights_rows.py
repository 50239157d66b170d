"""A state_dict or safetensors header larger than the scan tree's 4,096 entries is judged on every key.

The scan tree keeps 4,096 entries of a dict (a 100,000-entry tree decoded by every stage is what pushed the
structure and state jobs past their memory bound, issue 22); the structure layer and the reference builder
read the rest from the tensors table (:mod:`ckptaudit.components.weights_rows`).  The files are written by
``torch.save`` and ``safetensors.torch.save_file`` themselves.
"""

import json

import pyarrow.parquet as pq
import pytest

from ckptaudit.pipeline import audit_in_process

N = 5000  # > 4,096


def _state_dict(torch, n=N, skip=None):
    return {f"blocks.{i}.weight": torch.full((2,), float(i)) for i in range(n) if i != skip}


def _kinds(v, layer="structure"):
    return sorted(f["kind"] for u in v["units"] for f in u["findings"] if f["layer"] == layer)


def test_torch_state_dict_past_the_tree_against_a_reference(tmp_path):
    torch = pytest.importorskip("torch")
    ref = tmp_path / "reference.pt"
    torch.save(_state_dict(torch), ref)
    run = tmp_path / "run"
    run.mkdir()
    torch.save(_state_dict(torch, skip=4500), run / "ckpt_000010.pt")  # the key lost lies past entry 4,096
    v = audit_in_process(run, {"reference": str(ref)}, out_dir=tmp_path / "out")
    f = next(f for u in v["units"] for f in u["findings"] if f["kind"] == "missing_keys")
    assert "'blocks.4500.weight'" in f["message"]
    assert _kinds(v) == ["missing_keys"]  # and no unexpected key: all 4,999 others matched
    row = pq.read_table(tmp_path / "out" / "tables" / "structure.parquet").to_pylist()[0]
    assert (row["n_weight_keys"], row["n_missing"], row["n_unexpected"]) == (N - 1, 1, 0)


def test_intact_torch_state_dict_past_the_tree_has_no_structure_finding(tmp_path):
    torch = pytest.importorskip("torch")
    ref = tmp_path / "reference.pt"
    torch.save(_state_dict(torch), ref)
    run = tmp_path / "run"
    run.mkdir()
    torch.save(_state_dict(torch), run / "ckpt_000010.pt")
    v = audit_in_process(run, {"reference": str(ref)}, out_dir=tmp_path / "out")
    assert _kinds(v) == []
    row = pq.read_table(tmp_path / "out" / "tables" / "structure.parquet").to_pylist()[0]
    assert (row["n_weight_keys"], row["n_missing"], row["n_unexpected"]) == (N, 0, 0)


def test_safetensors_header_past_the_tree(tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.torch")
    ref = tmp_path / "reference.safetensors"
    st.save_file(_state_dict(torch), str(ref))
    run = tmp_path / "run"
    run.mkdir()
    sd = _state_dict(torch)
    sd["blocks.4999.weight"] = torch.zeros(3)  # a shape change past entry 4,096 (the header is sorted by name)
    st.save_file(sd, str(run / "model.safetensors"))
    v = audit_in_process(run, {"reference": str(ref)}, out_dir=tmp_path / "out")
    f = next(f for u in v["units"] for f in u["findings"] if f["kind"] == "size_mismatch")
    assert "blocks.4999.weight: saved (3,), expected (2,)" in f["message"]
    scan = pq.read_table(tmp_path / "out" / "tables" / "scan.parquet").to_pylist()[0]
    tree = json.loads(scan["tree_json"])["root"]["__safetensors__"]
    assert len(tree) == 4097 and tree["__truncated__"] == N  # the stored tree is cut; the judgement is not
    row = pq.read_table(tmp_path / "out" / "tables" / "structure.parquet").to_pylist()[0]
    assert (row["n_weight_keys"], row["n_shape_mismatch"]) == (N, 1)


def test_weights_of_one_dtype_and_shape_share_one_value():
    """Issue 45: a dict per weight held the structure job at 567 MiB for 1,000,000 one-element tensors; weights
    of equal dtype and shape now share one value, and the values still read as before."""
    from ckptaudit import components as C
    from ckptaudit.components.weights_rows import complete

    c = C.Components(weights={}, weights_cut_at=[("model.safetensors", "")])
    rows = [{"file": "model.safetensors", "name": f"t.{i}", "dtype": "float32", "shape": [1]} for i in range(3)]
    rows.append({"file": "model.safetensors", "name": "w", "dtype": "float16", "shape": [2, 3]})
    w = complete(c, {}, rows)
    assert w == {"t.0": {"__tensor__": "float32", "shape": [1]}, "t.1": {"__tensor__": "float32", "shape": [1]},
                 "t.2": {"__tensor__": "float32", "shape": [1]}, "w": {"__tensor__": "float16", "shape": [2, 3]}}
    assert w["t.0"] is w["t.1"] is w["t.2"]
    assert w["w"] is not w["t.0"]
