"""One static walk per data.pkl shape in a hash job (ckptaudit.onepass.pickle_templates): checkpoints of one model
share a walk, their plans equal a plan that walks each; a template that places a tensor wrongly costs that tensor a
read of its own bytes, never a statistic of other bytes."""

import math

import pytest

torch = pytest.importorskip("torch")

from ckptaudit.onepass import facts  # noqa: E402
from ckptaudit.onepass.filepass import pass_file  # noqa: E402
from ckptaudit.onepass.pickle_templates import PickleTemplates  # noqa: E402
from ckptaudit.onepass.plan import plan_file  # noqa: E402
from ckptaudit.stages.state import value_stats  # noqa: E402


def _checkpoint(step: int, loss: float) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": step, "best_val_loss": loss}


def test_checkpoints_of_one_model_share_one_walk_and_plan_as_walked(tmp_path):
    paths = []
    for step, loss in ((300, 2.5), (400, 2.25), (500, 1.875)):  # steps of one width: a BININT2 operand each
        p = tmp_path / f"ckpt_{step}.pt"
        torch.save(_checkpoint(step, loss), p)  # torch's own writer: the archive prefix is the file's stem
        paths.append(p)
    t = PickleTemplates()
    shared = [plan_file(p, templates=t) for p in paths]
    walked = [plan_file(p) for p in paths]
    assert (t.walks, t.hits) == (1, 2)
    for a, b in zip(shared, walked):
        assert a.values == b.values and len(a.values) == 16  # 4 parameters, their exp_avg, exp_avg_sq and step
        assert a.crc == b.crc


def test_a_pickle_that_differs_outside_a_literal_number_is_walked(tmp_path):
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"w": torch.zeros(4), "tag": "aa"}, a)
    torch.save({"w": torch.zeros(4), "tag": "ab"}, b)  # same length, a string operand differs
    t = PickleTemplates()
    plan_file(a, templates=t)
    plan_file(b, templates=t)
    assert (t.walks, t.hits) == (2, 0)


def test_a_template_that_misplaces_a_tensor_costs_a_read_not_a_wrong_statistic(tmp_path):
    base = torch.arange(16, dtype=torch.float32)
    r, u = tmp_path / "r.pt", tmp_path / "u.pt"
    torch.save({"w": base[2:10]}, r)  # a view: the whole storage is saved, with storage offset 2
    bad = base.clone()
    bad[11] = float("nan")  # inside u's view [4:12], outside r's [2:10]
    torch.save({"w": bad[4:12]}, u)  # the same pickle but for the storage offset's BININT1 operand
    t = PickleTemplates()
    plan_file(r, templates=t)
    ff = pass_file(u, templates=t)
    assert t.hits == 1  # u's plan is r's: its value range is r's view, not its own
    (member, start, _n), = [c for c in ff.plan.crc if c[0].endswith("/data/0")]
    assert ff.plan.values == [(start + 8, 32, "float32")]

    byte_facts = facts.load(facts.table_of("u", "u.pt", ff), tmp_path)
    assert byte_facts.values_of(str(u), start + 8, 32, "float32")[0] == 0  # the statistic of r's view: finite
    assert byte_facts.values_of(str(u), start + 16, 32, "float32") is None  # none for u's own view
    row = {"file": "u.pt", "name": "w", "dtype": "float32", "data_offset": start + 16, "nbytes": 32}
    (_, (nonfinite, norm, short)), = list(value_stats(tmp_path, [row], 1 << 20, byte_facts))
    assert (nonfinite, short) == (1, False)  # read from u's own bytes: the NaN is found
    assert math.isnan(norm) or norm > 0
