"""Issue 28: charts whose values can be read off the page and whose reasons are printed, not only in tooltips.

Every value axis has 3 to 7 round ticks (1, 2 or 5 × 10^k apart) with labels that tell neighbours apart,
flat and single-point series included; the step axis too.  A unit's reason (why it is unusable, why a
value is missing, an LR off the schedule) is printed under its chart and pointed to by a number by its
mark; no "hover" is left in the rendered pages, which stay one file with no script or external asset.
"""

from __future__ import annotations

import re
from html import unescape

from ckptaudit.charts import cost, drill, svg, timeline, values


def _classes(chart, cls):
    return [m for m in chart["marks"] if m["attrs"].get("class") == cls]


def _y_ticks(chart):
    return [m["text"] for m in _classes(chart, "tick") if m["attrs"].get("text-anchor") == "end"]


def _x_ticks(chart):
    return [m["text"] for m in _classes(chart, "tick") if m["attrs"].get("text-anchor") == "middle"]


def _lr_trace(lrs, schedule=None):
    return {"device": "cpu", "trace": [{"step": 250 + i, "loss": 2.0 - 0.01 * i, "lr": [v],
                                        "lr_schedule": [schedule[i]] if schedule else None}
                                       for i, v in enumerate(lrs)]}


def test_tick_values_are_round_and_span_the_data():
    assert svg.nice_ticks(1.25e-4, 1e-3) == [0, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3]  # no 6.000000000000001e-4
    assert svg.nice_ticks(2.2, 2.9, most=5) == [2.2, 2.4, 2.6, 2.8, 3.0]
    assert svg.nice_ticks(0, 4.25) == [0, 1, 2, 3, 4, 5]
    assert svg.nice_ticks(12000, 47000) == [10000, 20000, 30000, 40000, 50000]
    # equal values: 10 % of their size around them (one unit around 0), never a single tick
    assert svg.nice_ticks(5.0, 5.0, most=5) == [4.5, 5.0, 5.5]
    assert svg.nice_ticks(0.0, 0.0) == [-1.0, -0.5, 0.0, 0.5, 1.0]
    assert svg.tick_labels(svg.nice_ticks(1.25e-4, 1.25e-4)) == [
        "1.1e-4", "1.15e-4", "1.2e-4", "1.25e-4", "1.3e-4", "1.35e-4", "1.4e-4"]
    # whole training steps: one step or two still get three ticks
    assert [svg.step_ticks(svg.step_scale(s)) for s in ([100], [0], [250, 251])] == [
        [96, 98, 100, 102, 104], [-1, 0, 1], [249, 250, 251, 252]]
    assert svg.tick_labels(svg.step_ticks(svg.step_scale([1000, 120000]))) == [
        "0", "20 k", "40 k", "60 k", "80 k", "100 k", "120 k"]


def test_tick_labels_are_compact_and_distinct():
    assert svg.tick_labels([1.25e-4, 2.5e-4, 5e-4]) == ["1.25e-4", "2.5e-4", "5e-4"]
    assert svg.tick_labels([0, 2e-4, 4e-4]) == ["0", "2e-4", "4e-4"]
    assert svg.tick_labels([0, 0.25, 0.5]) == ["0.00", "0.25", "0.50"]
    assert svg.tick_labels([10000, 12000, 14000]) == ["10 k", "12 k", "14 k"]
    assert svg.tick_labels([0, 1.5e6, 3e6]) == ["0", "1.5 M", "3.0 M"]
    assert svg.tick_labels([2e15, 4e15]) == ["2e15", "4e15"]
    gib = 1024 ** 3
    assert svg.tick_labels(svg.byte_ticks(0, 1.5 * gib), "bytes") == ["0.0 GiB", "0.5 GiB", "1.0 GiB", "1.5 GiB"]
    assert svg.tick_labels(svg.byte_ticks(0, 1020 * 1024 ** 2), "bytes") == [
        "0 MiB", "200 MiB", "400 MiB", "600 MiB", "800 MiB", "1000 MiB", "1200 MiB"]
    assert svg.tick_labels(svg.byte_ticks(3 * gib, 3 * gib), "bytes") == [
        "2.7 GiB", "2.8 GiB", "2.9 GiB", "3.0 GiB", "3.1 GiB", "3.2 GiB", "3.3 GiB"]
    for lo, hi in ((1.25e-4, 1e-3), (9.072304, 9.072378), (0, 3e9), (7, 7), (-3, 2)):
        labels = svg.tick_labels(svg.nice_ticks(lo, hi))
        assert 3 <= len(labels) <= 7 and len(set(labels)) == len(labels), (lo, hi, labels)


