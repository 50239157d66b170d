"""A DCP save of a whole training state is read as one, whichever way its optimizer state is keyed.

Regression (issue 42): a torchtitan 0.3.0 save keeps the model's entries at the state dict's root beside
``optimizer``, ``lr_scheduler``, ``dataloader`` and ``train_state``; the root was taken whole as weights, so every
full save was judged weights-only (warm-start where torchtitan resumes).  Megatron-Core keys its per-parameter
moments state name first (``optimizer.state.exp_avg.<param>``); one structural reading serves both.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from ckptaudit import components as C
from ckptaudit import producers
from ckptaudit import recognise as R
from ckptaudit.pipeline import audit_in_process


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _trained(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
    for _ in range(7):
        model(torch.randn(3, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return opt, sched


def _save(state: dict, folder) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # single process: DCP warns that it runs without a process group
        dcp.save(state, checkpoint_id=str(folder))


def _units(v: dict) -> dict:
    return {u["unit"]: u for u in v["units"]}


@pytest.mark.parametrize("contracts", ["1", "0"])
def test_weights_at_the_root_beside_the_training_state_resume(tmp_path, monkeypatch, contracts):
    """torchtitan's layout (components/checkpointer/dcp.py :692-713): model keys at the root, the optimizer flat
    (state.<fqn>.<name>, param_groups.<fqn>.<key>), the scheduler as {last_epoch}, train_state.step."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    monkeypatch.setenv("CKPTAUDIT_PRODUCER_CONTRACTS", contracts)
    model = _model()
    opt, sched = _trained(model)
    state = {"optimizer": get_optimizer_state_dict(model, opt, options=StateDictOptions(flatten_optimizer_state_dict=True)),
             "lr_scheduler": {"last_epoch": sched.last_epoch}, "train_state": {"step": 7, "ntokens_seen": 21},
             "dataloader": {"dp_rank_0": b"\x80\x04}\x94.", "world_size": 1}, **model.state_dict()}
    run = tmp_path / "run"
    _save(state, run / "checkpoint" / "step-7")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    u = _units(v)["checkpoint/step-7"]
    assert (v["recommendation"], v["rollback"], u["usable_for"]) == ("resume", {"unit": "checkpoint/step-7", "step": 7},
                                                                   "resume"), u["findings"]
    assert not [f["kind"] for f in u["findings"] if f["kind"] == "weights_only_checkpoint"]


def _megatron_shaped(model, opt) -> dict:
    """The items a Megatron-Core distributed optimizer adds beside the model in ``fully_sharded_model_space``:
    ``optimizer.state.<state name>.<model key>`` (megatron-core 0.16.1 megatron/core/optimizer/distrib_optimizer.py
    :1709 ``prefix = 'optimizer.state'``, :1717 ``tensors["fp32_param"] = tensors.pop("param")``, :1745
    ``key=f'{prefix}.{state_key}.{sharded_metadata.key}'``; ``step`` is not saved there, :1738-1744), given to DCP
    as flat keys, as Megatron's own planner (``flatten_state_dict=False``) writes them."""
    sd = dict(model.state_dict())
    names = {p: n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        sd[f"optimizer.state.fp32_param.{names[p]}"] = p.detach().clone()
        for leaf in ("exp_avg", "exp_avg_sq"):
            sd[f"optimizer.state.{leaf}.{names[p]}"] = st[leaf]
    return sd


def test_megatron_ordering_moment_before_parameter_is_an_optimizer_state(tmp_path):
    model = _model()
    opt, _ = _trained(model)
    _save(_megatron_shaped(model, opt), tmp_path / "run" / "iter_0000007")
    v = audit_in_process(tmp_path / "run", {}, out_dir=tmp_path / "out")
    c = C.of_scan_row(_scan_row(tmp_path / "out"))[0]
    params = sorted(n for n, _ in model.named_parameters())
    assert sorted(c.weights) == params  # the moments are not taken as a second (larger) copy of the weights
    assert sorted(c.optimizer["state"]) == params
    assert all(set(s) == {"fp32_param", "exp_avg", "exp_avg_sq"} for s in c.optimizer["state"].values())
    assert v["units"][0]["usable_for"] in ("resume", "warm-start")


def _scan_row(out) -> dict:
    import pyarrow.parquet as pq

    return pq.read_table(out / "tables" / "scan.parquet").to_pylist()[0]


def test_one_table_for_both_orderings_chosen_by_shape():
    t = lambda *shape: {"__tensor__": "float32", "shape": list(shape)}  # noqa: E731
    param_first = {"state.a.weight.exp_avg": t(8, 4), "state.a.weight.exp_avg_sq": t(8, 4), "state.a.bias.exp_avg": t(8),
                   "state.a.bias.exp_avg_sq": t(8), "param_groups.a.weight.lr": 0.1, "param_groups.a.bias.lr": 0.1}
    state_first = {"state.exp_avg.a.weight": t(8, 4), "state.exp_avg_sq.a.weight": t(8, 4),
                   "state.exp_avg.a.bias": t(8), "state.exp_avg_sq.a.bias": t(8)}
    for d in (param_first, state_first):
        assert R.is_flat_optimizer(d)
        st = R.unflatten_optimizer(d)["state"]
        assert sorted(st) == ["a.bias", "a.weight"] and set(st["a.weight"]) == {"exp_avg", "exp_avg_sq"}, st
    # weights alone under a "state." prefix are no optimizer: a weight and a bias never share one shape
    assert not R.is_flat_optimizer({"state.fc.weight": t(8, 4), "state.fc.bias": t(8)})
    assert R.is_scheduler({"last_epoch": 20}) and not R.is_scheduler({"last_epoch": True})


def test_step_folders_are_resumed_by_torchtitan_other_dcp_folders_by_dcp_load():
    tt = producers.for_unit({"unit": "checkpoint/step-20", "layout": "dcp"})
    plain = producers.for_unit({"unit": "ckpt/epoch_2", "layout": "dcp"})
    assert (tt.key, plain.key) == ("torchtitan", "dcp")
    from ckptaudit import resume_hint

    assert resume_hint.call("torchtitan", "/r", "checkpoint/step-20").endswith(
        '--checkpoint.folder "/r/checkpoint" --checkpoint.load_step 20')
    v = {"units": [{"unit": "checkpoint/step-30", "findings": [{"kind": "dcp_metadata_missing"}]},
                   {"unit": "checkpoint/step-20", "findings": []}, {"unit": "checkpoint/step-10", "findings": []},
                   {"unit": "other/step-40", "findings": []}]}
    assert tt.default_pick(v, "checkpoint") == ("checkpoint/step-20", True)  # _find_load_step skips no .metadata
