"""save(..., background=True): stage to CPU memory, return, commit on a thread; the next save waits."""

from __future__ import annotations

import hashlib
import logging
import os
import threading

import pytest
import torch

from ckptaudit import publish as P
from ckptaudit.publish import staging as S
from ckptaudit.publish import unit as U
from ckptaudit.safe_load import safe_load_checkpoint


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    w = torch.randn(300, 300, generator=g)
    return {"model": {"w": w, "row": w[1]}, "optimizer": {"state": {0: {"exp_avg": w * 0.5}},
                                                         "param_groups": [{"lr": 1e-3, "params": [0]}]},
            "iter_num": step}


def sha(p) -> str:
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def test_background_unit_is_byte_identical_to_a_blocking_one_despite_later_changes(tmp_path):
    """Training changes the state as soon as save returns; the unit must hold the state as
    it was at the call, byte for byte what a blocking save of that state writes."""
    s = state(5)
    P.save(s, tmp_path / "blocking", 5)
    pending = P.save(s, tmp_path / "bg", 5, background=True)
    s["model"]["w"].add_(1.0)  # in place, like an optimizer step
    s["optimizer"]["param_groups"][0]["lr"] = 0.5
    res = pending.wait()
    assert res.unit == "ckpt_000005.pt" and pending.done()
    assert pending.staged_bytes == 2 * 300 * 300 * 4  # w (with its view row) and exp_avg
    assert sha(tmp_path / "bg" / "ckpt_000005.pt") == sha(tmp_path / "blocking" / "ckpt_000005.pt")
    ck = safe_load_checkpoint(tmp_path / "bg", logger=logging.getLogger("quiet"))
    assert ck.unit == "ckpt_000005.pt" and torch.equal(ck.state["model"]["w"], state(5)["model"]["w"])
    assert ck.state["optimizer"]["param_groups"][0]["lr"] == 1e-3
    assert (tmp_path / "bg" / "latest").read_text() == "ckpt_000005.pt"


def test_second_save_waits_for_the_first(tmp_path, monkeypatch):
    """The blocking save after a background one must not start before the first committed."""
    gate = threading.Event()
    real = U._Publish._after_commit
    order = []

    def slow_after_commit(self, recs):
        if self.in_background:
            gate.wait(10)
        order.append(self.name)
        return real(self, recs)

    monkeypatch.setattr(U._Publish, "_after_commit", slow_after_commit)
    first = P.save(state(1), tmp_path, 1, background=True)
    threading.Timer(0.3, gate.set).start()
    P.save(state(2), tmp_path, 2)
    assert order == ["ckpt_000001.pt", "ckpt_000002.pt"] and first.done()
    assert (tmp_path / "latest").read_text() == "ckpt_000002.pt"


def test_background_error_is_raised_once_by_the_next_save(tmp_path, caplog):
    """A failed background commit must not be lost: logged at once, raised by the next save."""
    P.save(state(1), tmp_path, 1)
    with caplog.at_level(logging.ERROR, logger="ckptaudit.publish"):
        pending = P.save(state(1), tmp_path, 1, background=True, supersede=False)  # the unit exists: fails
        with pytest.raises(P.PublishError) as ei:
            P.save(state(2), tmp_path, 2)
    assert pending.done() and ei.value.unit == "ckpt_000001.pt"
    assert "a unit with this name already exists" in str(ei.value)
    assert any("background publish failed" in r.getMessage() and "wait() or the next save raises it" in
               r.getMessage() for r in caplog.records)
    assert P.save(state(2), tmp_path, 2).unit == "ckpt_000002.pt"  # raised once; the retry publishes
    assert P.wait_background() is None


def test_wait_raises_the_commit_error_and_the_next_save_does_not_repeat_it(tmp_path):
    P.save(state(1), tmp_path, 1)
    pending = P.save(state(1), tmp_path, 1, background=True, supersede=False)
    with pytest.raises(P.PublishError, match="already exists"):
        pending.wait()
    assert P.save(state(3), tmp_path, 3).unit == "ckpt_000003.pt"


