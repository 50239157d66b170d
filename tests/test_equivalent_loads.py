"""A file's load stands for another's only where torch's own loader cannot tell them apart
(ckptaudit.stages.load.equivalent): torch's checkpoints of one model at several steps follow the first; every change
hypothesis makes to a follower's bytes either keeps it a follower and torch loads it as it loaded the first, or
makes it load on its own; numbers in bound places, sparse tensors and other headers are loaded; a load that failed
is never stood for."""

import collections
import io
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptaudit import discovery as inventory
from ckptaudit.pipeline import audit_in_process
from ckptaudit.stages.load import equivalent, loadtest
from ckptaudit.stages.load.compared_bytes import Reader, stored_records
from ckptaudit.stages.load.loaded_object import summary
from ckptaudit.stages.load.reader import ReaderLoads
from ckptaudit.stages.scan import scan_units

torch = pytest.importorskip("torch")


def _training_run(folder, steps=6, meta=dict):
    """``torch.save`` checkpoints of one model (AdamW, LambdaLR, RNG state, step and loss in ``meta``) after
    ``steps`` optimizer steps, one per step; their paths."""
    torch.manual_seed(0)
    folder.mkdir(parents=True, exist_ok=True)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    paths = []
    for step in range(1, steps + 1):
        loss = m(torch.randn(2, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        sch.step()
        opt.zero_grad()
        p = folder / f"ckpt_{step:06d}.pt"
        torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "scheduler": sch.state_dict(),
                    "rng": torch.get_rng_state(), "meta": meta(step=step, loss=loss.item())}, p)
        paths.append(p)
    return paths


def _load(path):
    return summary(torch.load(path, map_location="cpu", weights_only=True, mmap=True))


def _plan(paths, kind="torch_zip"):
    return equivalent.plan([str(p) for p in paths], [kind] * len(paths), [[]] * len(paths))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return _training_run(tmp_path_factory.mktemp("equivalent"))


def _records(data: bytes):
    return stored_records(Reader.of(data))


def _crc_fields(data: bytes):
    return [at for r in _records(data) for at in r[1]]


def test_torch_checks_no_crc_on_load(run, tmp_path):
    """The rule's premise: torch 2.13 loads a file whose every CRC-32 field (central directory, local header, data
    descriptor) is wrong, as it loads the file itself."""
    data = run[0].read_bytes()
    want = _load(run[0])
    fields = _crc_fields(data)
    assert len(fields) == 3 * len(zipfile.ZipFile(run[0]).infolist())
    bad = bytearray(data)
    for at in fields:
        bad[at:at + 4] = bytes(b ^ 0xA5 for b in bad[at:at + 4])
    p = tmp_path / run[0].name
    p.write_bytes(bytes(bad))
    assert _load(p) == want


def test_steps_of_one_model_follow_the_first(run):
    assert _plan(run) == {0: [1, 2, 3, 4, 5]}
    want = _load(run[0])
    assert want["n_tensors"] > 10
    assert all(_load(p) == want for p in run[1:])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_follower_loads_as_its_template_did(run, tmp_path, data):
    """Random bytes at random places of a follower: if the template still matches, torch loads the file as it
    loaded the template's; a change only where the template allows one always matches."""
    raw = run[1].read_bytes()
    t = equivalent.zip_template(0, run[0].read_bytes())
    inside = np.zeros(len(raw), dtype=bool)
    for a, b in t.regions:
        inside[a:b] = True
    names = np.zeros(t.raw.size, dtype=bool)
    names[t.prefixes.ravel()] = True
    free = sorted(np.flatnonzero(~inside).tolist() + t.file_offsets(np.flatnonzero(t.free & ~names)).tolist())
    anywhere = data.draw(st.booleans())
    k = data.draw(st.integers(1, 6))
    pool = st.integers(0, len(raw) - 1) if anywhere else st.sampled_from(free)
    at = data.draw(st.lists(pool, min_size=k, max_size=k))
    new = data.draw(st.binary(min_size=k, max_size=k))
    b = bytearray(raw)
    for i, v in zip(at, new):
        b[i] = v
    p = tmp_path / run[1].name
    p.write_bytes(bytes(b))
    if not anywhere:
        assert t.matches(bytes(b))
    if t.matches(bytes(b)):
        assert _load(p) == _load(run[0])


