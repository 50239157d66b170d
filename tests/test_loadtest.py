"""The isolated load test: limits, classification, and units it must never open."""

import json
import os

import pytest

from ckptaudit.stages.load import loadtest
from ckptaudit.stages.scan import scan_units
from ckptaudit import discovery as inventory

from .conftest import CASES


def test_good_file_loads_in_child():
    r = loadtest.load_in_child(str(CASES / "ok_full_torch" / "ckpt.pt"), "torch_zip", [], timeout_seconds=60,
                               memory_limit_bytes=8 << 30)
    assert r["status"] == "ok" and r["n_top_level_keys"] == 10
    assert r["peak_rss_bytes"] > 0 and r["load_seconds"] > 0


def test_the_child_counts_the_tensors_it_loaded(tmp_path):
    """``n_tensors`` is what the verdict reads when the static walk gave up (ckptaudit.cut_walk): a tied
    tensor counts once, a pickle of 35 levels of shared lists (2**35 paths) holds none."""
    import torch

    w = torch.zeros(4)
    torch.save({"model": {"a": w, "tied": w, "b": torch.ones(2)}, "opt": [torch.ones(1)], "step": 3}, tmp_path / "a.pt")
    nested = []
    for _ in range(35):
        nested = [nested, nested]
    torch.save(nested, tmp_path / "dag.pt")
    by_file = {n: loadtest.load_in_child(str(tmp_path / n), "torch_zip", [], timeout_seconds=60,
                                         memory_limit_bytes=8 << 30) for n in ("a.pt", "dag.pt")}
    assert (by_file["a.pt"]["n_tensors"], by_file["a.pt"]["n_top_level_keys"]) == (3, 3)
    assert (by_file["dag.pt"]["n_tensors"], by_file["dag.pt"]["n_top_level_keys"]) == (0, -1)
    from ckptaudit.stages.load.loaded_object import count_tensors

    assert count_tensors([[1] * 10] * 10, max_nodes=15) is None  # past its budget: unknown, never a partial count


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
    rows = loadtest.load_units(CASES / case, ud, {s["unit"]: s for s in scans}, {})
    assert [r.status for r in rows] == ["skipped"]
    assert rows[0].skipped_reason == "security: the static scan found imports that could run code"
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


def test_one_child_loads_many_small_files_and_a_failure_is_tried_alone(tmp_path):
    """1,000 small units paid a fork each (~75 ms a unit); a batch shares one child, but only its ok results
    count: the damaged file in the middle gets the same result as when loaded alone, the files after it load."""
    from ckptaudit.stages.load import child as loadchild

    import torch

    paths = []
    for i in range(5):
        p = tmp_path / f"ckpt_{i}.pt"
        torch.save({"w": torch.full((4,), float(i)), "step": i}, p)
        paths.append(str(p))
    cut = tmp_path / "ckpt_2.pt"
    cut.write_bytes(cut.read_bytes()[:200])
    alone_calls = []

    def alone(path, kind, benign, **kw):
        alone_calls.append(os.path.basename(path))
        return loadtest.load_in_child(path, kind, benign, **kw)

    rs = loadchild.load_many([(p, "torch_zip", []) for p in paths], timeout_seconds=60,
                             memory_limit_bytes=8 << 30, alone=alone)
    assert [r["status"] for r in rs] == ["ok", "ok", "failed", "ok", "ok"]
    assert [r["n_top_level_keys"] for r in rs if r["status"] == "ok"] == [2, 2, 2, 2]
    assert alone_calls == ["ckpt_2.pt"]
    single = loadtest.load_in_child(str(cut), "torch_zip", [], timeout_seconds=60, memory_limit_bytes=8 << 30)
    assert (rs[2]["error_type"], rs[2]["error_message"]) == (single["error_type"], single["error_message"])


def test_allowed_globals_of_one_file_do_not_leak_to_the_next_in_a_batch(tmp_path):
    """Each file's allowed globals are in force only while it loads: a file that names argparse.Namespace
    without having it allowed fails under weights_only even right after a file that had it allowed."""
    import argparse

    import torch

    from ckptaudit.stages.load import child as loadchild

    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"args": argparse.Namespace(lr=0.1)}, a)
    torch.save({"args": argparse.Namespace(lr=0.2)}, b)
    rs = loadchild.load_many([(str(a), "torch_zip", ["argparse.Namespace"]), (str(b), "torch_zip", []),
                              (str(a), "torch_zip", ["argparse.Namespace"])],
                             timeout_seconds=60, memory_limit_bytes=8 << 30, alone=loadtest.load_in_child)
    assert [r["status"] for r in rs] == ["ok", "failed", "ok"]
    assert loadtest.explain(rs[1]["error_message"]) == "the pickle names a global that weights_only does not allow"
