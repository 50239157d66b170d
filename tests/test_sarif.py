"""``--sarif``: the findings as SARIF 2.1.0, valid against the OASIS schema (tests/sarif/), for CI viewers (issue 24)."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from ckptaudit.outputs import sarif
from ckptaudit.pipeline import audit_in_process

from .conftest import CASES

REPO = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((Path(__file__).parent / "sarif" / "sarif-schema-2.1.0.json").read_text())


def _valid(log: dict) -> None:
    jsonschema.Draft4Validator(SCHEMA).validate(log)


def test_sarif_of_the_demo_validates_and_keeps_every_finding(demo_run, tmp_path):
    v = audit_in_process(demo_run.run_dir, {}, out_dir=tmp_path / "out")
    log = sarif.from_verdict(v)
    _valid(log)
    (run,) = log["runs"]
    n = sum(len(u["findings"]) for u in v["units"]) + len([f for f in v["pointer_findings"] if f])
    assert len(run["results"]) == n > 0
    by_level = {r["level"] for r in run["results"]}
    assert "error" in by_level  # the demo's truncated and bit-flipped units
    cut = next(r for r in run["results"] if r["ruleId"] == "truncated_zip_no_central_directory")
    assert cut["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "ckpt_000300.pt",
                                                                          "uriBaseId": "RUNROOT"}
    assert run["originalUriBaseIds"]["RUNROOT"]["uri"] == Path(demo_run.run_dir).resolve().as_uri() + "/"
    assert [d["id"] for d in run["tool"]["driver"]["rules"]] == sorted({r["ruleId"] for r in run["results"]})


def test_sarif_of_a_malicious_case_through_the_cli(tmp_path):
    case = CASES / "security_malicious_reduce_zip"
    out = tmp_path / "log.sarif"
    p = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "audit", str(case), "--out", str(tmp_path / "a"),
                        "--sarif", str(out)], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode in (1, 2), p.stdout[-2000:] + p.stderr[-2000:]
    log = json.loads(out.read_text())
    _valid(log)
    (hit,) = [r for r in log["runs"][0]["results"] if r["ruleId"] == "malicious_pickle_code_exec"]
    assert hit["level"] == "error" and hit["properties"]["layer"] == "security"
    assert hit["properties"]["unit_usable_for"] == "none"
    rule = log["runs"][0]["tool"]["driver"]["rules"][hit["ruleIndex"]]
    assert rule["id"] == "malicious_pickle_code_exec" and rule["properties"]["detector"] == "ckptaudit.security:_scan_findings"


def test_a_pointers_finding_that_is_also_a_units_is_one_result(tmp_path):
    """``latest`` naming a cut unit: the verdict keeps its finding on the unit and in pointer_findings; SARIF
    listed it twice (a new user's trial).  A dead writer's leftover, a run finding, is located at the run root."""
    import torch

    from ckptaudit import publish as P

    run = tmp_path / "run"
    for step in (10, 20):
        P.save({"w": torch.full((256, 256), float(step))}, run, step)
    raw = (run / "ckpt_000020.pt").read_bytes()
    (run / "ckpt_000020.pt").write_bytes(raw[: len(raw) // 2])
    (run / f"{P.names.TMP_PREFIX}{P.names.host_tag()}-999999-00000000-ckpt_000030.pt").write_bytes(b"PK\x03\x04")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    kinds = [f["kind"] for f in v["pointer_findings"] if f]
    assert kinds == ["latest_pointer_incomplete"]
    log = sarif.from_verdict(v)
    _valid(log)
    results = log["runs"][0]["results"]
    assert [r["ruleId"] for r in results].count("latest_pointer_incomplete") == 1
    (left,) = [r for r in results if r["ruleId"] == "dead_writer_leftovers"]
    assert left["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "."