def test_another_archive_name_in_every_record_matches_and_loads(run, tmp_path):
    data = run[1].read_bytes()
    old = run[1].stem.encode()
    renamed = data.replace(old + b"/", b"x" * len(old) + b"/")
    p = tmp_path / "renamed.pt"
    p.write_bytes(renamed)
    t = equivalent.zip_template(0, run[0].read_bytes())
    assert t.matches(renamed) and _load(p) == _load(run[0])
    once = data.replace(old + b"/", b"y" * len(old) + b"/", 1)  # one record in another folder: torch refuses
    assert not t.matches(once)
    slash = data.replace(old + b"/", b"a/" + b"b" * (len(old) - 2) + b"/")
    assert not t.matches(slash)


def test_numbers_in_bound_places_are_loaded(tmp_path):
    """The step inside an OrderedDict (a call, for the walk): no file follows another."""
    paths = _training_run(tmp_path, steps=3, meta=lambda **kw: collections.OrderedDict(kw))
    assert _plan(paths) == {}


def test_a_sparse_tensor_gets_no_template(tmp_path):
    """torch reads a sparse tensor's indices on load (_validate_loaded_sparse_tensors): its storage bytes
    matter, so no file of that shape stands for another."""
    for i in range(2):
        torch.save({"w": torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0 + i]), (4,))},
                   tmp_path / f"s{i}.pt")
    assert equivalent.zip_template(0, (tmp_path / "s0.pt").read_bytes()) is None
    assert _plan([tmp_path / "s0.pt", tmp_path / "s1.pt"]) == {}


def test_safetensors_of_one_header_follow(tmp_path):
    from safetensors.torch import save_file

    for i in range(3):
        save_file({"a": torch.full((4, 4), float(i)), "b": torch.zeros(3)}, tmp_path / f"m{i}.safetensors")
    save_file({"a": torch.zeros(4, 4), "c": torch.zeros(3)}, tmp_path / "other.safetensors")
    paths = [tmp_path / f"m{i}.safetensors" for i in range(3)] + [tmp_path / "other.safetensors"]
    assert _plan(paths, "safetensors") == {0: [1, 2]}


def _todo(paths):
    return [({"unit": p.name, "files": [p.name]}, p.name, "torch_zip", []) for p in paths]


def test_a_failed_load_is_never_stood_for(run):
    calls = []

    def loader(run_dir, todo, cfg, timeout, limit, kept=None):
        calls.append([f for _, f, _, _ in todo])
        return [{"status": "failed" if f == run[0].name else "ok", "load_seconds": 0.1, "peak_rss_bytes": 1}
                for _, f, _, _ in todo]

    out = equivalent.load_or_follow(run[0].parent, _todo(run), {}, 10, 1 << 30, loader, None)
    assert calls == [[run[0].name], [p.name for p in run[1:]]]
    assert [r["status"] for r in out] == ["failed"] + ["ok"] * 5 and not any("loaded_as" in r for r in out)


def test_the_reader_and_the_config_load_every_file(run):
    seen = []

    class Loader(ReaderLoads):
        def __call__(self, run_dir, todo, cfg, timeout, limit, kept=None):
            seen.append(len(todo))
            return [{"status": "ok"} for _ in todo]

    equivalent.load_or_follow(run[0].parent, _todo(run), {}, 10, 1 << 30, Loader(), None)
    plain = Loader.__call__
    equivalent.load_or_follow(run[0].parent, _todo(run), {"load": {"by_equivalence": False}}, 10, 1 << 30,
                             lambda *a, **k: plain(None, *a, **k), None)
    assert seen == [6, 6]


