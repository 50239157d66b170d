"""Structure layer: does each checkpoint fit the job that will resume?"""

import shutil

import pytest

from ckptaudit.stages import structure
from ckptaudit.pipeline import audit_in_process

from .conftest import CASES

MODEL = {"vocab": 64, "ctx": 16, "d": 32, "n_layer": 2, "n_head": 2}


def kinds(v, unit):
    return {f["kind"] for u in v["units"] if u["unit"] == unit for f in u["findings"]}


@pytest.mark.parametrize("keys,prefix", [
    (["module.a", "module.b"], "module."),
    (["_orig_mod.a"], "_orig_mod."),
    (["module._orig_mod.a", "module._orig_mod.b"], "module._orig_mod."),
    (["_orig_mod.module.a"], "_orig_mod.module."),
    (["module.a", "b"], ""),
    (["a"], ""),
])
def test_strip_prefix(keys, prefix):
    assert structure.strip_prefix(keys) == prefix


def test_mixed_structures_pick_the_newest_unit_that_fits(tmp_path):
    shutil.copy(CASES / "ok_full_torch" / "ckpt.pt", tmp_path / "ckpt_000006.pt")
    shutil.copy(CASES / "shape_mismatch_vocab_resize" / "ckpt.pt", tmp_path / "ckpt_000012.pt")
    v = audit_in_process(tmp_path, {"expected_model_args": MODEL})
    assert "size_mismatch" in kinds(v, "ckpt_000012.pt")
    f = next(f for u in v["units"] if u["unit"] == "ckpt_000012.pt" for f in u["findings"]
             if f["kind"] == "size_mismatch")
    assert "vocabulary resize (vocab 64 -> 72 at save time)" in f["message"]
    assert "wte.weight: saved (72, 32), expected (64, 32) (vocab 72 -> 64)" in f["message"]
    assert v["rollback"] == {"unit": "ckpt_000006.pt", "step": 6}
    # without a target the change inside the run is itself a finding
    v2 = audit_in_process(tmp_path)
    assert "model_changed_in_run" in kinds(v2, "ckpt_000012.pt")


def test_reference_checkpoint_names_the_prefix_only(tmp_path):
    shutil.copy(CASES / "prefix_module_ddp" / "ckpt.pt", tmp_path / "ckpt.pt")
    v = audit_in_process(tmp_path, {"reference": str(CASES / "ok_full_torch" / "ckpt.pt")})
    f = next(f for f in v["units"][0]["findings"] if f["kind"] == "key_prefix_mismatch")
    assert f["repair"] == "state_dict = {k.removeprefix('module.'): v for k, v in state_dict.items()}"
    assert {x["kind"] for x in v["units"][0]["findings"] if x["layer"] == "structure"} == {"key_prefix_mismatch"}


def test_model_factory_on_the_meta_device(demo_run, tmp_path):
    import torch

    args = torch.load(demo_run.run_dir / "ckpt_000250.pt", weights_only=True)["model_args"]
    v = audit_in_process(demo_run.run_dir, {"model_factory": "ckptaudit.demo:build_model",
                                            "expected_model_args": args})
    assert not [f for u in v["units"] for f in u["findings"] if f["layer"] == "structure"]
    deeper = dict(args, n_layer=args["n_layer"] + 1)
    v = audit_in_process(demo_run.run_dir, {"model_factory": "ckptaudit.demo:build_model",
                                            "expected_model_args": deeper})
    assert "missing_keys" in kinds(v, "ckpt_000250.pt")
    assert v["recommendation"] == "retrain"


def test_bad_factory_is_an_audit_error(demo_run):
    from ckptaudit.stages.target import TargetError

    with pytest.raises(TargetError, match="no_such_module"):
        audit_in_process(demo_run.run_dir, {"model_factory": "no_such_module:fn"})


def test_optimizer_counts_past_the_pruned_tree(tmp_path):
    """The scan tree keeps 4,096 keys of a dict: a state dict of 4,100 parameters with AdamW's state was
    counted as 4,096 parameters against 4,100 ids and 4,096 states (optimizer_param_group_size_mismatch,
    optimizer_state_incomplete, warm-start) where the checkpoint is whole."""
    import json

    import torch

    from ckptaudit import tables

    n = 4100
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in range(n)]
    opt = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.ones(1)
    opt.step()
    (tmp_path / "run").mkdir()
    torch.save({"model": {f"h.{i}.weight": p.detach() for i, p in enumerate(params)},
                "optimizer": opt.state_dict(), "iter_num": 1}, tmp_path / "run" / "ckpt.pt")
    v = audit_in_process(tmp_path / "run", out_dir=tmp_path / "out")
    assert kinds(v, "ckpt.pt") == {"sidecar_missing"}
    assert v["recommendation"] == "resume"
    row = next(iter(tables.read_rows(next((tmp_path / "out").rglob("structure*.parquet")))))
    assert (row["model_params"], row["optimizer_params"]) == (4100, 4100)
    scan = next(iter(tables.read_rows(next((tmp_path / "out").rglob("scan*.parquet")))))
    (tree,) = json.loads(scan["tree_json"]).values()
    assert tree["model"]["__truncated__"] == 4100 and len(tree["model"]) == 4097


def test_a_linear_named_attn_has_a_parameter_bias_and_gpt2s_mask_is_a_buffer(tmp_path):
    """``….attn.bias`` was always taken for GPT-2's causal-mask buffer: the bias of an ``nn.Linear`` called
    ``attn`` (a 1-D parameter with Adam state) then gave "optimizer state for 4 parameters, model has 3" and a
    WARM-START on a whole checkpoint.  A square mask stays a buffer."""
    import torch

    from ckptaudit import tables

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.Linear(8, 8)
            self.proj = torch.nn.Linear(8, 8, bias=False)
            self.register_buffer("mask", torch.tril(torch.ones(1, 1, 4, 4)))  # stored as a second key below

        def forward(self, x):
            return self.proj(torch.relu(self.attn(x)))

    model = torch.nn.Sequential(Block(), Block())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 8)).pow(2).mean().backward()
        opt.step()
    sd = model.state_dict()
    sd["0.causal.attn.bias"] = torch.tril(torch.ones(1, 1, 4, 4))  # GPT-2's mask, named as HF names it
    (tmp_path / "run").mkdir()
    torch.save({"model": sd, "optimizer": opt.state_dict(), "iter_num": 3}, tmp_path / "run" / "ckpt_3.pt")
    v = audit_in_process(tmp_path / "run", out_dir=tmp_path / "out")
    assert v["recommendation"] == "resume" and kinds(v, "ckpt_3.pt") == {"sidecar_missing"}
    row = next(iter(tables.read_rows(next((tmp_path / "out").rglob("structure*.parquet")))))
    assert (row["model_params"], row["optimizer_params"]) == (6, 6)  # 2 × (attn.weight, attn.bias, proj.weight)
    assert structure.is_buffer("h.0.attn.bias", [1, 1, 1024, 1024]) and not structure.is_buffer("x.attn.bias", [8])
