"""A DCP chunk whose bytes changed after the save fails its blob's record CRC-32: the audit names it, once read.

Runs are written by ``torch.distributed.checkpoint.save`` itself (one process, two saves).  With the default
``SerializationFormat.TORCH_SAVE`` each item of ``__0_0.distcp`` is a ``torch.save`` zip; the damage (a flipped
bit in one tensor's data, a zeroed 4 KiB page in another's) is placed through ``zipfile``'s view of the blob, and
torch's own ``dcp_to_torch_save`` confirms it is real: it loads the changed values without a word.
"""

import io
import shutil
import subprocess
import sys
import textwrap
import warnings
import zipfile
import zlib

import pytest

from ckptaudit import fs
from ckptaudit.pipeline import audit_in_process

SAVE = textwrap.dedent("""
    import sys, warnings
    import torch
    import torch.distributed.checkpoint as dcp
    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in (10, 20):
        for _ in range(2):
            model(torch.randn(4, 64)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "train_state": {"step": step}}
        dcp.save(state, checkpoint_id=f"{sys.argv[1]}/step-{step}", no_dist=True)
""")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    pytest.importorskip("torch")
    run = tmp_path_factory.mktemp("dcp") / "run"
    subprocess.run([sys.executable, "-c", SAVE, str(run)], check=True)
    return run


def _blobs(unit):
    """{fqn: (relative_path, offset, length)} of every item, from torch's own reader."""
    from torch.distributed.checkpoint import FileSystemReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = FileSystemReader(str(unit)).read_metadata()
    return {idx.fqn: (info.relative_path, info.offset, info.length) for idx, info in meta.storage_data.items()}


def _records(unit, place):
    """``(name, data offset in the rank file, size, stored CRC)`` of each record of the blob at ``place``."""
    relp, off, n = place
    blob = (unit / relp).read_bytes()[off:off + n]
    out = []
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        for i in z.infolist():
            nlen, xlen = int.from_bytes(blob[i.header_offset + 26:i.header_offset + 28], "little"), \
                int.from_bytes(blob[i.header_offset + 28:i.header_offset + 30], "little")
            out.append((i.filename, off + i.header_offset + 30 + nlen + xlen, i.file_size, i.CRC))
    return out


def _tensor_data(unit, fqn):
    """``(relative_path, offset, length)`` of the ``data/`` record of ``fqn``'s blob."""
    place = _blobs(unit)[fqn]
    name, at, n, _ = next(r for r in _records(unit, place) if "/data/" in r[0])
    return place[0], at, n


def test_the_plan_of_a_rank_file_lists_every_blob_record_and_reads_no_tensor_byte(saved, tmp_path):
    from ckptaudit.onepass.plan import plan_file

    unit = tmp_path / "step-20"
    shutil.copytree(saved / "step-20", unit)  # a fresh folder: its .metadata is parsed here
    blobs = _blobs(unit)
    want_crc, want_td = set(), set()
    for place in set(blobs.values()):
        for name, at, n, crc in _records(unit, place):
            want_crc.add((f"{place[1]}:{name}", at, n))
            if name.split("/")[1:2] == ["data"]:
                want_td.add((at, n))
    path = unit / "__0_0.distcp"
    before = fs.local_bytes_read()
    plan = plan_file(path)
    read = fs.local_bytes_read() - before
    assert set(plan.crc) == want_crc and len(plan.crc) == len(want_crc)
    assert set(plan.tensor_data) == want_td and len(want_td) == sum(1 for f in blobs if f.startswith(("model.",
                                                                                                     "optimizer.s")))
    data = path.read_bytes()
    stored = {(at, n): crc for place in set(blobs.values()) for _, at, n, crc in _records(unit, place)}
    assert all(zlib.crc32(data[o:o + n]) == stored[(o, n)] for _, o, n in plan.crc)
    skeleton = len(data) - sum(n for _, n in plan.tensor_data)
    assert read <= skeleton + (unit / ".metadata").stat().st_size, (read, skeleton)  # not one tensor byte
    # the hash stage walks a unit's .metadata once and hands its places to each file's plan
    from ckptaudit.onepass.plan_dcp import unit_places

    places = unit_places([path, unit / ".metadata"])
    assert list(places) == [fs.fspath(path)] and set(places[fs.fspath(path)]) == {p[0] for p in blobs.values()}
    before = fs.local_bytes_read()
    given = plan_file(path, dcp_places=places[fs.fspath(path)])
    assert fs.local_bytes_read() - before <= skeleton, "the .metadata is not read again"
    assert given.crc == plan.crc and given.tensor_data == plan.tensor_data


