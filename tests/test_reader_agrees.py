"""safe_load_checkpoint returns exactly the unit the audit names as its rollback point, or raises on retrain.

The reader used its own, shorter list of checks and returned units the audit rejects (an
empty ``checkpoint-400/``, one with only ``config.json``, NaN weights); these tests hold
reader and audit to one judgement over every case folder and framework fixture.
"""

import json
import logging

import pytest

from ckptaudit import safe_load_checkpoint
from ckptaudit.pipeline import audit_in_process
from ckptaudit.stages.load import whole_modules
from ckptaudit.safe_load import NoUsableCheckpointError, loadable

from .conftest import tree_digest
from .test_cases import CASE_DIRS, case_config


def _assert_agrees(run, cfg, tmp_path):
    """Audit ``run`` with ``cfg``, then read it with the same config; they must agree."""
    v = audit_in_process(run, cfg, out_dir=tmp_path / "audit")
    inv = {u["unit"]: u for u in json.loads((tmp_path / "audit" / "work" / "inventory.json").read_text())["units"]}
    before = tree_digest(run)
    rb = v["rollback"]
    if rb is None:
        with pytest.raises(NoUsableCheckpointError):
            safe_load_checkpoint(run, audit_config=cfg, load=False)
        return v
    load = loadable(inv[rb["unit"]]) and not whole_modules.in_verdict(v, rb["unit"])  # those: load=False
    ckpt = safe_load_checkpoint(run, audit_config=cfg, load=load)
    assert ckpt.unit == rb["unit"], f"audit: {v['reasons'][0]}; reader skipped {ckpt.skipped}"
    ud = inv[rb["unit"]]
    assert ckpt.path == run / (ud["files"][0] if ud["kind"] == "file" else ud["unit"])
    assert ckpt.usable_for == next(u["usable_for"] for u in v["units"] if u["unit"] == rb["unit"])
    assert (ckpt.state is not None) == load
    order = [u["unit"] for u in v["units"]]  # save order
    assert ckpt.examined and ckpt.examined[-1] == rb["unit"], ckpt.examined  # bytes read: the rollback point …
    assert all(order.index(u) >= order.index(rb["unit"]) for u in ckpt.examined)  # … and newer units it rejected
    assert tree_digest(run) == before, "the reader changed the run folder"
    return v


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_reader_returns_the_audits_rollback_unit(case, tmp_path):
    exp = json.loads((case / "expected.json").read_text())
    _assert_agrees(case, case_config(exp), tmp_path)


from .test_frameworks import NAMES as FRAMEWORK_FIXTURES  # noqa: E402
from .test_frameworks import fixture_cache  # noqa: E402,F401 - the session fixture that generates them


@pytest.mark.parametrize("name", FRAMEWORK_FIXTURES)
def test_reader_agrees_on_framework_fixtures(name, fixture_cache, tmp_path):  # noqa: F811
    d = fixture_cache / name
    if (d / "skipped.json").exists():
        pytest.skip(json.loads((d / "skipped.json").read_text())["reason"])
    truth = json.loads((d / "truth.json").read_text())
    _assert_agrees(d / "run", truth["audit_config"], tmp_path)


# --- regression tests, one per reader bug of issue 13 ---------------------------------------

def _good_unit(path, step, *, nan=False):
    import torch

    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(step))
    if nan:
        w[0, 0] = float("nan")
    torch.save({"model": {"lin.weight": w}, "iter_num": step}, path)
    return w


def test_empty_folder_ahead_of_a_good_unit_is_never_returned(tmp_path, caplog):
    """An empty ``checkpoint-400/`` (killed before any file was written) was returned as the newest unit."""
    import torch

    w = _good_unit(tmp_path / "ckpt_000300.pt", 300)
    (tmp_path / "checkpoint-400").mkdir()
    with caplog.at_level(logging.WARNING, logger="ckptaudit"):
        ckpt = safe_load_checkpoint(tmp_path)
    assert (ckpt.unit, ckpt.step) == ("ckpt_000300.pt", 300)
    assert torch.equal(ckpt["model"]["lin.weight"], w)
    assert ckpt.skipped["checkpoint-400"].startswith("missing_model_weights: ")
    assert "skipping checkpoint-400: missing_model_weights" in caplog.text


def test_audit_also_refuses_the_empty_folder(tmp_path):
    _good_unit(tmp_path / "ckpt_000300.pt", 300)
    (tmp_path / "checkpoint-400").mkdir()
    v = audit_in_process(tmp_path, out_dir=tmp_path.parent / "out")
    assert v["rollback"]["unit"] == "ckpt_000300.pt"


def test_folder_with_only_config_json_is_never_returned(tmp_path):
    """A ``checkpoint-400/`` holding only ``config.json`` was returned as a dict with one JSON file."""
    _good_unit(tmp_path / "ckpt_000300.pt", 300)
    (tmp_path / "checkpoint-400").mkdir()
    (tmp_path / "checkpoint-400" / "config.json").write_text('{"n_layer": 2}')
    ckpt = safe_load_checkpoint(tmp_path)
    assert ckpt.unit == "ckpt_000300.pt"
    assert ckpt.skipped["checkpoint-400"].startswith("missing_model_weights: ")
    _assert_agrees(tmp_path, {}, tmp_path.parent / "agree")


def test_unreadable_state_is_never_returned(tmp_path):
    """A unit whose state the audit cannot read (state row ``{}``: a pickle of no tensors) was returned."""
    import torch

    _good_unit(tmp_path / "ckpt_000300.pt", 300)
    torch.save({}, tmp_path / "ckpt_000400.pt")
    ckpt = safe_load_checkpoint(tmp_path)
    assert ckpt.unit == "ckpt_000300.pt"
    assert "ckpt_000400.pt" in ckpt.skipped


def test_nan_weights_are_never_returned(tmp_path):
    """A unit with NaN weights, which the audit marks unusable, was returned because it loads."""
    _good_unit(tmp_path / "ckpt_000300.pt", 300)
    _good_unit(tmp_path / "ckpt_000400.pt", 400, nan=True)
    ckpt = safe_load_checkpoint(tmp_path)
    assert ckpt.unit == "ckpt_000300.pt"
    assert ckpt.skipped["ckpt_000400.pt"].startswith("nan_in_weights: ")
    _assert_agrees(tmp_path, {}, tmp_path.parent / "agree")


def test_every_unit_without_weights_raises(tmp_path):
    (tmp_path / "checkpoint-300").mkdir()
    (tmp_path / "checkpoint-400").mkdir()
    (tmp_path / "checkpoint-400" / "config.json").write_text("{}")
    with pytest.raises(NoUsableCheckpointError) as ei:
        safe_load_checkpoint(tmp_path)
    assert list(ei.value.reasons) == ["checkpoint-400", "checkpoint-300"]


def test_reader_config_is_checked(tmp_path):
    _good_unit(tmp_path / "ckpt_000300.pt", 300)
    with pytest.raises(ValueError, match=r"^invalid config: load\.timeout_seconds: nan is not finite"):
        safe_load_checkpoint(tmp_path, audit_config={"load": {"timeout_seconds": float("nan")}})
