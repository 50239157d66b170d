"""``--junit PATH``: the demo audit as JUnit XML that the Jenkins xUnit plugin's junit-10.xsd accepts, one test
case per unit whose failure text is the finding and its next step; a failed audit is an error case."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

from ckptaudit.outputs import junit

from .junit_schema import junit_schema

CLI = [sys.executable, "-m", "ckptaudit.cli"]


def _cases(path) -> dict:
    root = ET.parse(path).getroot()
    return {c.get("name"): c for c in root.iter("testcase")}


def test_junit_of_the_demo_audit_validates_and_says_each_finding(demo_run, tmp_path):
    xml = tmp_path / "ci" / "ckptaudit.xml"
    xml.parent.mkdir()
    p = subprocess.run(CLI + ["audit", str(demo_run.run_dir), "--out", str(tmp_path / "out"), "--junit", str(xml)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr  # the demo's newest unit is cut short: roll back
    junit_schema().validate(str(xml))
    v = json.loads((tmp_path / "out" / "verdict.json").read_text())
    cases = _cases(xml)
    names = [f"{u['unit']} (step {u['step']})" for u in v["units"]]
    assert list(cases) == ["verdict"] + names  # one case per unit, in save order
    bad = [f"{u['unit']} (step {u['step']})" for u in v["units"] if u["usable_for"] != "resume"]
    assert sorted(junit.failures(xml)) == sorted(["verdict"] + bad) and len(bad) == 2
    for u in v["units"]:
        fail = cases[f"{u['unit']} (step {u['step']})"].find("failure")
        if u["usable_for"] == "resume":
            assert fail is None
            continue
        for f in u["findings"]:
            if f["severity"] == "error":
                assert " ".join(f["message"].split()) in fail.text and f["next_step"] in fail.text
        assert fail.get("type") in {f["kind"] for f in u["findings"]}
        assert f"(paths are relative to {v['run_dir']})" in fail.text
        for f in u["findings"]:
            if f.get("repair") and f["severity"] == "error":
                assert f"  repair (run in {v['run_dir']}): {f['repair']}" in fail.text
    verdict_fail = cases["verdict"].find("failure")
    assert verdict_fail.get("type") == "exit 1"
    assert verdict_fail.get("message").startswith(f"RESUME from {v['rollback']['unit']} (step {v['rollback']['step']})")
    root = ET.parse(xml).getroot()
    suite = root.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props == {"run_dir": v["run_dir"], "recommendation": "resume", "rollback_unit": v["rollback"]["unit"],
                     "rollback_step": str(v["rollback"]["step"]), "steps_at_risk": str(v["steps_lost"])}
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == (str(len(names) + 1), "3", "0")
    assert float(suite.get("time")) > 0

    bad_cfg = tmp_path / "bad.yaml"
    bad_cfg.write_text("laod: {enabled: false}\n")  # a config error: the audit itself fails (exit 3)
    xml = tmp_path / "o2" / "first-night" / "ckptaudit.xml"  # its folder does not exist yet: it is made
    p = subprocess.run(CLI + ["audit", str(demo_run.run_dir), "--out", str(tmp_path / "o2"), "--config",
                              str(bad_cfg), "--junit", str(xml)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, p.stderr
    junit_schema().validate(str(xml))
    err = _cases(xml)["verdict"].find("error")
    assert err.get("type") == "exit 3" and "failed (exit 3)" in err.get("message")


def test_names_from_the_run_cannot_break_the_xml_or_the_log(tmp_path):
    """A unit name with an escape sequence, a NUL and a line break (legal in POSIX file names) becomes
    visible escapes: the XML stays valid and a CI log shows no control character."""
    v = {"run_dir": "/runs/a", "recommendation": "resume", "rollback": {"unit": "ok.pt", "step": 10},
         "newest": {"unit": "ok.pt", "step": 10}, "steps_lost": 0, "reasons": [], "resume_entries": [],
         "units": [{"unit": "ok.pt", "step": 10, "usable_for": "resume", "findings": []},
                   {"unit": "x\x1b]0;pwned\x07\x00\nckptaudit: RESUME.pt", "step": None, "usable_for": "none",
                    "findings": [{"kind": "load_failed", "layer": "file", "severity": "error", "caps": "none",
                                  "message": "bad\x1b[2J", "next_step": "roll back"}]},
                   {"unit": ".ckpt_000020.pt.tmp", "step": 20, "usable_for": "none",
                    "findings": [{"kind": junit.IN_PROGRESS, "layer": "file", "severity": "info", "caps": "none",
                                  "message": "a save in progress (temp name)", "next_step": "wait"}]}]}
    xml = tmp_path / "j.xml"
    junit.write(xml, copy.deepcopy(v), audit_seconds=1.5)
    junit_schema().validate(str(xml))
    text = xml.read_text()
    assert "\x1b" not in text and "\x00" not in text and "\x07" not in text
    cases = _cases(xml)
    assert "x\\x1b]0;pwned\\x07\\x00\\nckptaudit: RESUME.pt (step unknown)" in cases
    assert cases[".ckpt_000020.pt.tmp (step 20)"].find("skipped") is not None  # nobody's rollback point yet
    assert junit.failures(xml) == ["x\\x1b]0;pwned\\x07\\x00\\nckptaudit: RESUME.pt (step unknown)"]


def test_a_failed_infrastructure_check_of_the_drill_is_an_error_not_a_failure():
    """The drill's CLI hands junit its INFRA_CHECKS (outputs/ does not import the drill): a failed check named
    there is an ``error`` (the drill could not run), any other failed check a ``failure``."""
    from ckptaudit.drill.contract import INFRA_CHECKS

    doc = {"rows": [{"check": "eligibility", "status": "fail", "device": "cpu", "message": "no unit"},
                    {"check": "loss_matches", "status": "fail", "device": "cpu", "message": "loss 3.1 != 2.9"}],
           "wall_seconds": 1.0}
    suite = junit.document(None, drill=doc, infra_checks=INFRA_CHECKS).getroot().find("testsuite[@name='drill']")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert cases["eligibility"].find("error").get("message") == "no unit"
    assert cases["eligibility"].find("failure") is None
    assert cases["loss_matches"].find("failure").get("message") == "loss 3.1 != 2.9"
    assert (suite.get("errors"), suite.get("failures")) == ("1", "1")
    plain = junit.document(None, drill=doc).getroot().find("testsuite[@name='drill']")
    assert (plain.get("errors"), plain.get("failures")) == ("0", "2")  # no infra checks named: all failures
