"""verdict.json's JSON Schema (ckptaudit/schemas/verdict.schema.json): a valid Draft 2020-12 schema that the
demo's verdict matches, and that says what is wrong with a broken one.  (Every verdict the suite writes is also
checked: tests/conftest.py sets CKPTAUDIT_CHECK_VERDICT_SCHEMA, and the report job then validates.)"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from ckptaudit.schemas import check_verdict, verdict_problems, verdict_schema


def test_schema_is_valid_and_the_demo_verdict_matches(demo_run, tmp_path):
    from ckptaudit.pipeline import audit_in_process

    jsonschema.Draft202012Validator.check_schema(verdict_schema())
    v = audit_in_process(demo_run.run_dir, out_dir=tmp_path / "out")
    written = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert verdict_problems(written) == [] and written["schema"] == verdict_schema()["properties"]["schema"]["const"]
    broken = copy.deepcopy(written)
    broken["recommendation"] = "maybe"
    broken["units"][0]["findings"].append({"kind": "x", "layer": "bytes", "severity": "error", "caps": "none",
                                           "message": "", "next_step": ""})
    problems = verdict_problems(broken)
    assert any(p.startswith("/recommendation:") for p in problems)
    assert any(p.startswith("/units/0/findings/") and "'bytes'" in p for p in problems)
    with pytest.raises(ValueError, match="does not match"):
        check_verdict(broken)
    assert v["recommendation"] == written["recommendation"]


def test_drill_schema_is_valid_and_names_what_a_broken_drill_json_lacks(tmp_path):
    """drill.json of a real drill (here one that finds nothing restorable: no child, fast) matches
    ckptaudit/schemas/drill.schema.json; the drill itself refuses to write one that does not (env set)."""
    from ckptaudit import drill as dr
    from ckptaudit.schemas import check_drill, drill_problems, schema

    jsonschema.Draft202012Validator.check_schema(schema("drill"))
    run = tmp_path / "run"
    run.mkdir()
    v = {"schema": "ckptaudit.verdict/1", "run_dir": str(run), "recommendation": "retrain", "rollback": None,
         "units": [], "reasons": ["nothing usable"]}
    rows, code = dr.run_drill(run, tmp_path / "drill", {}, verdict=v)
    assert code == dr.EXIT_NO_UNIT
    doc = json.loads((tmp_path / "drill" / "drill.json").read_text())
    assert drill_problems(doc) == [] and doc["schema"] == "ckptaudit.drill/1" and doc["result"] == "NO RESTORABLE UNIT"
    broken = copy.deepcopy(doc)
    broken["rows"][0]["status"] = "ok"
    del broken["summary"]
    found = drill_problems(broken)
    assert any(p.startswith("/rows/0/status:") for p in found) and any("'summary' is a required" in p for p in found)
    with pytest.raises(ValueError, match="drill.json does not match"):
        check_drill(broken)