def test_drill_lr_axis_reads_the_halving_rates():
    lrs = [1e-3, 5e-4, 2.5e-4, 1.25e-4]
    c = drill.build(_lr_trace(lrs))
    ticks = _y_ticks(c)
    assert ticks[-6:] == ["0", "2e-4", "4e-4", "6e-4", "8e-4", "1e-3"]  # the LR panel, after the loss panel's
    assert _x_ticks(c) == ["249", "250", "251", "252", "253", "254"]
    assert c["notes"] == [] and "hover" not in c["caption"]


def test_drill_prints_the_rates_off_the_schedule():
    """A re-warm-up: the LR used is not the schedule's; the chart names the steps and both rates."""
    c = drill.build(_lr_trace([1e-4, 2e-4, 3e-4], [1.25e-4, 1.25e-4, 3e-4]))
    assert c["notes"] == [{"n": 1, "text": "LR off the schedule at 2 of 3 updates: after step 250 it used 1e-4 "
                                           "where the schedule gives 1.25e-4; after step 251 it used 2e-4 where "
                                           "the schedule gives 1.25e-4."}]
    assert [m["text"] for m in _classes(c, "off-schedule-note")] == ["[1]", "[1]"]
    assert "marked [1]" in c["caption"]


def test_flat_values_still_have_three_ticks():
    units = [{"unit": "a", "step": 10}, {"unit": "b", "step": 20}]
    rows = [{"unit": "a", "weight_norm": 4.0, "loss": 2.5}, {"unit": "b", "weight_norm": 4.0, "loss": 2.5}]
    c = values.build(units, rows, {})
    assert _y_ticks(c) == ["3.6", "3.8", "4.0", "4.2", "4.4", "2.2", "2.4", "2.6", "2.8"]
    one = values.build(units[:1], rows[:1], {})
    assert _y_ticks(one) == _y_ticks(c) and _x_ticks(one) == ["9", "10", "11"]


def test_missing_values_are_numbered_and_explained_in_print():
    units = [{"unit": "a", "step": 10}, {"unit": "b", "step": 20}, {"unit": "c", "step": 30}]
    rows = [{"unit": "a", "weight_norm": 3.0, "loss": 2.5}, {"unit": "b", "weight_norm": 3.5}]
    c = values.build(units, rows, {"c": "not loaded: file errors"})
    assert c["notes"] == [{"n": 1, "text": "No value — not recorded in this unit: b (step 20; loss)."},
                          {"n": 2, "text": "No value — not loaded: file errors: c (step 30)."}]
    assert [m["text"] for m in _classes(c, "missing-note")] == ["[2]", "[1]", "[2]"]  # norm of c; loss of b, c
    assert "hover" not in c["caption"] and "[n]" in c["caption"]


def test_timeline_prints_why_each_unit_is_not_usable_and_shapes_say_it_too():
    f = {"kind": "truncated_zip_no_central_directory", "layer": "file", "severity": "error", "caps": "none"}
    units = [{"unit": "u100", "step": 100, "usable_for": "resume", "findings": []},
             {"unit": "u200", "step": 200, "usable_for": "warm-start",
              "findings": [{"kind": "missing_optimizer_state", "layer": "state", "severity": "warning",
                            "caps": "warm-start"}]},
             {"unit": "u300", "step": 300, "usable_for": "none", "findings": [f]}]
    c = timeline.build(units, {}, {"unit": "u200", "step": 200}, "u300")
    assert [n["text"] for n in c["notes"]] == [
        "Optimizer state missing in u200 (step 200), so the run can only warm-start from it.",
        "u300 (step 300), the newest unit, is unusable: the file is cut short (the save did not finish)."]
    assert [m["text"] for m in _classes(c, "unit-note")] == ["[1]", "[2]"]
    assert [m["tag"] for m in c["marks"] if "unit-mark" in m["attrs"].get("class", "")] == [
        "circle", "polygon", "polygon"]  # circle, diamond, triangle: not colour alone
    assert [m["text"] for m in _classes(c, "unit-step")] == ["100", "200", "300"]
    assert _x_ticks(c) == ["100", "150", "200", "250", "300"]


