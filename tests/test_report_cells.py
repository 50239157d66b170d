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
