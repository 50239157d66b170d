"""The headline box of report.html: the recommendation and one plain sentence per damaged unit."""

from __future__ import annotations

import re

from ckptaudit.outputs import report_headline as T


def _headline(html: str):
    box = html[html.index('class="headline"'):html.index("</ul>", html.index('class="headline"'))]
    return re.findall(r"<li>(.*?)</li>", box)


def test_warm_start_verdict_says_why(tmp_path):
    """A run whose every save lost its optimizer state: the verdict is warm-start, and the headline says why."""
    from ckptaudit import demo
    from ckptaudit.pipeline import audit_in_process

    def mutate(step, ckpt):
        del ckpt["optimizer"]
        return ckpt

    demo.train(tmp_path / "run", max_steps=20, save_every=10, mutate=mutate)
    v = audit_in_process(tmp_path / "run", out_dir=tmp_path / "out")
    assert v["recommendation"] == "warm-start"
    html = (tmp_path / "out" / "report.html").read_text()
    assert _headline(html) == [
        "Warm-start (weights only, fresh optimizer) from ckpt_000020.pt (step 20).",
        "Optimizer state missing in ckpt_000020.pt (step 20), so the run can only warm-start from it.",
        "Optimizer state missing in ckpt_000010.pt (step 10), so it is usable for warm-start only.",
    ]
    assert html.count('class="unit-mark usable-warm-start"') == 2
    assert "not checked" not in html  # every layer of both units was checked


def _unit(name, step, usable, findings):
    return {"unit": name, "step": step, "layout": "torch-zip", "usable_for": usable, "findings": findings}


def _f(kind, layer, caps, severity="error"):
    return {"kind": kind, "layer": layer, "severity": severity, "caps": caps}


def test_sentences_name_the_cause_without_bytes():
    newest = _unit("ckpt_000300.pt", 300, "none", [_f("truncated_zip_no_central_directory", "file", "none")])
    older = _unit("ckpt_000150.pt", 150, "none", [_f("zero_filled_span", "file", "none")])
    late = {"unit": "ckpt_000300.pt", "step": 300, "seconds": 4.0}
    assert T.unit_sentence(older, "ckpt_000300.pt", "ckpt_000250.pt", late) == (
        "ckpt_000150.pt (step 150) is unusable: silent corruption of an older unit — a span of its bytes is zeroed; "
        "it was modified after ckpt_000300.pt (step 300), a newer unit, was written.")
    assert T.unit_sentence(newest, "ckpt_000300.pt", "ckpt_000250.pt", None) == (
        "ckpt_000300.pt (step 300), the newest unit, is unusable: the file is cut short (the save did not finish).")
    evil = _unit("ckpt_000100.pt", 100, "none", [_f("malicious_pickle_code_exec", "security", "none")])
    assert T.unit_sentence(evil, "ckpt_000300.pt", None, None) == (
        "ckpt_000100.pt (step 100) is unusable: its pickle would run code when loaded.")
    odd = _unit("ckpt_000200.pt", 200, "none", [_f("some_new_kind", "file", "none")])
    assert T.unit_sentence(odd, "ckpt_000300.pt", None, None) == "ckpt_000200.pt (step 200) is unusable: some new kind."
    assert T.unit_sentence(_unit("ckpt_000250.pt", 250, "resume", []), "ckpt_000300.pt", None, None) is None


def test_nan_poisoning_repairs_and_pointers_are_said_in_words():
    nan = _unit("ckpt_000400.pt", 400, "none", [_f("nan_in_weights", "state", "none")])
    fix = _unit("ckpt_000300.pt", 300, "resume", [{**_f("step_counter_reset", "state", "resume", "warning"),
                                                   "repair": "ckpt['iter_num'] = 300"}])
    v = {"reasons": ["Resume from ckpt_000300.pt (step 300), losing 100 steps."], "units": [fix, nan],
         "newest": {"unit": "ckpt_000400.pt", "step": 400}, "rollback": {"unit": "ckpt_000300.pt", "step": 300},
         "pointers": [{"path": "latest", "target": "ckpt_000500.pt", "ok": False, "kind": "latest_pointer_dangling"}]}
    assert T.headline(v, {}) == [
        "Resume from ckpt_000300.pt (step 300), losing 100 steps.",
        "ckpt_000400.pt (step 400), the newest unit, is unusable: its weights hold NaN or Inf values.",
        "The first unit with NaN or Inf weights is ckpt_000400.pt (step 400); every later unit inherits the divergence.",
        "Before using ckpt_000300.pt, apply the repair printed under its findings.",
        "The pointer latest names ckpt_000500.pt, which does not exist.",
    ]