def test_crowded_step_labels_are_left_out_not_overlapped():
    units = [{"unit": f"u{s}", "step": s, "usable_for": "resume"} for s in (5, 10, 15, 1000)]
    c = timeline.build(units, {}, None)
    assert [m["text"] for m in _classes(c, "unit-step")] == ["5", "1000"]
    assert [m["text"] for m in _classes(c, "tick")][-6:] == ["0", "200", "400", "600", "800", "1000"]


def test_cost_axis_is_round_and_bars_say_their_seconds():
    c = cost.build([{"stage": "hash", "seconds": 4.25}, {"stage": "scan", "seconds": 0.004}], {})
    assert _x_ticks(c) == ["0", "1", "2", "3", "4", "5"]
    assert [m["text"] for m in _classes(c, "cost-value")] == ["4.25 s", "0.004 s"]


def _printed(html: str) -> str:
    """The text a printed page shows: tooltips, tags and styles removed."""
    html = re.sub(r"<title>.*?</title>|<style>.*?</style>", "", html, flags=re.S)
    return unescape(re.sub(r"<[^>]+>", " ", html))


def test_rendered_report_and_drill_print_reasons_and_never_say_hover(demo_run, tmp_path):
    import json

    import pyarrow.parquet as pq

    from ckptaudit import drill as dr
    from ckptaudit.pipeline import audit_in_process

    v = audit_in_process(demo_run.run_dir, out_dir=tmp_path / "audit")
    html = (tmp_path / "audit" / "report.html").read_text()
    assert "hover" not in html.lower()
    assert "<script" not in html and "<link" not in html and "http://" not in html
    figures = " ".join(_printed(html[html.index('id="chart-timeline"'):html.index('id="chart-cost"')]).split())
    assert figures.count("[2] ckpt_000300.pt (step 300), the newest unit, is unusable: the file is cut short "
                         "(the save did not finish).") == 1
    assert f"[1] {demo_run.flipped} (step 150) is unusable: silent corruption of an older unit" in figures
    assert "[1] No value — not loaded: file errors: ckpt_000150.pt (step 150), ckpt_000300.pt (step 300)." in figures
    assert "modified 0." in figures and "s after ckpt_000300.pt was written" in figures  # the ring's label
    ticks = re.findall(r'class="tick"[^>]*>([^<]*)<', html)
    times = [t for t in ticks if t.startswith("+")]  # the write times depend on how fast the demo trained
    assert 3 <= len(times) <= 5 and all(re.fullmatch(r"\+\d+(\.\d+)? (s|min|h|d)", t) for t in times), times
    assert ticks[len(times):len(times) + 6] == ["50", "100", "150", "200", "250", "300"]

    rows, code = dr.run_drill(demo_run.run_dir, tmp_path / "drill", {"drill": {"devices": ["cpu"]}}, verdict=v)
    assert code == dr.EXIT_PASSED
    page = (tmp_path / "drill" / "drill.html").read_text()
    assert "hover" not in page.lower() and "<script" not in page and "<link" not in page
    assert 'class="chart-notes"' not in page  # the demo's LR continues its schedule: nothing to explain
    doc = json.loads((tmp_path / "drill" / "drill.json").read_text())
    trace = doc["devices"][0]["trace"]
    assert [e["step"] for e in trace] == [250, 251, 252, 253, 254]
    trace[0]["lr"] = [1e-4]  # as a re-warm-up would: the rate used is not the schedule's
    page = dr.render_html(doc, pq.read_table(tmp_path / "drill" / "drill.parquet").to_pylist())
    said = svg.value_label(trace[0]["lr_schedule"][0])
    assert f"LR off the schedule at 1 of 5 updates: after step 250 it used 1e-4 where the schedule gives {said}." \
        in _printed(page)
