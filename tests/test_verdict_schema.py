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