def test_the_load_table_names_the_file_loaded(run):
    units, _, _ = inventory.discover(run[0].parent)
    ud = [u.to_dict() for u in units]
    scans, _, _ = scan_units(run[0].parent, ud, {})
    rows = loadtest.load_units(run[0].parent, ud, {s["unit"]: s for s in scans}, {})
    assert [(r.status, r.loaded_as) for r in rows] == [("ok", "")] + [("ok", run[0].name)] * 5
    assert rows[0].load_seconds > 0 and rows[1].load_seconds == 0 and rows[1].peak_rss_bytes == 0
    assert {r.n_tensors for r in rows} == {rows[0].n_tensors}


def test_verdicts_are_those_of_loading_every_file(run, tmp_path):
    a = audit_in_process(run[0].parent, out_dir=tmp_path / "a")
    b = audit_in_process(run[0].parent, {"load": {"by_equivalence": False}}, out_dir=tmp_path / "b")
    assert (a["recommendation"], a["rollback"]) == (b["recommendation"], b["rollback"])
    assert a["rollback"]["unit"] == run[-1].name
    assert [(u["unit"], u["usable_for"], u["findings"]) for u in a["units"]] == \
        [(u["unit"], u["usable_for"], u["findings"]) for u in b["units"]]


# ---- pickles written by hand, the way a crafted or unusual file would be (opcodes: Lib/pickletools.py)

def _g(mod, name):
    return b"c" + mod.encode() + b"\n" + name.encode() + b"\n"


def _u(s):
    return b"X" + struct.pack("<I", len(s.encode())) + s.encode()


def _i1(n):
    return b"K" + bytes([n])


def _l1(n):  # LONG1: a number no template may change
    return b"\x8a\x01" + bytes([n])


_PUT, _GET = (lambda i: b"q" + bytes([i])), (lambda i: b"h" + bytes([i]))


def _zip(pkl, storages, prefix="archive"):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        z.writestr(f"{prefix}/byteorder", "little")
        for k, v in storages.items():
            z.writestr(f"{prefix}/data/{k}", v)
        z.writestr(f"{prefix}/version", "3\n")
        z.writestr(f"{prefix}/.data/serialization_id", "1234567890" * 4)
    return buf.getvalue()


def _tensor(key, stype, numel_op, size_op):
    return (_g("torch._utils", "_rebuild_tensor_v2") + b"((" + _u("storage") + _g("torch", stype) + _u(key)
            + _u("cpu") + numel_op + b"tQ" + _l1(0) + size_op + _l1(1) + b"\x85\x89"
            + _g("collections", "OrderedDict") + b")RtR")


_F4 = np.arange(4, dtype=np.float32).tobytes()


def _same_or_unmatched(tmp_path, template: bytes, candidate: bytes) -> bool:
    """Whether ``candidate`` either does not follow ``template`` or torch loads both alike; True also asserts
    that torch loads the template."""
    (tmp_path / "t.pt").write_bytes(template)
    (tmp_path / "c.pt").write_bytes(candidate)
    want = _load(tmp_path / "t.pt")
    if _plan([tmp_path / "t.pt", tmp_path / "c.pt"]) == {}:
        return True
    try:
        return _load(tmp_path / "c.pt") == want
    except Exception:  # noqa: BLE001 - a follower that does not load is the failure this test looks for
        return False


@pytest.mark.parametrize("case", ["numel", "key"])
def test_numbers_of_a_persistent_id_shared_through_the_memo_are_bound(tmp_path, case):
    def pkl(numel, key):
        return (b"\x80\x02}" + _PUT(0) + b"(" + _u("w") + _g("torch._utils", "_rebuild_tensor_v2") + b"((" +
                _u("storage") + _g("torch", "FloatStorage") + key + _u("cpu") + _i1(numel) + b"t" + _PUT(1) +
                b"Q" + _i1(0) + _i1(4) + b"\x85" + _i1(1) + b"\x85\x89" + _g("collections", "OrderedDict") +
                b")RtR" + _u("pid") + _GET(1) + b"u.")

    a, b = ((pkl(4, _u("0")), pkl(0, _u("0"))) if case == "numel" else (pkl(4, _i1(0)), pkl(4, _i1(1))))
    assert _same_or_unmatched(tmp_path, _zip(a, {"0": _F4}), _zip(b, {"0": _F4}))


