"""The run recommendation from per-unit usability."""

from ckptaudit import verdict


def U(unit, step, use):
    return {"unit": unit, "step": step, "layout": "torch-zip", "usable_for": use, "findings": []}


def test_newest_resume_unit_is_the_rollback_point_with_warm_start_alternatives():
    v = verdict.decide("r", [U("a", 100, "resume"), U("b", 200, "resume"), U("c", 300, "warm-start"),
                             U("d", 400, "none")], [])
    assert v["recommendation"] == "resume"
    assert v["rollback"] == {"unit": "b", "step": 200}
    assert v["steps_lost"] == 200
    assert v["alternatives"] == [{"unit": "c", "step": 300, "usable_for": "warm-start", "steps_lost": 100}]
    assert verdict.exit_code(v) == 1


def test_newest_unit_resumable_is_exit_0():
    v = verdict.decide("r", [U("a", 100, "resume"), U("b", 200, "resume")], [])
    assert v["rollback"]["unit"] == "b" and v["steps_lost"] == 0
    assert verdict.exit_code(v) == 0


def test_warm_start_only():
    v = verdict.decide("r", [U("a", 100, "warm-start"), U("b", 200, "none")], [])
    assert v["recommendation"] == "warm-start"
    assert v["rollback"] == {"unit": "a", "step": 100}
    assert verdict.exit_code(v) == 1


def test_nothing_usable_is_retrain():
    v = verdict.decide("r", [U("a", 100, "none")], [])
    assert v["recommendation"] == "retrain" and v["rollback"] is None and v["steps_lost"] is None
    assert v["reasons"][0] == "Retrain: no checkpoint of this run has usable weights."
    assert verdict.exit_code(v) == 2
