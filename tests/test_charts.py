"""Chart models of ckptaudit.charts: which marks a run's units produce (gaps, late writes, missing values)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ckptaudit.charts import svg, timeline, values


def _classes(chart, cls):
    return [m for m in chart["marks"] if m["attrs"].get("class") == cls]


def test_timeline_marks_irregular_gap_rollback_and_late_write():
    units = [{"unit": f"u{s}", "step": s, "usable_for": u} for s, u in
             ((100, "resume"), (200, "resume"), (300, "warm-start"), (900, "none"))]
    units.append({"unit": "nostep", "step": None, "usable_for": "none"})
    s = 10**9
    mtimes = {"u100": 1 * s, "u200": 2 * s, "u300": 9 * s, "u900": 4 * s}  # u300 rewritten after u900 was written
    c = timeline.build(units, mtimes, {"unit": "u200", "step": 200})
    assert [m["attrs"]["data-unit"] for m in c["marks"] if "unit-mark" in m["attrs"].get("class", "")] == [
        "u100", "u200", "u300", "u900"]
    assert [m["title"] for m in _classes(c, "gap gap-irregular")] == ["600 steps between step 300 and step 900"]
    assert len(_classes(c, "gap")) == 2
    assert [m["text"] for m in _classes(c, "gap-label")] == ["gap: 600 steps"]
    assert len(_classes(c, "rollback-marker")) == 1
    assert [m["title"] for m in _classes(c, "late-write")] == ["u300 was modified after u900 (step 900) was written"]
    assert "Not drawn (no step): nostep." in c["caption"]
    assert timeline.late_writes(units, mtimes) == {"u300": {"unit": "u900", "step": 900, "seconds": 5.0}}



def _late_writes_by_definition(units, mtimes):
    """For each unit, the last unit after it in step order with a higher step and an earlier write time."""
    known = sorted((u for u in units if u.get("step") is not None and mtimes.get(u["unit"])), key=lambda u: u["step"])
    out = {}
    for i, u in enumerate(known):
        later = [v for v in known[i + 1:] if v["step"] > u["step"] and mtimes[v["unit"]] < mtimes[u["unit"]]]
        if later:
            out[u["unit"]] = {"unit": later[-1]["unit"], "step": later[-1]["step"],
                              "seconds": (mtimes[u["unit"]] - mtimes[later[-1]["unit"]]) / 1e9}
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 12)), st.integers(0, 9)), max_size=30))
def test_late_writes_are_those_of_the_definition(rows):
    """The bisection over suffix minima finds, for every unit, what the scan of every later unit finds (equal
    steps, equal write times, units without a step or a write time among them)."""
    units = [{"unit": f"u{i}", "step": step} for i, (step, _) in enumerate(rows)]
    mtimes = {f"u{i}": m * 10**9 for i, (_, m) in enumerate(rows)}  # 0: no write time known
    assert timeline.late_writes(units, mtimes) == _late_writes_by_definition(units, mtimes)

def test_values_skip_non_finite_and_say_why_missing():
    units = [{"unit": "a", "step": 10}, {"unit": "b", "step": 20}, {"unit": "c", "step": 30}]
    rows = [{"unit": "a", "weight_norm": 3.0, "loss": 2.5, "best_metric": None},
            {"unit": "b", "weight_norm": 3.5, "loss": float("nan"), "best_metric": None},
            {"unit": "c", "weight_norm": None, "loss": None, "best_metric": None}]
    c = values.build(units, rows, {"c": "not loaded: file errors"})
    assert len(_classes(c, "value-point point-weight_norm")) == 2
    assert [m["title"] for m in _classes(c, "value-missing missing-loss")] == [
        "b: not recorded in this unit", "c: not loaded: file errors"]
    assert [m["text"] for m in _classes(c, "no-values")] == ["not recorded in this run's checkpoints"]
    assert values.build(units, [{"unit": "a"}], {}) is None


def test_ticks_are_round():
    assert svg.nice_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert svg.nice_ticks(0, 1, most=5) == [0, 0.5, 1.0]
    assert svg.nice_ticks(47.5, 302.5, outer=False, integer=True) == [50, 100, 150, 200, 250, 300]
    assert svg.tick_labels([0, 0.25, 0.5]) == ["0.00", "0.25", "0.50"]
    assert svg.value_label(250.0) == "250" and svg.value_label(0.000482) == "4.82e-4"


def test_tiny_weight_norm_change_has_distinct_ticks_and_says_how_small_it_is():
    """The HF run's norms 9.072378, 9.072326, 9.072304: both ticks used to read 9.072 over a steep-looking line."""
    units = [{"unit": f"checkpoint-{s}", "step": s} for s in (5, 10, 15)]
    rows = [{"unit": "checkpoint-5", "weight_norm": 9.072378}, {"unit": "checkpoint-10", "weight_norm": 9.072326},
            {"unit": "checkpoint-15", "weight_norm": 9.072304}]
    c = values.build(units, rows, {})
    ticks = [m["text"] for m in _classes(c, "tick") if m["attrs"].get("text-anchor") == "end"]
    assert ticks == ["9.07230", "9.07232", "9.07234", "9.07236", "9.07238"]
    assert [m["text"] for m in _classes(c, "value-spread")] == ["varies by 0.00082 % (9.072304 to 9.072378)"]
    assert svg.relative_spread(3.0, 3.5) is None  # a visible change gets no note
    assert svg.tick_labels([0, 100, 200]) == ["0", "100", "200"]
