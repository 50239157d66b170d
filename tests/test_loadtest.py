"""The isolated load test: limits, classification, and units it must never open."""

import json
import os

import pytest

from ckptaudit import loadtest
from ckptaudit.stages import scan_units
from ckptaudit import inventory

from .conftest import CASES


def test_good_file_loads_in_child():
    r = loadtest.load_in_child(str(CASES / "ok_full_torch" / "ckpt.pt"), "torch_zip", [], timeout_seconds=60,
                               memory_limit_bytes=8 << 30)
    assert r["status"] == "ok" and r["n_top_level_keys"] == 10
    assert r["peak_rss_bytes"] > 0 and r["load_seconds"] > 0


def test_truncated_file_is_explained():
    r = loadtest.load_in_child(str(CASES / "trunc_zip_at_50pct" / "ckpt.pt"), "torch_zip", [],
                               timeout_seconds=60, memory_limit_bytes=8 << 30)
    assert r["status"] == "failed"
    assert loadtest.explain(r["error_message"]) == "the zip central directory is missing (the file is truncated)"


def test_timeout_kills_the_child(tmp_path):
    fifo = tmp_path / "never.pt"
    os.mkfifo(fifo)  # opening it for reading blocks forever: a stand-in for a hung network filesystem
    r = loadtest.load_in_child(str(fifo), "torch_legacy", [], timeout_seconds=1.0, memory_limit_bytes=8 << 30)
    assert r["status"] == "timeout" and r["error_message"] == "killed after 1.0 s"
    assert 1.0 <= r["load_seconds"] < 10


def _vm_size_bytes() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def test_memory_limit_is_enforced(tmp_path):
    import torch

    p = tmp_path / "big.pt"
    torch.save({"w": torch.ones(16 << 20)}, p)  # 64 MiB of float32
    # the child may grow 16 MiB past what the parent already maps: far less than the tensor needs
    limit = _vm_size_bytes() + (16 << 20)
    r = loadtest.load_in_child(str(p), "torch_legacy", [], timeout_seconds=60, memory_limit_bytes=limit)
    assert r["status"] == "memory", r
    ok = loadtest.load_in_child(str(p), "torch_legacy", [], timeout_seconds=60, memory_limit_bytes=limit + (1 << 30))
    assert ok["status"] == "ok"


@pytest.mark.parametrize("case", ["security_malicious_reduce_zip", "security_malicious_dcp_metadata"])
def test_load_never_starts_for_dangerous_imports(case, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("the load test was started for a unit with a dangerous import")

    monkeypatch.setattr(loadtest, "load_in_child", boom)
    units, _, _ = inventory.discover(CASES / case)
    ud = [u.to_dict() for u in units]
    scans, _, _ = scan_units(CASES / case, ud, {})
    rows = loadtest.load_units(CASES / case, ud, {s["unit"]: s for s in scans}, {}, {})
    assert [r["status"] for r in rows] == ["skipped"]
    assert rows[0]["skipped_reason"] == "security: the static scan found imports that could run code"
    assert json.loads(scans[0]["findings_json"])[0]["kind"] == "malicious_pickle_code_exec"


def test_a_mapped_file_larger_than_the_limit_is_load_tested(tmp_path):
    """A 9 GiB torch.save checkpoint under the default 8 GiB limit was `load_memory_limit` (usable for nothing:
    retrain) because RLIMIT_AS counted the file's own mmap; the limit now applies beyond the mapping."""
    import torch

    p = tmp_path / "big.pt"
    torch.save({"w": torch.ones(64 << 20)}, p)  # 256 MiB of float32, a torch zip (mapped by the child)
    # the child may allocate 64 MiB past what the parent already maps: far less than the file, enough for the load
    limit = _vm_size_bytes() + (64 << 20)
    r = loadtest.load_in_child(str(p), "torch_zip", [], timeout_seconds=60, memory_limit_bytes=limit)
    assert r["status"] == "ok", r
    # read whole (no mapping) the same file needs its 256 MiB: over the same limit
    r = loadtest.load_in_child(str(p), "torch_legacy", [], timeout_seconds=60, memory_limit_bytes=limit)
    assert r["status"] == "memory", r
