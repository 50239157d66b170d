"""Hash by purpose (issue 45): SHA-256 only where something records one to check, the audit's own BLAKE3 elsewhere,
each digest named by its algorithm, and the next audit's comparison of same-algorithm digests (bit rot with size and
mtime kept)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import blake3
import pytest

from ckptaudit.formats import digest_purpose
from ckptaudit.stages import hash as hashing
from ckptaudit import discovery as inventory
from ckptaudit.pipeline import audit_in_process


def _run(d: Path, steps=(100, 200)) -> Path:
    """Plain ``torch.save`` files, no sidecars: what most training runs leave."""
    import torch

    torch.manual_seed(0)
    d.mkdir()
    for step in steps:
        torch.save({"model": {"w": torch.randn(256, 256), "b": torch.randn(256)}, "iter_num": step},
                   d / f"ckpt_{step:06d}.pt")
    return d


def _seal_with_sidecar(p: Path) -> str:
    digest = hashlib.sha256(p.read_bytes()).hexdigest()
    (p.parent / f"{p.name}.sha256").write_text(f"{digest}  {p.name}\n")
    return digest


def _flip_keeping_times(p: Path, at: int) -> None:
    """One byte inverted at ``at``; size, atime and mtime put back (what bit rot leaves)."""
    st = p.stat()
    with open(p, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (p.stat().st_size, p.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


class _CountingSha256:
    """hashlib.sha256 instrumented: the bytes every SHA-256 made while patched was fed."""

    def __init__(self, real):
        self.real, self.made, self.fed = real, 0, 0

    def __call__(self, *a, **kw):
        outer = self
        h = self.real(*a, **kw)
        self.made += 1
        self.fed += len(a[0]) if a else 0

        class Counted:
            def update(self, b):
                outer.fed += memoryview(b).nbytes
                h.update(b)

            def __getattr__(self, name):
                return getattr(h, name)

        return Counted()


@pytest.fixture
def sha_count(monkeypatch):
    c = _CountingSha256(hashlib.sha256)
    monkeypatch.setattr(hashlib, "sha256", c)
    return c


def _units(run: Path) -> dict:
    return {u.unit: u.to_dict() for u in inventory.discover(run)[0]}


def test_a_plain_torch_save_run_gets_blake3_only_and_no_sha256(tmp_path, sha_count):
    run = _run(tmp_path / "run")
    units = _units(run)
    rows = [r for u in units.values() for r in hashing.hash_unit(run, u)]
    assert sha_count.made == 0 and sha_count.fed == 0  # not one byte went through SHA-256
    for r in rows:
        data = (run / r["file"]).read_bytes()
        assert r["sha256_hex"] == "" and r["expected_sha256_hex"] == "" and r["verified"] is None
        assert (r["digest_algorithm"], r["digest_hex"]) == ("blake3", blake3.blake3(data).hexdigest())
        assert r["mtime_ns"] == (run / r["file"]).stat().st_mtime_ns and r["size_bytes"] == len(data)
    assert digest_purpose.FAST_DIGEST == "blake3"


def test_a_sidecar_gets_sha256_computed_and_checked(tmp_path, sha_count):
    run = _run(tmp_path / "run")
    want = _seal_with_sidecar(run / "ckpt_000100.pt")
    units = _units(run)
    sha_count.made = sha_count.fed = 0  # the sidecar's own SHA-256 above is the test's, not the audit's
    (sealed,) = hashing.hash_unit(run, units["ckpt_000100.pt"])
    size = (run / "ckpt_000100.pt").stat().st_size
    assert sha_count.made == 1 and sha_count.fed == size  # the sealed file, once, and nothing else
    assert sealed["sha256_hex"] == want == sealed["expected_sha256_hex"] and sealed["verified"] is True
    assert (sealed["digest_algorithm"], sealed["digest_hex"]) == ("sha256", want)
    (bare,) = hashing.hash_unit(run, units["ckpt_000200.pt"])
    assert sha_count.fed == size  # the bare file: BLAKE3 only
    assert bare["digest_algorithm"] == "blake3" and bare["sha256_hex"] == ""


def test_a_wrong_sidecar_is_a_checksum_mismatch_in_sha256(tmp_path):
    run = _run(tmp_path / "run", steps=(100,))
    (run / "ckpt_000100.pt.sha256").write_text(f"{'0' * 64}  ckpt_000100.pt\n")
    (row,) = hashing.hash_unit(run, _units(run)["ckpt_000100.pt"])
    assert row["verified"] is False and row["digest_algorithm"] == "sha256"
    assert row["sha256_hex"] == hashlib.sha256((run / "ckpt_000100.pt").read_bytes()).hexdigest()
    assert [f["kind"] for f in json.loads(row["findings_json"])] == ["checksum_mismatch"]


def test_the_seal_depth_hashes_the_bare_files_too(tmp_path):
    """What `ckptaudit seal` runs its audit in: the sidecars it writes record SHA-256."""
    run = _run(tmp_path / "run", steps=(100,))
    from ckptaudit.fs import read_depth

    (row,) = hashing.hash_unit(run, _units(run)["ckpt_000100.pt"], depth=read_depth.SEAL)
    want = hashlib.sha256((run / "ckpt_000100.pt").read_bytes()).hexdigest()
    assert (row["digest_algorithm"], row["digest_hex"], row["sha256_hex"]) == ("sha256", want, want)
    assert row["verified"] is None  # computed, but nothing records it: not "verified"


def test_seal_writes_sha256_sidecars_that_verify(tmp_path):
    from ckptaudit.publish import seal

    run = _run(tmp_path / "run", steps=(100,))
    (out,) = seal(run)
    assert out.action == "sealed", out.reason
    side = (run / "ckpt_000100.pt.sha256").read_text().split()[0]
    assert side == hashlib.sha256((run / "ckpt_000100.pt").read_bytes()).hexdigest()
    man = json.loads((run / "ckpt_000100.pt.manifest.json").read_text())
    assert man["files"][0]["sha256_hex"] == side


def _audit(run: Path, out: Path) -> dict:
    return audit_in_process(run, None, out_dir=out)


def _unit(v: dict, name: str) -> dict:
    return next(u for u in v["units"] if u["unit"] == name)


def _kinds(u: dict) -> list:
    return sorted(f["kind"] for f in u["findings"] if f["severity"] == "error")


def test_verdict_and_report_name_each_digests_algorithm(tmp_path):
    run = _run(tmp_path / "run")
    want = _seal_with_sidecar(run / "ckpt_000100.pt")
    out = tmp_path / "audit"
    v = _audit(run, out)
    assert v["bytes_verified"]["digest_algorithms"] == {"blake3": 1, "sha256": 1}
    assert _unit(v, "ckpt_000100.pt")["digests"] == [
        {"file": "ckpt_000100.pt", "digest_algorithm": "sha256", "digest_hex": want}]
    assert _unit(v, "ckpt_000200.pt")["digests"] == [
        {"file": "ckpt_000200.pt", "digest_algorithm": "blake3",
         "digest_hex": blake3.blake3((run / "ckpt_000200.pt").read_bytes()).hexdigest()}]
    assert json.loads((out / "verdict.json").read_text())["units"] == v["units"]
    html = (out / "report.html").read_text()
    assert f"<code>{want[:16]}…</code> (SHA-256)" in html and "(BLAKE3)" in html


def _safetensors_run(d: Path) -> Path:
    """A safetensors unit: no CRC covers its tensor bytes, so only a digest can see them change."""
    import torch
    from safetensors.torch import save_file

    d.mkdir()
    save_file({"w": torch.randn(128, 128)}, str(d / "model_000100.safetensors"))
    return d


@pytest.mark.parametrize("sidecar", [False, True], ids=["no-sidecar", "sidecar"])
def test_the_next_audit_catches_a_flipped_byte_with_size_and_mtime_kept(tmp_path, sidecar):
    run = _safetensors_run(tmp_path / "run")
    p = run / "model_000100.safetensors"
    if sidecar:
        _seal_with_sidecar(p)
    out = tmp_path / "audit"
    first = _audit(run, out)
    (u,) = first["units"]
    assert _kinds(u) == [] and u["digests"][0]["digest_algorithm"] == ("sha256" if sidecar else "blake3")

    _flip_keeping_times(p, p.stat().st_size - 100)  # inside the tensor data
    v = _audit(run, out)
    (u,) = v["units"]
    assert u["usable_for"] == "none"
    # with a sidecar its SHA-256 says it; without, the previous audit's BLAKE3 does (one finding, not both)
    assert _kinds(u) == (["checksum_mismatch"] if sidecar else ["digest_changed_since_last_audit"])
    if not sidecar:
        f = next(f for f in u["findings"] if f["kind"] == "digest_changed_since_last_audit")
        assert f["detail"]["expected"] == first["units"][0]["digests"][0]["digest_hex"]
        assert f["detail"]["actual"] == blake3.blake3(p.read_bytes()).hexdigest()
        assert f["detail"]["algorithm"] == "BLAKE3"
        assert f["detail"]["last_hashed_utc"] == first["units"][0]["last_hashed_utc"]
        # the audit after keeps comparing with the bytes as they were, not with the damaged ones
        (u3,) = _audit(run, out)["units"]
        assert _kinds(u3) == ["digest_changed_since_last_audit"]
        f3 = next(f for f in u3["findings"] if f["kind"] == "digest_changed_since_last_audit")
        assert f3["detail"]["expected"] == f["detail"]["expected"]
        assert f3["detail"]["last_hashed_utc"] == f["detail"]["last_hashed_utc"]


def test_the_previous_digest_comes_from_the_ledger_else_from_the_report_table(tmp_path):
    """Each hash job compares with its units' rows in its part's ledger fragment (``work/verified/<part>.json``),
    not the report's whole table; a unit the ledger does not know (no fragment: the first audit since, or a unit
    packed into another part) is compared with ``tables/hash.parquet`` as before."""
    from ckptaudit.verification import ledger

    run = _safetensors_run(tmp_path / "run")
    p = run / "model_000100.safetensors"
    out = tmp_path / "audit"
    first = _audit(run, out)
    fragments = sorted((out / "work" / ledger.FRAGMENTS).glob("*.json"))
    assert len(fragments) == 1
    rows = json.loads(fragments[0].read_text())["units"]["model_000100.safetensors"]["rows"]
    assert rows[0]["digest_hex"] == first["units"][0]["digests"][0]["digest_hex"]

    _flip_keeping_times(p, p.stat().st_size - 100)
    (out / "tables" / "hash.parquet").unlink()  # the ledger alone says what the digest was
    (u,) = _audit(run, out)["units"]
    assert _kinds(u) == ["digest_changed_since_last_audit"]

    shutil.rmtree(out / "work" / ledger.FRAGMENTS)  # the report's table alone says it (the second audit's)
    (u,) = _audit(run, out)["units"]
    assert _kinds(u) == ["digest_changed_since_last_audit"]
    f = next(f for f in u["findings"] if f["kind"] == "digest_changed_since_last_audit")
    assert f["detail"]["expected"] == first["units"][0]["digests"][0]["digest_hex"]


def test_a_file_written_again_is_no_bit_rot(tmp_path):
    """A new mtime (or size) is a write: the digest is recorded afresh, nothing is compared."""
    run = _safetensors_run(tmp_path / "run")
    p = run / "model_000100.safetensors"
    out = tmp_path / "audit"
    _audit(run, out)
    st = p.stat()
    _flip_keeping_times(p, st.st_size - 100)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    (u,) = _audit(run, out)["units"]
    assert _kinds(u) == []


def test_digests_of_different_algorithms_are_never_compared(tmp_path):
    """A sidecar added since the last audit: SHA-256 now against BLAKE3 then, no finding from the comparison."""
    from ckptaudit.verification import reverify

    row = {"file": "a.pt", "size_bytes": 10, "mtime_ns": 5, "digest_algorithm": "sha256", "digest_hex": "1" * 64}
    prev = {"size_bytes": 10, "mtime_ns": 5, "digest_algorithm": "blake3", "digest_hex": "2" * 64,
            "hashed_at_utc": "2026-12-05T00:00:00+00:00"}
    assert reverify.changed_since_last_audit(row, prev) is None
    f = reverify.changed_since_last_audit(row, {**prev, "digest_algorithm": "sha256"})
    assert f.kind == "digest_changed_since_last_audit" and f.severity == "error" and f.caps == "none"
    assert f.detail["algorithm"] == "SHA-256" and f.detail["expected"] == "2" * 64
    assert reverify.changed_since_last_audit(row, {**prev, "digest_algorithm": "sha256", "mtime_ns": 6}) is None
    assert reverify.changed_since_last_audit(row, {**prev, "digest_algorithm": "sha256", "digest_hex": "1" * 64}) \
        is None
