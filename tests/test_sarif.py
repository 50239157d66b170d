"""``--sarif``: the findings as SARIF 2.1.0, valid against the OASIS schema (tests/sarif/), for CI viewers (issue 24)."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema

from ckptaudit import sarif
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
