"""Fuzz acceptance (issue 13), the fast part of the normal test run.

Seeds are the small real files in ``tests/fuzz_seeds`` (written by torch.save zip and
legacy, safetensors.torch.save_file, torch.distributed.checkpoint.save and transformers;
rebuild them with ``benchmarks/bench_fuzz.py --write-test-seeds tests/fuzz_seeds``).
Mutations come from hypothesis (structured byte edits that shrink) and from the
format-aware mutators of ``benchmarks/bench_fuzz.py`` (zip fields, re-zipped pickles,
safetensors headers, JSON), driven by a hypothesis-controlled ``random.Random``.

What must hold for any bytes: the file-layer checkers, the pickle walker and the
security scan never raise; a layout adapter's scan of a unit never raises (no
``audit_error``); the whole audit returns within its budget with every unit in the
verdict, and a mutated file that keeps its seed's ``.sha256`` sidecar is never usable
(a damaged ``trainer_state.json`` leaves at most a warm start: roles.py).  The long
run is ``benchmarks/bench_fuzz.py --n 10000``.  The plain tests at the end are the
minimal reproductions of the bugs the fuzzer found.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import struct
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptaudit import findings as F
from ckptaudit import security
from ckptaudit.stages import cli as stages
from ckptaudit.stages import inventory
from ckptaudit.formats import legacy, safetensors_check, sniff, torchzip
from ckptaudit.pickle_walk import WalkResult, walk, walk_streams

REPO = Path(__file__).resolve().parent.parent
SEEDS_DIR = REPO / "tests" / "fuzz_seeds"


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_fuzz", REPO / "benchmarks" / "bench_fuzz.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_fuzz", mod)
    spec.loader.exec_module(mod)
    return mod


B = _load_bench()
SEEDS = B.load_seeds(SEEDS_DIR)
FORMATS = [f for f in B.FORMATS if SEEDS.get(f)]
FAST = settings(derandomize=True, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@pytest.fixture(autouse=True)
def _raise_audit_errors(monkeypatch):
    """An exception inside a stage is raised, not turned into an audit_error finding, so a failure shows
    its traceback (the assertions on audit_error below hold either way)."""
    monkeypatch.setenv("CKPTAUDIT_RAISE_AUDIT_ERRORS", "1")


# ------------------------------------------------------------------ strategies

_OP = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 20), st.integers(0, 7)),
    st.tuples(st.just("set"), st.integers(0, 1 << 20), st.sampled_from((1, 2, 4, 8)), st.sampled_from(B.INTERESTING)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(st.just("zero"), st.integers(0, 1 << 20), st.sampled_from((1, 8, 64, 4096))),
    st.tuples(st.just("dup"), st.integers(0, 1 << 20), st.sampled_from((1, 16, 512)), st.integers(0, 1 << 20)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 20), st.sampled_from((1, 4, 30, 512))),
    st.tuples(st.just("insert"), st.integers(0, 1 << 20), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("splice"), st.integers(0, 1 << 20), st.integers(0, 1 << 20)),
    st.tuples(st.just("aware"), st.randoms(use_true_random=False)),
)


def apply_ops(fmt: str, data: bytes, ops) -> bytes:
    """Apply hypothesis-drawn edits; positions are taken modulo the current length."""
    others = [s["target_bytes"] for f in SEEDS for s in SEEDS[f]]
    for op in ops:
        n = len(data)
        kind = op[0]
        if kind == "flip" and n:
            i = op[1] % n
            data = data[:i] + bytes([data[i] ^ (1 << op[2])]) + data[i + 1:]
        elif kind == "set" and n:
            i = op[1] % n
            data = data[:i] + B._le(op[3], op[2]) + data[i + op[2]:]
        elif kind == "truncate":
            data = data[: op[1] % (n + 1)]
        elif kind == "zero" and n:
            i = op[1] % n
            data = data[:i] + bytes(min(op[2], n - i)) + data[i + op[2]:]
        elif kind == "dup" and n:
            a = op[1] % n
            c = op[3] % (n + 1)
            data = data[:c] + data[a:a + op[2]] + data[c:]
        elif kind == "delete" and n:
            a = op[1] % n
            data = data[:a] + data[a + op[2]:]
        elif kind == "insert":
            c = op[1] % (n + 1)
            data = data[:c] + op[2] + data[c:]
        elif kind == "splice":
            other = others[op[2] % len(others)]
            data = data[: op[1] % (n + 1)] + other[op[2] % (len(other) + 1):]
        elif kind == "aware":
            fn = op[1].choice(B.AWARE[fmt] + B.GENERIC)
            data, _ = fn(data, op[1], others)
    return data


def mutated(fmt: str):
    """(seed entry, mutated target bytes) for format ``fmt``."""
    return st.tuples(st.sampled_from(SEEDS[fmt]), st.lists(_OP, min_size=1, max_size=3)).map(
        lambda t: (t[0], apply_ops(fmt, t[0]["target_bytes"], t[1])))


def write_unit(run_dir: Path, fmt: str, seed: dict, data: bytes, i: int = 1, sidecar: bool = False) -> str:
    """Write ``data`` as unit ``i`` of ``run_dir`` the way the benchmark does; return the verdict unit name."""
    orig = seed["target_bytes"]
    name = B.UNIT_NAMES[fmt].format(i=i)
    if "{i:06d}" in B.UNIT_NAMES[fmt]:
        p = run_dir / name
        p.write_bytes(data)
        if sidecar:
            B._sidecar(p, orig)
        return name
    if fmt == "hf_index" and i % 2:
        name = f"shards-{i}"
    folder = run_dir / name
    folder.mkdir()
    for rel in seed["files"]:
        blob = data if rel == seed["target"] else (Path(seed["root"]) / rel).read_bytes()
        (folder / rel).write_bytes(blob)
        if sidecar:
            B._sidecar(folder / rel, orig if rel == seed["target"] else blob)
    return f"{name}/{seed['target']}" if name.startswith("shards-") else name


def _kinds(fl) -> list:
    out = []
    for f in fl:
        k = f.kind if isinstance(f, F.Finding) else f["kind"]
        assert k in F.CATALOGUE, k
        out.append(k)
    return out


# ------------------------------------------------------------------ file layer: never raises

def check_all_file_layer(path: Path) -> None:
    """Every file-layer checker on ``path``, whatever its format: none may raise."""
    s = sniff.sniff(path)
    assert s.kind in ("empty", "all_zero", "lfs_pointer", "html", "text", "json", "torch_zip", "zip",
                      "torch_legacy", "pickle", "safetensors", "npy", "npz", "unknown")
    _kinds(sniff.generic_findings(s))
    rep = torchzip.check_zip(path)
    _kinds(rep.findings)
    assert rep.data_pkl is None or isinstance(rep.data_pkl, bytes)
    if rep.data_pkl is not None:
        res = walk(rep.data_pkl)
        storages = {k: (r.nbytes, r.dtype, r.numel) for k, r in res.storages.items() if r.numel is not None}
        _kinds(torchzip.check_storages(rep, storages, str(path)))
    res, fl = legacy.check_legacy(path)
    assert res is None or isinstance(res, WalkResult)
    _kinds(fl)
    header, fl = safetensors_check.check_safetensors(path)
    assert header is None or isinstance(header, dict)
    _kinds(fl)
    if header is not None:
        for name, e in safetensors_check.valid_entries(header):
            assert len(e["data_offsets"]) == 2 and all(type(d) is int and d >= 0 for d in e["shape"])


@pytest.mark.parametrize("fmt", FORMATS)
@settings(FAST, max_examples=30)
@given(data=st.data())
def test_file_layer_checkers_never_raise(fmt, data):
    seed, blob = data.draw(mutated(fmt))
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / ("model.safetensors" if fmt in ("safetensors",) else Path(seed["target"]).name)
        p.write_bytes(blob)
        check_all_file_layer(p)


@settings(FAST, max_examples=150)
@given(blob=st.binary(max_size=2048))
def test_file_layer_checkers_never_raise_on_random_bytes(blob):
    with tempfile.TemporaryDirectory() as d:
        for name in ("ckpt.pt", "model.safetensors"):
            p = Path(d) / name
            p.write_bytes(blob)
            check_all_file_layer(p)


# ------------------------------------------------------------------ pickles: never raise

def walk_everything(blob: bytes) -> None:
    r = walk(blob)
    assert isinstance(r, WalkResult) and (r.error is None or isinstance(r.error, str))
    rs = walk_streams(blob, r)
    assert rs and rs[0] is r
    every = security.streams(blob, r)
    verdicts, fl = security.scan(every, path="x.pt", member="data.pkl")
    _kinds(fl)
    verdicts, fl = security.scan(security.streams(blob), path="step-1/.metadata", member=".metadata")
    _kinds(fl)
    walk(memoryview(blob), persistent="raw")


def _pickles() -> list:
    out = []
    for s in SEEDS["torch_zip"]:
        out += [b for n, b in B.read_zip_members(s["target_bytes"]) if n.endswith("data.pkl")]
    out += [s["target_bytes"] for s in SEEDS["dcp_metadata"]]
    for s in SEEDS["torch_legacy"]:
        spans, _ = B.legacy_parts(s["target_bytes"])
        out += [s["target_bytes"][a:b] for a, b in spans]
    return out


PICKLES = _pickles()


@settings(FAST, max_examples=120)
@given(blob=st.binary(max_size=4096))
def test_pickle_walk_and_security_never_raise_on_random_bytes(blob):
    walk_everything(blob)
    walk_everything(b"\x80\x02" + blob)


@settings(FAST, max_examples=120)
@given(k=st.integers(0, len(PICKLES) - 1), rnd=st.randoms(use_true_random=False), n=st.integers(1, 4))
def test_pickle_walk_and_security_never_raise_on_mutated_pickles(k, rnd, n):
    blob = PICKLES[k]
    for _ in range(n):
        blob, _ = B.mutate_pickle(blob, rnd)
    walk_everything(blob)


# ------------------------------------------------------------------ layout adapters: never raise

def scan_run(run_dir: Path) -> dict:
    """inventory + scan_units of every unit (exceptions propagate: CKPTAUDIT_RAISE_AUDIT_ERRORS=1)."""
    inv = inventory.run_inventory(str(run_dir))
    scans, tensors, imports = stages.scan_units(run_dir, inv["units"], {})
    by = {}
    for row in scans:
        fl = json.loads(row["findings_json"])
        assert "audit_error" not in _kinds(fl), fl
        by[row["unit"]] = row
    assert set(by) == {u["unit"] for u in inv["units"]}
    return by


@pytest.mark.parametrize("fmt", FORMATS)
@settings(FAST, max_examples=20)
@given(data=st.data())
def test_layout_adapter_scan_never_raises(fmt, data):
    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d) / "run"
        run_dir.mkdir()
        names = []
        for i in (1, 2):
            seed, blob = data.draw(mutated(fmt))
            names.append(write_unit(run_dir, fmt, seed, blob, i=i))
        by = scan_run(run_dir)
        assert set(names) <= set(by)


# ------------------------------------------------------------------ the whole audit

#: Wall-clock budget of one audit of a few mutated units (seconds): the load test forks per file.
AUDIT_BUDGET_S = 30.0


@pytest.mark.parametrize("fmt", FORMATS)
@settings(FAST, max_examples=2)
@given(data=st.data())
def test_audit_of_mutated_units(fmt, data):
    """No exception, no audit_error, within budget, every unit judged; a changed file that kept its
    seed's sidecar is never usable (warm start at most for trainer_state.json)."""
    from ckptaudit.pipeline import audit_in_process

    with tempfile.TemporaryDirectory() as d:
        run_dir = Path(d) / "run"
        run_dir.mkdir()
        made = []
        for i in (1, 2, 3):
            seed, blob = data.draw(mutated(fmt))
            sidecar = data.draw(st.booleans())
            made.append((write_unit(run_dir, fmt, seed, blob, i=i, sidecar=sidecar), seed,
                         sidecar and blob != seed["target_bytes"]))
        t0 = time.perf_counter()
        v = audit_in_process(run_dir, cfg=B.FUZZ_CFG, out_dir=Path(d) / "out")
        assert time.perf_counter() - t0 < AUDIT_BUDGET_S
        units = {u["unit"]: u for u in v["units"]}
        for name, seed, protected in made:
            u = units[name]
            kinds = _kinds(u["findings"])
            assert "audit_error" not in kinds, u["findings"]
            if protected:
                assert "checksum_mismatch" in kinds
                allowed = ("none", "warm-start") if seed["target"] == "trainer_state.json" else ("none",)
                assert u["usable_for"] in allowed, (name, u["usable_for"], kinds)