def test_a_changed_chunk_is_an_error_naming_the_tensor_and_the_rollback_moves_back(saved, tmp_path):
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    unit = bad / "step-20"
    relp, at, n = _tensor_data(unit, "model.0.weight")
    with open(unit / relp, "r+b") as f:  # one bit of one float
        f.seek(at + n // 2)
        b = f.read(1)
        f.seek(at + n // 2)
        f.write(bytes([b[0] ^ 0x10]))
    relp2, at2, n2 = _tensor_data(unit, "optimizer.state.0.exp_avg_sq")
    with open(unit / relp2, "r+b") as f:  # a page that never reached the disk
        f.seek(at2 + 8192)
        f.write(bytes(4096))

    v = audit_in_process(bad, {}, out_dir=tmp_path / "out-bad")
    u = {x["unit"]: x for x in v["units"]}
    hits = [f for f in u["step-20"]["findings"] if f["kind"] == "dcp_chunk_crc_mismatch"]
    assert {f["detail"]["item"] for f in hits} == {"model.0.weight", "optimizer.state.0.exp_avg_sq"}
    f = next(f for f in hits if f["detail"]["item"] == "model.0.weight")
    assert f["severity"] == "error" and f["path"] == "step-20/__0_0.distcp"
    place = _blobs(unit)["model.0.weight"]
    assert "tensor model.0.weight (its chunk at offsets [0, 0])" in f["message"]
    assert f"bytes {place[1]}..{place[1] + place[2]} of the file" in f["message"]
    assert f"its data (bytes {at}..{at + n})" in f["message"] and "roll back" in f["next_step"]
    assert u["step-20"]["usable_for"] == "none" and u["step-10"]["usable_for"] == "resume"
    assert v["recommendation"] == "resume" and v["rollback"]["unit"] == "step-10"

    good = audit_in_process(saved, {}, out_dir=tmp_path / "out-good")  # no false alarm on the untouched run
    assert not [f for x in good["units"] for f in x["findings"] if f["kind"] == "dcp_chunk_crc_mismatch"]
    assert good["rollback"]["unit"] == "step-20"

    # torch's own loader: the damage is real, and it says nothing about it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(saved / "step-20"), str(tmp_path / "good.pt"))
        try:
            dcp_to_torch_save(str(unit), str(tmp_path / "bad.pt"))
        except Exception:  # noqa: BLE001 - a reader that checks the CRC raises: the damage is real too
            return
    want = _flat(torch.load(tmp_path / "good.pt", weights_only=False))
    got = _flat(torch.load(tmp_path / "bad.pt", weights_only=False))
    changed = {k for k, t in want.items() if isinstance(t, torch.Tensor) and not torch.equal(got[k], t)}
    assert changed == {"model.0.weight", "optimizer.state.0.exp_avg_sq"}


def _flat(d, prefix=""):
    """{"a.b.c": leaf} of a nested state dict (keys as text)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_without_the_pass_facts_the_scan_judges_as_before(saved, tmp_path):
    """No facts (a file the pass did not plan, or changed since): nothing is compared, nothing is claimed."""
    from ckptaudit.layouts.dcp import ADAPTER
    from ckptaudit.onepass.facts import ByteFacts

    bad = tmp_path / "bad"
    shutil.copytree(saved / "step-20", bad / "step-20")
    relp, at, n = _tensor_data(bad / "step-20", "model.2.weight")
    with open(bad / "step-20" / relp, "r+b") as f:
        f.seek(at)
        f.write(b"\xff\xff\xff\xff")
    for facts in (None, ByteFacts()):
        scan = ADAPTER.scan(bad, {"unit": "step-20"}, {}, facts)
        assert not [f for f in scan.findings if f.kind == "dcp_chunk_crc_mismatch"]


def test_the_plain_reader_agrees_with_the_general_parser_and_hands_over_what_it_does_not_know(saved, tmp_path):
    """``blob_records`` reads a torch.save blob's records with struct alone (the plan of a 100,000-tensor rank
    file is one such parse per chunk); anything off the shape torch writes goes to the general parser, which
    leaves a record whose local header disagrees out."""
    from ckptaudit.formats.zip import blob as B
    from ckptaudit.formats.zip.reader import ArchiveFile

    unit = saved / "step-20"
    places = sorted(set(_blobs(unit).values()), key=lambda p: p[1])
    path = unit / places[0][0]
    fh = ArchiveFile(str(path), window=0, prefetch=False)
    try:
        for _, off, n in places:
            fast = B._plain_records(fh, off, n)
            assert fast is not None and len(fast) > 0
            want = [(name, at, size, crc) for name, at, size, crc in _records(unit, (places[0][0], off, n))]
            assert list(zip(fast.names, fast.data_offset, fast.length, fast.crc)) == want
    finally:
        fh.close()
    data = bytearray(path.read_bytes())
    _, off, n = places[0]
    lho = data.index(b"PK\x03\x04", off + 1)  # the blob's second local header
    data[lho + 10] ^= 0x01  # its modification time: no longer the central directory's
    bad = tmp_path / "bad.distcp"
    bad.write_bytes(bytes(data))
    fh = ArchiveFile(str(bad), window=0, prefetch=False)
    try:
        assert B._plain_records(fh, off, n) is None
        got = B.blob_records(fh, off, n)  # the general parser: that record left out, the others kept
        assert got is not None and len(got) == len(_records(unit, places[0])) - 1
    finally:
        fh.close()


class _Payload:
    """What public advisories on DCP ``.metadata`` describe: an object whose ``__reduce__`` names ``os.system``, so
    that ``pickle.load`` (``FileSystemReader.read_metadata``) runs a command."""

    def __reduce__(self):
        import os

        return os.system, ("touch CKPTAUDIT_PAYLOAD_RAN",)


def test_a_unit_refused_for_security_still_gets_its_file_layer_checks(saved, tmp_path):
    """A .metadata that imports os.system used to stop the DCP scan at the refusal: a truncated shard and a
    flipped byte of the same unit got no file finding.  The refusal decides usability; the static walk's storage
    facts still drive the shard and CRC checks, and nothing is executed."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader

    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    unit = bad / "step-20"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = FileSystemReader(str(unit)).read_metadata()  # the test's own file: trusted
    relp, at, n = _tensor_data(unit, "model.0.weight")  # read before .metadata is made hostile
    meta.planner_data = _Payload()  # a real Metadata that also carries a REDUCE of os.system
    meta.storage_meta = None
    (unit / ".metadata").write_bytes(pickle.dumps(meta, protocol=2))
    with open(unit / relp, "r+b") as f:  # one bit of one float (torch's reader takes it silently)
        f.seek(at + n // 2)
        b = f.read(1)
        f.seek(at + n // 2)
        f.write(bytes([b[0] ^ 0x10]))
    data = unit / "__0_0.distcp"
    size = data.stat().st_size
    with open(data, "r+b") as f:  # the end of the rank file never reached the disk
        f.truncate(size - 1000)

    v = audit_in_process(bad, {}, out_dir=tmp_path / "out")
    u = {x["unit"]: x for x in v["units"]}["step-20"]
    kinds = {(f["layer"], f["kind"], f["severity"]) for f in u["findings"]}
    assert ("security", "malicious_pickle_code_exec", "error") in kinds, kinds
    short = [f for f in u["findings"] if f["kind"] == "dcp_shard_too_short"]
    assert len(short) == 1 and short[0]["layer"] == "file" and short[0]["severity"] == "error"
    assert f"found {size - 1000}" in short[0]["message"] or str(size - 1000) in short[0]["message"]
    crc = [f for f in u["findings"] if f["kind"] == "dcp_chunk_crc_mismatch"]
    assert {f["detail"]["item"] for f in crc} == {"model.0.weight"}
    assert u["usable_for"] == "none" and v["rollback"]["unit"] == "step-10"
    assert not list(tmp_path.rglob("CKPTAUDIT_PAYLOAD_RAN")) and not list(bad.rglob("CKPTAUDIT_PAYLOAD_RAN"))
