"""safe_load_checkpoint pays for the unit it returns: tensor bytes of the rollback point and the newer units
it rejected, and only the metadata of the rest (issue 23).

A nanoGPT-style run of plain ``torch.save`` files (model, AdamW state, ``iter_num``) of ~12 MB each, damaged
the ways a run is: a bit flipped inside a tensor record (size and mtime kept: only the record's CRC32
shows it), and a save cut at half its length.  Bytes are the package's own counters (``ckpt.bytes_read``).
"""

import os

import pytest

from ckptaudit import safe_load_checkpoint
from ckptaudit.pipeline import audit_in_process

#: Metadata the reader may read of each unit: the zip central directory, local headers, data.pkl and the
#: small records (version, byteorder) of a 12 MB torch.save file are ~60 kB.
METADATA_SLACK = 256 << 10


def _run(d, steps=(100, 200, 300, 400)):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    d.mkdir()
    for step in steps:
        model(torch.randn(4, 512)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "iter_num": step},
                   d / f"ckpt_{step:06d}.pt")
    return d


def _flip_a_tensor_byte(path):
    """One bit flipped in the middle of the largest tensor record; size and mtime kept."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        big = max(z.infolist(), key=lambda i: i.compress_size)
        with open(path, "rb") as f:
            f.seek(big.header_offset + 26)
            n, m = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        at = big.header_offset + 30 + n + m + big.compress_size // 2
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _cut(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage, rollback, examined", [
    ({}, "ckpt_000400.pt", ["ckpt_000400.pt"]),
    ({"ckpt_000400.pt": _flip_a_tensor_byte}, "ckpt_000300.pt", ["ckpt_000400.pt", "ckpt_000300.pt"]),
    ({"ckpt_000400.pt": _cut}, "ckpt_000300.pt", ["ckpt_000300.pt"]),
    ({"ckpt_000400.pt": _flip_a_tensor_byte, "ckpt_000300.pt": _flip_a_tensor_byte}, "ckpt_000200.pt",
     ["ckpt_000400.pt", "ckpt_000300.pt", "ckpt_000200.pt"]),
], ids=["newest_good", "newest_bit_rot", "newest_cut", "two_newest_bit_rot"])
def test_reader_reads_the_units_it_examines_and_the_metadata_of_the_rest(tmp_path, damage, rollback, examined):
    run = _run(tmp_path / "run")
    for name, hurt in damage.items():
        hurt(run / name)
    audit = audit_in_process(run, {}, out_dir=tmp_path / "audit")
    assert audit["rollback"]["unit"] == rollback  # the full audit's answer is the reader's truth
    ckpt = safe_load_checkpoint(run)
    assert (ckpt.unit, ckpt.step, ckpt.examined) == (rollback, int(rollback[5:11]), examined)
    sizes = {p.name: p.stat().st_size for p in run.iterdir()}
    newer = [n for n in sizes if n > rollback]  # rejected: all their bytes may be read (a cut zip is walked)
    older = [n for n in sizes if n < rollback]  # never their tensor bytes
    # every unit's metadata is read for the run-level judgements (the examined ones' again in their full check)
    budget = sum(sizes[n] for n in [rollback, *newer]) + len(sizes) * METADATA_SLACK
    assert len(older) == 3 - len(newer)
    assert sum(sizes[n] for n in examined) <= ckpt.bytes_read <= budget, (ckpt.bytes_read, budget, sizes)


def test_reader_starts_from_a_recent_audit_and_rechecks_what_it_returns(tmp_path):
    """``audit=``: last night's audit judges the units it covered; the unit returned is read again, and a unit
    written since is judged from its own bytes.  A bit flipped in the audit's rollback point after the audit
    (size, mtime and inode kept, so the audit's rows still stand for it) is caught by that re-check."""
    run = _run(tmp_path / "run")
    audit_in_process(run, {}, out_dir=tmp_path / "audit")
    sizes = {p.name: p.stat().st_size for p in run.iterdir()}
    ckpt = safe_load_checkpoint(run, audit=tmp_path / "audit")
    assert (ckpt.unit, ckpt.examined) == ("ckpt_000400.pt", ["ckpt_000400.pt"])
    assert sizes["ckpt_000400.pt"] <= ckpt.bytes_read <= sizes["ckpt_000400.pt"] + METADATA_SLACK  # no metadata pass

    _flip_a_tensor_byte(run / "ckpt_000400.pt")
    ckpt = safe_load_checkpoint(run, audit=tmp_path / "audit" / "verdict.json")
    assert (ckpt.unit, ckpt.examined) == ("ckpt_000300.pt", ["ckpt_000400.pt", "ckpt_000300.pt"])
    assert "ckpt_000400.pt" in ckpt.skipped and "crc" in ckpt.skipped["ckpt_000400.pt"].lower()

    import torch  # a unit saved after the audit is the newest: judged from its metadata, then examined

    good = torch.load(run / "ckpt_000300.pt", weights_only=True)
    torch.save({**good, "iter_num": 500}, run / "ckpt_000500.pt")
    ckpt = safe_load_checkpoint(run, audit=tmp_path / "audit")
    assert (ckpt.unit, ckpt.step, ckpt.examined) == ("ckpt_000500.pt", 500, ["ckpt_000500.pt"])

    with pytest.raises(ValueError, match="not of"):
        other = _run(tmp_path / "other", steps=(100,))
        safe_load_checkpoint(other, audit=tmp_path / "audit")
    with pytest.raises(FileNotFoundError, match="not a finished audit"):
        safe_load_checkpoint(run, audit=tmp_path)


def test_a_pass_stops_at_its_next_buffer_when_its_caller_says_so(tmp_path):
    """The reader's read-ahead of the newest unit is abandoned when the search chooses another unit first: the
    pass raises ``PassStopped`` (an ``OSError``) at its next buffer, having read no more than that buffer."""
    import threading

    from ckptaudit.onepass import stream
    from ckptaudit.onepass.filepass import pass_file

    p = tmp_path / "big.bin"
    p.write_bytes(os.urandom(1 << 20) * 64)  # 64 MiB: eight 8 MiB buffers
    stop = threading.Event()

    class StopAfterFirst:
        seen = 0

        def feed(self, off, view):
            self.seen += len(view)
            stop.set()

    c = StopAfterFirst()
    with pytest.raises(stream.PassStopped):
        stream.run(p, [c], stop=stop)
    assert c.seen == stream.BUFFER_BYTES  # one buffer, then the stop
    with pytest.raises(OSError):  # a whole-file pass, as the hash stage runs it
        pass_file(p, stop=stop)
    assert pass_file(p).sha256_hex  # a pass not given the event: nothing stops it


def test_read_ahead_only_of_a_zip_that_ends_with_its_directory(tmp_path):
    """A save cut short is never read ahead: the metadata pass, which walks a cut zip's records, is its only
    reader (so the cut unit's bytes are read once)."""
    from ckptaudit.newest_first import _ends_whole

    run = _run(tmp_path / "run", steps=(100, 200))
    unit = {"unit": "ckpt_000200.pt", "files": ["ckpt_000200.pt"]}
    assert _ends_whole(str(run), unit)
    _cut(run / "ckpt_000200.pt")
    assert not _ends_whole(str(run), unit)
    os.mkfifo(run / "fifo.pt")  # never opened for a blocking read
    assert not _ends_whole(str(run), {"unit": "fifo.pt", "files": ["fifo.pt"]})
    (run / "link.pt").symlink_to(tmp_path / "elsewhere.pt")  # never read outside the run
    (tmp_path / "elsewhere.pt").write_bytes(b"PK\x03\x04")
    assert not _ends_whole(str(run), {"unit": "link.pt", "files": ["link.pt"]})


def test_the_reader_hashes_only_what_a_recorded_digest_can_check(tmp_path):
    """At CHECKED_DIGESTS_ONLY (the reader's examination) a file with no sidecar gets no SHA-256, one with a
    sidecar is still verified, and a bit flipped in a bare file is still found by its record's CRC32."""
    import hashlib

    import blake3

    from ckptaudit.stages import hash as hashing
    from ckptaudit import discovery as inventory
    from ckptaudit.fs import read_depth

    run = _run(tmp_path / "run", steps=(100, 200))
    sealed = run / "ckpt_000100.pt"
    (run / "ckpt_000100.pt.sha256").write_text(f"{hashlib.sha256(sealed.read_bytes()).hexdigest()}  ckpt_000100.pt\n")
    units = {u.unit: u.to_dict() for u in inventory.discover(run)[0]}
    (bare,) = hashing.hash_unit(run, units["ckpt_000200.pt"], depth=read_depth.CHECKED_DIGESTS_ONLY)
    (checked,) = hashing.hash_unit(run, units["ckpt_000100.pt"], depth=read_depth.CHECKED_DIGESTS_ONLY)
    assert bare["sha256_hex"] == "" and bare["verified"] is None
    assert checked["verified"] is True and checked["sha256_hex"] == hashlib.sha256(sealed.read_bytes()).hexdigest()
    (full,) = hashing.hash_unit(run, units["ckpt_000200.pt"])  # the audit records every digest: its own BLAKE3
    assert full["sha256_hex"] == "" and full["digest_algorithm"] == "blake3"
    assert full["digest_hex"] == blake3.blake3((run / "ckpt_000200.pt").read_bytes()).hexdigest()
    _flip_a_tensor_byte(run / "ckpt_000200.pt")
    ckpt = safe_load_checkpoint(run)
    assert ckpt.unit == "ckpt_000100.pt" and "ckpt_000200.pt" in ckpt.skipped
    assert "CRC" in ckpt.skipped["ckpt_000200.pt"] or "crc" in ckpt.skipped["ckpt_000200.pt"].lower()


def test_the_read_depth_reaches_the_zip_check_on_the_facts_it_receives(tmp_path):
    """A flipped tensor byte fails its record's CRC32 at the audit's depth; at METADATA_ONLY (the reader's run
    pass, carried on the ByteFacts the scan hands its checks) the check reads no tensor byte and says nothing
    of it, and neither reads a SHA-256 nor a byte outside the file's metadata."""
    from ckptaudit import fs
    from ckptaudit.formats import torchzip
    from ckptaudit.onepass.facts import ByteFacts
    from ckptaudit.fs.read_depth import METADATA_ONLY

    run = _run(tmp_path / "run", steps=(100,))
    path = run / "ckpt_000100.pt"
    _flip_a_tensor_byte(path)
    full = torchzip.check_zip(path, facts=ByteFacts())
    before = fs.local_bytes_read()
    meta = torchzip.check_zip(path, facts=ByteFacts(METADATA_ONLY.tensor_bytes))
    read = fs.local_bytes_read() - before
    assert [f.kind for f in full.findings if "crc" in f.kind] == ["zip_crc_mismatch"]
    assert not [f for f in meta.findings if "crc" in f.kind]
    assert read <= METADATA_SLACK < path.stat().st_size, (read, path.stat().st_size)


def _swap_after_verification(monkeypatch, run, name, change):
    """Run ``change(path)`` on ``run / name`` right after the hash stage has verified its bytes (on whichever
    thread verifies it), before the load."""
    from ckptaudit.stages import cli as stages

    real = stages.stage_hash
    done = []

    def hash_then_change(inv, part, *a, **k):
        rows = real(inv, part, *a, **k)
        if not done and name in inv["parts"][part]:
            done.append(name)
            change(run / name)
        return rows

    monkeypatch.setattr(stages, "stage_hash", hash_then_change)
    return done


@pytest.mark.parametrize("how", ["renamed_over", "rewritten_in_place"])
def test_a_file_changed_between_verification_and_load_is_never_returned(tmp_path, monkeypatch, how):
    """The unit returned is the one verified: a valid checkpoint renamed over the newest unit after its bytes
    were verified (a new inode), or the unit rewritten in place with its size and mtime put back (the ctime
    moves), is not loaded; the reader falls back to the unit before, and says why."""
    import torch

    run = _run(tmp_path / "run", steps=(100, 200))
    impostor = tmp_path / "impostor.pt"
    good = torch.load(run / "ckpt_000200.pt", weights_only=True)
    torch.save({**good, "iter_num": 999}, impostor)

    def renamed_over(path):
        os.replace(impostor, path)

    def rewritten_in_place(path):
        st = os.stat(path)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        with open(path, "r+b") as f:
            f.write(data)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_ino == st.st_ino and os.stat(path).st_size == st.st_size

    done = _swap_after_verification(monkeypatch, run, "ckpt_000200.pt",
                                    renamed_over if how == "renamed_over" else rewritten_in_place)
    ckpt = safe_load_checkpoint(run)
    assert done == ["ckpt_000200.pt"]
    assert (ckpt.unit, ckpt.step, ckpt["iter_num"]) == ("ckpt_000100.pt", 100, 100)
    assert "changed after its bytes were verified" in ckpt.skipped["ckpt_000200.pt"]


def test_the_final_load_of_a_file_loaded_apart_is_pinned_too(tmp_path, monkeypatch):
    """With a ``map_location`` other than "cpu" the load test runs in a child and the file is loaded again for
    the caller; a file renamed over the verified one before that load makes the reader refuse it."""
    import torch

    from ckptaudit.safe_load import NoUsableCheckpointError
    from ckptaudit.stages.load import loadtest

    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"w": torch.ones(4)}, "iter_num": 7}, run / "ckpt_000007.pt")
    torch.save({"model": {"w": torch.zeros(4)}, "iter_num": 8}, tmp_path / "impostor.pt")
    real = loadtest.load_in_child

    def child_then_swap(path, *a, **k):
        res = real(path, *a, **k)
        os.replace(tmp_path / "impostor.pt", run / "ckpt_000007.pt")
        return res

    monkeypatch.setattr(loadtest, "load_in_child", child_then_swap)
    with pytest.raises(NoUsableCheckpointError) as ei:
        safe_load_checkpoint(run, map_location="meta")
    assert "changed after its bytes were verified" in ei.value.reasons["ckpt_000007.pt"]