def test_benchmark_mutations_are_deterministic(tmp_path):
    """bench_fuzz rebuilds file i byte for byte from (seed, i): problem files can be reproduced."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for i in range(14):
        ia = B.make_unit(a, i, SEEDS, 7)
        ib = B.make_unit(b, i, SEEDS, 7)
        assert ia == ib
    for p in a.rglob("*"):
        if p.is_file():
            assert p.read_bytes() == (b / p.relative_to(a)).read_bytes()


def test_rezipped_seed_is_a_torch_zip_the_checker_accepts(tmp_path):
    """The re-zipper of the data.pkl mutations writes what torch writes: an unmutated re-zip is clean."""
    for s in SEEDS["torch_zip"]:
        p = tmp_path / "ckpt.pt"
        p.write_bytes(B.write_torch_zip(B.read_zip_members(s["target_bytes"])))
        rep = torchzip.check_zip(p)
        assert rep.findings == [] and rep.data_pkl is not None


# ------------------------------------------------------------------ regressions (bugs the fuzzer found)

def _safetensors(header: bytes, body: bytes = b"\0" * 8) -> bytes:
    header += b" " * ((-len(header)) % 8)
    return struct.pack("<Q", len(header)) + header + body


def _audit_one(tmp_path: Path, name: str, blob: bytes):
    from ckptaudit.pipeline import audit_in_process

    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    p = run_dir / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(blob)
    return audit_in_process(run_dir, cfg=B.FUZZ_CFG, out_dir=tmp_path / "out")


@pytest.mark.parametrize("entry", [
    b'{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}',  # TypeError: str - str
    b'{"dtype":"F32","shape":[2],"data_offsets":null}',  # cannot unpack None
    b'{"dtype":"F32","shape":[2],"data_offsets":[8]}',  # not enough values to unpack
    b'{"dtype":"F32","shape":[2],"data_offsets":[0,8,0]}',  # too many values to unpack
    b'{"dtype":"F32","shape":[2],"data_offsets":[[0],8]}',  # list - int
    b'{"dtype":"F32","shape":null,"data_offsets":[0,8]}',  # None is not iterable
    b'{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}',  # '2' into the int64 shape column: the run raised
    b'{"dtype":["F32"],"shape":[2],"data_offsets":[0,8]}',  # unhashable dtype
])
def test_regression_safetensors_malformed_entry_is_invalid_header_json(tmp_path, entry):
    """A header entry of the wrong types is invalid_header_json, not a crash of the scan (or of the
    tensors table, which made audit_in_process raise); the entries after a duplicate key are checked too."""
    blob = _safetensors(b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"w":' + entry + b'}')
    p = tmp_path / "model.safetensors"
    p.write_bytes(blob)
    header, fl = safetensors_check.check_safetensors(p)
    assert "invalid_header_json" in _kinds(fl)
    assert [n for n, _ in safetensors_check.valid_entries(header)] == ["a"]
    v = _audit_one(tmp_path, "model_000001.safetensors", blob)
    (u,) = v["units"]
    assert "invalid_header_json" in _kinds(u["findings"]) and u["usable_for"] == "none"
    dup = _safetensors(b'{"w":' + entry + b',"w":' + entry + b'}')
    (tmp_path / "dup.safetensors").write_bytes(dup)
    header, fl = safetensors_check.check_safetensors(tmp_path / "dup.safetensors")
    assert "invalid_header_json" in _kinds(fl) and safetensors_check.valid_entries(header) == []


def test_regression_safetensors_header_integer_too_long_to_parse(tmp_path):
    """An integer of more than 4300 digits makes json raise a plain ValueError (int_max_str_digits)."""
    p = tmp_path / "model.safetensors"
    p.write_bytes(_safetensors(b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,' + b"9" * 5000 + b']}}'))
    header, fl = safetensors_check.check_safetensors(p)
    assert header is None and _kinds(fl) == ["invalid_header_json"]
    assert "4300" in fl[0].detail["why"]


def _index(weight_map: dict, metadata=None) -> bytes:
    return json.dumps({"metadata": {"total_size": 8} if metadata is None else metadata,
                       "weight_map": weight_map}).encode()


BAD_SHARD_NAMES = [
    [1, 1, 1],  # str([..]) as a path: OSError ENAMETOOLONG in inventory (the run raised) and scan
    "1" * 300,  # a file name longer than NAME_MAX
    ".",  # the folder itself: IsADirectoryError
    "..",
    "/dev/zero",  # outside the run, and it never ends
    "../../../etc/hostname",
    "a\u0000b",  # ValueError: embedded null byte
    "",
    None,
]


@pytest.mark.parametrize("bad", BAD_SHARD_NAMES, ids=repr)
@pytest.mark.parametrize("folder", ["checkpoint-1", "shards-1"])
def test_regression_index_shard_name_outside_the_folder_is_index_invalid(tmp_path, bad, folder):
    """weight_map values are joined to the index's folder: a value that is no file name there is
    index_invalid (and never opened), both for a Trainer folder and for an index that is its own unit; one
    that resolves outside the run is path_outside_run, naming where it points (ckptaudit.confine)."""
    seed = SEEDS["hf_index"][0]
    wm = json.loads(seed["target_bytes"])["weight_map"]
    first = sorted(wm)[0]
    wm[first] = bad
    run_dir = tmp_path / "run"
    (run_dir / folder).mkdir(parents=True)
    for rel in seed["files"]:
        (run_dir / folder / rel).write_bytes((Path(seed["root"]) / rel).read_bytes())
    (run_dir / folder / "model.safetensors.index.json").write_bytes(_index(wm))
    name = folder if folder.startswith("checkpoint-") else f"{folder}/model.safetensors.index.json"
    inv = inventory.run_inventory(str(run_dir))
    assert all(".." not in f and not f.startswith("/") for u in inv["units"] for f in u["files"])
    fl = json.loads(scan_run(run_dir)[name]["findings_json"])
    if bad in ("/dev/zero", "../../../etc/hostname"):
        f = next(f for f in fl if f["kind"] == "path_outside_run")
        assert repr(bad) in f["message"] and f["severity"] == "error"
    else:
        f = next(f for f in fl if f["kind"] == "index_invalid")
        assert first[:40] in f["message"]
    if bad == "/dev/zero":  # the whole audit: the hash stage streamed /dev/zero for ever (a hang)
        from ckptaudit.pipeline import audit_in_process

        t0 = time.perf_counter()
        v = audit_in_process(run_dir, cfg=B.FUZZ_CFG, out_dir=tmp_path / "out")
        assert time.perf_counter() - t0 < AUDIT_BUDGET_S
        assert {x["unit"]: x for x in v["units"]}[name]["usable_for"] == "none"


def test_regression_index_shard_name_that_is_a_folder(tmp_path):
    seed = SEEDS["hf_index"][0]
    wm = json.loads(seed["target_bytes"])["weight_map"]
    wm[sorted(wm)[0]] = "sub"
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-1" / "sub").mkdir(parents=True)
    for rel in seed["files"]:
        (run_dir / "checkpoint-1" / rel).write_bytes((Path(seed["root"]) / rel).read_bytes())
    (run_dir / "checkpoint-1" / "model.safetensors.index.json").write_bytes(_index(wm))
    by = scan_run(run_dir)
    assert "not_a_regular_file" in _kinds(json.loads(by["checkpoint-1"]["findings_json"]))


@pytest.mark.parametrize("metadata", [2 ** 31, "x", [1], None])
def test_regression_index_metadata_not_an_object(tmp_path, metadata):
    seed = SEEDS["hf_index"][0]
    doc = json.loads(seed["target_bytes"])
    doc["metadata"] = metadata
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-1").mkdir(parents=True)
    for rel in seed["files"]:
        (run_dir / "checkpoint-1" / rel).write_bytes((Path(seed["root"]) / rel).read_bytes())
    (run_dir / "checkpoint-1" / "model.safetensors.index.json").write_text(json.dumps(doc))
    by = scan_run(run_dir)
    assert json.loads(by["checkpoint-1"]["facts_json"])["index_total_size"] is None


def test_regression_lone_surrogates_in_names_do_not_stop_the_audit(tmp_path):
    """A lone surrogate (a JSON "\\ud800" escape, or a pickle string decoded with surrogatepass) cannot be
    written as UTF-8: the tables (pyarrow) and report.html made audit_in_process raise.  Names keep U+FFFD."""
    import torch

    from ckptaudit.pipeline import audit_in_process

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save({"model": {"\ud800w": torch.ones(2)}, "step": 1}, run_dir / "ckpt_000001.pt")
    (run_dir / "model_000002.safetensors").write_bytes(
        _safetensors(b'{"\\ud800a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0\0\x80?"))
    seed = SEEDS["hf_index"][0]
    (run_dir / "checkpoint-3").mkdir()
    for rel in seed["files"]:
        (run_dir / "checkpoint-3" / rel).write_bytes((Path(seed["root"]) / rel).read_bytes())
    idx = seed["target_bytes"].decode()
    first = sorted(json.loads(idx)["weight_map"])[0]
    (run_dir / "checkpoint-3" / seed["target"]).write_text(idx.replace(f'"{first}"', '"\\ud800x"', 1))
    v = audit_in_process(run_dir, cfg=B.FUZZ_CFG, out_dir=tmp_path / "out")
    units = {u["unit"]: u for u in v["units"]}
    assert set(units) == {"ckpt_000001.pt", "model_000002.safetensors", "checkpoint-3"}
    for u in units.values():
        assert "audit_error" not in _kinds(u["findings"])
    assert "index_tensor_not_in_shard" in _kinds(units["checkpoint-3"]["findings"])
    msg = next(f["message"] for f in units["checkpoint-3"]["findings"] if f["kind"] == "index_tensor_not_in_shard")
    assert "\ufffdx" in msg
    assert (tmp_path / "out" / "report.html").read_text(encoding="utf-8")


def test_regression_pickle_walk_strings_have_no_lone_surrogates():
    r = walk(b"\x80\x02}X\x04\x00\x00\x00\xed\xa0\x80wK\x01s.")
    assert r.error is None and list(r.obj) == ["\ufffdw"]


def test_regression_dcp_two_storage_items_naming_one_bytes_item(tmp_path):
    """A .metadata whose storage_data names one non-tensor item twice (a string renamed to 'step'): the
    second entry met the value read for the first (an int) and the scan raised TypeError."""
    seed = SEEDS["dcp_metadata"][0]
    meta = seed["target_bytes"]
    ops = [(s, e) for s, e, name in B.pickle_ops(meta) if name in B._STR_OPS]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    n = 0
    for k, (s, e) in enumerate(ops):
        if not meta[s + 2:e].startswith((b"optim.", b"model.")):
            continue
        folder = run_dir / f"step-{k}"
        folder.mkdir()
        (folder / ".metadata").write_bytes(meta[:s] + B._enc_str("SHORT_BINUNICODE", "step") + meta[e:])
        (folder / "__0_0.distcp").write_bytes((Path(seed["root"]) / "__0_0.distcp").read_bytes())
        n += 1
    assert n >= 10
    by = scan_run(run_dir)
    assert len(by) == n


@pytest.mark.parametrize("text", ["1e999999", "NaN", "-Infinity", "-1", '"40"', "null", "2.5"])
def test_regression_trainer_state_global_step_not_an_integer(tmp_path, text):
    """global_step 1e999999 parses as inf: int(inf) raised OverflowError in the structure, configdiff and
    state stages.  A global_step that is not a non-negative integer is state_file_unreadable (the Trainer
    derives the epochs and batches to skip from it): a warm start at most, never a resume."""
    from ckptaudit.pipeline import audit_in_process

    seed = SEEDS["hf_trainer_state"][0]
    run_dir = tmp_path / "run"
    (run_dir / "checkpoint-40").mkdir(parents=True)
    for rel in seed["files"]:
        (run_dir / "checkpoint-40" / rel).write_bytes((Path(seed["root"]) / rel).read_bytes())
    doc = json.loads(seed["target_bytes"])
    doc["global_step"] = "@@"
    (run_dir / "checkpoint-40" / "trainer_state.json").write_text(json.dumps(doc).replace('"@@"', text))
    v = audit_in_process(run_dir, cfg=B.FUZZ_CFG, out_dir=tmp_path / "out")
    (u,) = v["units"]
    kinds = _kinds(u["findings"])
    assert "audit_error" not in kinds and "state_file_unreadable" in kinds
    assert u["usable_for"] in ("warm-start", "none")


@pytest.mark.parametrize("extra", [{"step": float("inf")}, {"step": float("nan")}, {"step": 3, "epoch": 10 ** 400},
                                   {"iteration": -float("inf")}])
def test_regression_non_finite_counters_in_a_pickle(tmp_path, extra):
    """A pickled float('inf') step (or an epoch beyond float range) is no counter: components.scalar
    ignores it instead of int(inf)/float(10**400) raising OverflowError in three stages."""
    import torch

    from ckptaudit.pipeline import audit_in_process

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.save({"model": {"w": torch.ones(2)}, **extra}, run_dir / "ckpt_000001.pt")
    v = audit_in_process(run_dir, cfg=B.FUZZ_CFG, out_dir=tmp_path / "out")
    (u,) = v["units"]
    assert "audit_error" not in _kinds(u["findings"])
    assert v["units"][0]["step"] in (None, 3, 1)
