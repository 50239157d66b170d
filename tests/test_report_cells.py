"""The units × layers cells of report.html: findings, ok, or 'not checked' with the reason, never blank."""

from __future__ import annotations

from ckptaudit.outputs import report_cells as T


def _unit(name, step, usable, findings):
    return {"unit": name, "step": step, "layout": "torch-zip", "usable_for": usable, "findings": findings}


def _f(kind, layer, caps, severity="error"):
    return {"kind": kind, "layer": layer, "severity": severity, "caps": caps}


def test_cells_say_not_checked_and_why():
    evil = _unit("a.pt", 1, "none", [_f("malicious_pickle_code_exec", "security", "none")])
    cut = _unit("b.pt", 2, "none", [_f("truncated_zip_no_central_directory", "file", "none")])
    good = _unit("c.pt", 3, "resume", [])
    v = {"units": [evil, cut, good]}
    tables = {
        "hash": [{"unit": u} for u in ("a.pt", "b.pt", "c.pt")],
        "scan": [{"unit": "a.pt", "security_ok": False}, {"unit": "b.pt", "security_ok": True},
                 {"unit": "c.pt", "security_ok": True}],
        "structure": [{"unit": "a.pt", "weights_component": None}, {"unit": "b.pt", "weights_component": None},
                      {"unit": "c.pt", "weights_component": "root:model"}],
        "state": [{"unit": "a.pt", "has_weights": None}, {"unit": "b.pt", "has_weights": None},
                  {"unit": "c.pt", "has_weights": True}],
    }
    cells = T.layer_cells(v, tables, ("file", "structure", "state", "security"))
    words = {u: {layer: (c["status"], c["why"]) for layer, c in by.items()} for u, by in cells.items()}
    assert words["a.pt"] == {"file": ("ok", ""), "structure": ("not-checked", "not loaded: security findings"),
                             "state": ("not-checked", "not loaded: security findings"), "security": ("error", "")}
    assert words["b.pt"] == {"file": ("error", ""), "structure": ("not-checked", "not loaded: file errors"),
                             "state": ("not-checked", "not loaded: file errors"), "security": ("ok", "")}
    assert {layer: s for layer, (s, _) in words["c.pt"].items()} == dict.fromkeys(words["c.pt"], "ok")


def test_no_weights_is_the_reason():
    """A unit whose tree holds no weights: its structure layer was not checked for that reason."""
    u = _unit("d.pt", 4, "none", [_f("missing_model_weights", "state", "none")])
    tables = {"hash": [{"unit": "d.pt"}], "scan": [{"unit": "d.pt", "security_ok": True}],
              "structure": [{"unit": "d.pt", "weights_component": None}],
              "state": [{"unit": "d.pt", "has_weights": False}]}
    cells = T.layer_cells({"units": [u]}, tables, ("file", "structure", "state", "security"))["d.pt"]
    assert (cells["structure"]["status"], cells["structure"]["why"]) == ("not-checked", "no model weights found")
    assert cells["state"]["status"] == "error" and cells["file"]["status"] == "ok"


def test_stage_costs_leave_out_the_demo_training(tmp_path):
    """The demo rule trains the run the audit reads: not a cost of the audit (issue 28)."""
    from ckptaudit.stages.report import stage_costs

    for stage, secs in (("demo", "61.5"), ("hash", "1.25"), ("scan", "0.5"), ("structure", "0.25"),
                        ("target", "0.5")):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / f"{stage}.tsv").write_text(f"s\th:m:s\tmax_rss\n{secs}\t0:00:01\t120.5\n")
    # the target rule (the resuming job's layout, for the structure stage) counts in structure, as the README
    # lists stages
    assert [(c["stage"], c["seconds"], c["jobs"]) for c in stage_costs(str(tmp_path))] == [
        ("hash", 1.25, 1), ("scan", 0.5, 1), ("structure", 0.75, 2)]


def test_stage_costs_take_a_forked_jobs_memory_from_the_job_server(tmp_path):
    """A job run in the stage job server: its benchmark file measured the process that waited (12 MiB); the
    report's cost table takes the forked child's peak RSS from ``work/stage_jobs.jsonl`` (issue 45)."""
    import json

    from ckptaudit.stages.jobs.costs import JOBS_NAME
    from ckptaudit.stages.report import stage_costs

    bench, work = tmp_path / "benchmarks", tmp_path / "work"
    (bench / "hash").mkdir(parents=True)
    work.mkdir()
    for part in ("p0000", "p0001"):
        (bench / "hash" / f"{part}.tsv").write_text("s\th:m:s\tmax_rss\n1.5\t0:00:01\t12.0\n")
    (bench / "target.tsv").write_text("s\th:m:s\tmax_rss\n0.5\t0:00:01\t11.0\n")
    (work / JOBS_NAME).write_text("\n".join(json.dumps(d) for d in (
        {"stage": "hash", "part": "p0000", "status": 0, "wall_s": 1.4, "cpu_s": 1.2, "max_rss_mib": 96.4},
        {"stage": "hash", "part": "p0001", "status": 0, "wall_s": 1.4, "cpu_s": 1.2, "max_rss_mib": 131.0},
        {"stage": "target", "part": "", "status": 0, "wall_s": 0.1, "cpu_s": 0.1, "max_rss_mib": 40.2})) + "\n")
    got = {c["stage"]: (c["jobs"], c["seconds"], c["max_rss"]) for c in stage_costs(str(bench), str(work))}
    assert got == {"hash": (2, 3.0, "131 MiB"), "structure": (1, 0.5, "40 MiB")}
    assert {c["stage"]: c["max_rss"] for c in stage_costs(str(bench))} == {"hash": "12 MiB", "structure": "11 MiB"}
