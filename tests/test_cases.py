"""Every folder in ../shared/cases is audited as a run and must meet its expected.json.

New cases need no code: a folder with an expected.json is picked up.
"""

import json

import pytest

from ckptaudit.pipeline import audit_in_process

from .conftest import CASES, PAYLOAD, REPO, tree_digest

LOCAL_CASES = REPO / "tests" / "cases"  # cases this project added (tests/frameworks/make_cases.py)
CASE_DIRS = sorted(p for root in (CASES, LOCAL_CASES) if root.exists() for p in root.iterdir()
                   if (p / "expected.json").exists())
USE = {"full": "resume", "weights_only": "warm-start", "none": "none"}


def case_config(exp: dict) -> dict:
    """The audit config a user would write for the job described by the case."""
    cfg = {}
    if exp.get("model_config"):
        cfg["expected_model_args"] = exp["model_config"]
    probe = exp.get("probe") or {}
    target = {}
    if "resume_world_size" in probe:
        target["world_size"] = probe["resume_world_size"]
    if "resume_zero_stage" in probe:
        target["zero_stage"] = probe["resume_zero_stage"]
    if target:
        cfg["target"] = target
    return cfg


def test_cases_are_present():
    assert sum(p.parent == CASES for p in CASE_DIRS) >= 40, f"expected the handed cases in {CASES}"
    assert sum(p.parent == LOCAL_CASES for p in CASE_DIRS) >= 10, f"expected this project's cases in {LOCAL_CASES}"


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])  # handed and local, one test
def test_case(case, tmp_path):
    exp = json.loads((case / "expected.json").read_text())
    before = tree_digest(case)
    v = audit_in_process(case, case_config(exp), out_dir=tmp_path / "out")
    assert tree_digest(case) == before, "the audit changed the audited folder"
    assert not (case / PAYLOAD).exists()
    kind, quality = exp["expected_error_kind"], exp["rollback_quality"]
    if kind == "ok":
        errors = [(u["unit"], f["kind"]) for u in v["units"] for f in u["findings"] if f["severity"] == "error"]
        assert errors == [], f"baseline {case.name} has error findings"
        assert v["units"], "no unit found"
        assert {u["usable_for"] for u in v["units"]} == {USE[quality]}
    else:
        carriers = [u for u in v["units"] if any(f["kind"] == kind for f in u["findings"])]
        pointer_kinds = [p["kind"] for p in v["pointers"]]
        assert carriers or kind in pointer_kinds, (
            f"{kind} not reported; units: {[(u['unit'], [f['kind'] for f in u['findings']]) for u in v['units']]}, "
            f"pointers: {pointer_kinds}")
        for u in carriers:
            f = next(f for f in u["findings"] if f["kind"] == kind)
            assert f["layer"] == exp["layer"], f"{kind} reported on layer {f['layer']}, expected {exp['layer']}"
            assert f["message"] and f["next_step"]
            if quality == "repairable":
                assert f["repair"], f"{kind} must carry the exact repair"
                assert u["usable_for"] != "none"
            else:
                assert u["usable_for"] == USE[quality], f"{u['unit']} usable_for {u['usable_for']}"
    if "rollback_candidate" in exp:
        assert v["rollback"] is not None and v["rollback"]["unit"] == exp["rollback_candidate"]