def test_a_published_unit_whose_chunks_fail_is_read_once_by_the_reader(tmp_path):
    """A published unit (sidecar, manifest with chunk digests) with a flipped tensor byte is rejected by its
    chunk digest; the reader, which checks the whole-file SHA-256 against nothing more, does not re-read it
    whole for that digest, and names the damaged tensors from the file's metadata: the examined units' bytes
    are read once each (plus metadata), and the audit still records the damaged file's SHA-256."""
    import hashlib
    import json

    import torch

    from ckptaudit.publish import save

    run = tmp_path / "run"
    torch.manual_seed(0)
    for step in (100, 200, 300):
        save({"model": {f"w{k}": torch.randn(1 << 18) for k in range(8)}, "iter_num": step}, run, step=step)
    _flip_a_tensor_byte(run / "ckpt_000300.pt")
    ckpt = safe_load_checkpoint(run)
    assert (ckpt.unit, ckpt.examined) == ("ckpt_000200.pt", ["ckpt_000300.pt", "ckpt_000200.pt"])
    why = ckpt.skipped["ckpt_000300.pt"]
    assert why.startswith("chunk_checksum_mismatch: ") and "it holds tensor(s) model.w" in why, why
    sizes = {n: (run / n).stat().st_size for n in ckpt.examined}
    assert sum(sizes.values()) <= ckpt.bytes_read <= sum(sizes.values()) + 3 * METADATA_SLACK, (ckpt.bytes_read, sizes)

    audit = audit_in_process(run, {}, out_dir=tmp_path / "audit")
    assert audit["rollback"]["unit"] == "ckpt_000200.pt"
    from ckptaudit import tables

    (row,) = [r for r in tables.read_rows(tmp_path / "audit" / "tables" / "hash.parquet")
              if r["file"] == "ckpt_000300.pt"]
    assert row["sha256_hex"] == hashlib.sha256((run / "ckpt_000300.pt").read_bytes()).hexdigest()
    assert row["verified"] is False
    assert [f["kind"] for f in json.loads(row["findings_json"])] == ["chunk_checksum_mismatch"]