def test_a_number_used_as_a_key_through_the_memo_is_bound(tmp_path):
    def pkl(k):  # root = {k: 1, "b": "v", "v"... }: the same int is a key and (by GET) a value
        return b"\x80\x02}" + _PUT(0) + b"(" + _i1(k) + _PUT(1) + _u("a") + _i1(1) + _u("b") + _u("v") + _GET(1) + b"u."

    assert _same_or_unmatched(tmp_path, _zip(pkl(2), {}), _zip(pkl(1), {}))


def test_a_tensor_handed_to_a_call_or_a_build_gets_no_template():
    shape = _tensor("0", "LongStorage", _l1(1), _l1(1) + b"\x85")  # torch.Size(shape) reads its values
    size_from_tensor = (b"\x80\x02}" + _PUT(0) + b"(" + _u("shape") + shape + _PUT(1) + _u("w")
                        + _tensor("1", "FloatStorage", _l1(4), _g("torch", "Size") + _GET(1) + b"\x85R") + b"u.")
    built = (b"\x80\x02}" + _PUT(0) + b"(" + _u("w") + _tensor("0", "FloatStorage", _l1(4), _l1(4) + b"\x85") +
             b"(" + _l1(0) + b"tb" + b"u.")
    for pkl, stores in ((size_from_tensor, {"0": np.array([4], np.int64).tobytes(), "1": _F4}),
                        (built, {"0": _F4})):
        assert equivalent.zip_template(0, _zip(pkl, stores)) is None


def test_the_serialization_id_and_the_folder_may_differ_only_as_torch_writes_them(run):
    data = run[1].read_bytes()
    t = equivalent.zip_template(0, run[0].read_bytes())
    (start, end), = [(r[2], r[3]) for r in _records(data) if r[0].endswith(".data/serialization_id")]
    assert t.matches(data[:start] + b"7" * (end - start) + data[end:])
    assert not t.matches(data[:start] + b"\xff" * (end - start) + data[end:])  # torch decodes it as text
    old = run[1].stem.encode()
    for other, follows in ((b"Q" * len(old), True), (b"\0" * len(old), False), (b" " * len(old), False)):
        assert t.matches(data.replace(old + b"/", other + b"/")) is follows, other


def test_two_records_of_one_name_get_no_template():
    pkl = b"\x80\x02}."
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        z.writestr("archive/DATA.pkl", pkl)
        z.writestr("archive/version", "3\n")
    assert equivalent.zip_template(0, buf.getvalue()) is None


def test_a_large_file_is_compared_without_reading_its_tensor_data(tmp_path):
    from ckptaudit import fs

    paths = []
    for step in range(3):
        p = tmp_path / f"big_{step}.pt"
        torch.save({"w": torch.full((1 << 20,), float(step)), "step": step + 1}, p)  # 4 MiB of tensor data
        paths.append(p)
    before = fs.local_bytes_read()
    assert _plan(paths) == {0: [1, 2]}
    read = fs.local_bytes_read() - before
    assert 0 < read < 3 * (16 << 10), read
    assert all(_load(p)["n_tensors"] == 1 for p in paths)


def test_a_zip_two_readers_would_read_apart_gets_no_template(run):
    """Bytes before the archive (Python's zipfile shifts every offset past them, torch's miniz does not) or a
    ZIP64 locator that points elsewhere than the record before it: no template (a second review hid another
    archive in a storage record's bytes both ways)."""
    data = run[0].read_bytes()
    assert equivalent.zip_template(0, data) is not None
    assert equivalent.zip_template(0, b"\0" * 64 + data) is None
    loc = data.rindex(b"PK\x06\x07")
    moved = data[:loc + 8] + struct.pack("<Q", struct.unpack_from("<Q", data, loc + 8)[0] - 8) + data[loc + 16:]
    assert equivalent.zip_template(0, moved) is None