def test_preemption_guard_exit_waits_for_the_background_commit(tmp_path):
    with P.PreemptionGuard():
        pending = P.save(state(7), tmp_path, 7, background=True)
    assert pending.done() and (tmp_path / "ckpt_000007.pt.manifest.json").exists()
    assert P.wait_background() is None


def test_background_refuses_folder_units_before_copying(tmp_path):
    with pytest.raises(ValueError, match="background=True publishes file units"):
        P.save(state(1), tmp_path, 1, folder=True, background=True)
    assert not os.listdir(tmp_path)


def test_staging_keeps_views_parameters_and_reuses_its_memory():
    cache = S.StagingCache()
    w = torch.randn(8, 8)
    p = torch.nn.Parameter(torch.randn(4))
    obj = {"w": w, "row": w[2], "p": p, "meta": {"names": ["a"]}}
    staged, n = S.stage(obj, cache)
    assert n == 8 * 8 * 4 + 4 * 4 and cache.nbytes == n
    assert staged["row"].untyped_storage().data_ptr() == staged["w"].untyped_storage().data_ptr()
    assert staged["w"].untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    assert type(staged["p"]) is torch.nn.Parameter and staged["p"].requires_grad
    assert staged["meta"] == obj["meta"] and staged["meta"] is not obj["meta"]
    before = w.clone()
    w.mul_(2)
    assert torch.equal(staged["w"], before) and torch.equal(staged["row"], before[2])
    again, _ = S.stage(obj, cache)
    assert again["w"].untyped_storage().data_ptr() == staged["w"].untyped_storage().data_ptr()  # reused
    assert torch.equal(again["w"], w)
    cache.release()
    assert cache.nbytes == 0


def test_release_staging_memory_returns_the_bytes_held(tmp_path):
    P.save(state(1), tmp_path, 1, background=True).wait()
    assert P.release_staging_memory() == 2 * 300 * 300 * 4
    assert P.release_staging_memory() == 0


def test_staged_copy_of_an_accelerator_storage_is_saved_with_its_source_location():
    """Without the tag, a GPU tensor saved from its CPU copy would load on the CPU; checked
    here by tagging a CPU copy by hand, as stage() does for a cuda:0 source (no GPU here)."""
    import io

    cache = S.StagingCache()
    staged, _ = S.stage({"w": torch.arange(4.0)}, cache)
    ptr = staged["w"].untyped_storage().data_ptr()
    S._LOCATIONS[ptr] = "cuda:0"
    try:
        buf = io.BytesIO()
        torch.save(staged, buf)
    finally:
        cache.release()
    assert ptr not in S._LOCATIONS
    seen = []
    buf.seek(0)
    out = torch.load(buf, map_location=lambda s, loc: (seen.append(loc), s)[1], weights_only=True)
    assert seen == ["cuda:0"] and torch.equal(out["w"], torch.arange(4.0))
    buf2 = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buf2)  # an untagged storage keeps torch's own tag
    buf2.seek(0)
    seen.clear()
    torch.load(buf2, map_location=lambda s, loc: (seen.append(loc), s)[1], weights_only=True)
    assert seen == ["cpu"]


def test_abandon_mode_never_abandons_a_background_commit(tmp_path, monkeypatch):
    """A preemption signal during a background commit must only be recorded: raising
    Preempted in the training loop (or cutting the commit short) would lose the save."""
    import signal

    gate = threading.Event()
    real = U._Publish._after_commit

    def slow_after_commit(self, recs):
        gate.wait(10)
        return real(self, recs)

    monkeypatch.setattr(U._Publish, "_after_commit", slow_after_commit)
    with P.PreemptionGuard(mode="abandon") as guard:
        pending = P.save(state(4), tmp_path, 4, background=True)
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, on the main thread, mid-commit
        assert guard.requested == signal.SIGTERM and not pending.done()
        gate.set()
    assert pending.done() and pending.wait().unit == "ckpt_000004.pt"
    assert (tmp_path / "latest").read_text() == "ckpt_000004.pt"
