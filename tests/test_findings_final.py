"""Findings are final at their detector: the verdict takes each unit's ``usable_for`` once and decides.

Guards against the verdict judging a unit, adding or stripping findings, and judging it again (four
``usable_for`` passes in ``verdict.build``), and against a detector appending to the unit it judges
(``pointer_to_unit_finding``, ``resume_entry.entry_findings`` did).  Two parts:

* counted on real runs: ``findings.usable_for`` runs once per verdict unit, and a unit's ``usable_for`` is the
  minimum of the caps of the findings verdict.json shows for it.  The one exception, honest: a file of an NVRx
  save is judged alone first, and a damaged file of another rank of its save (``save_spoiled_by_another_rank``)
  lowers it — a second call, on that finding alone (:func:`ckptaudit.verdict.build`);
* read from the source: no module outside :data:`DETECTORS` appends, extends, inserts into, or assigns to a
  ``findings`` list (``x.findings``, ``x["findings"]``, or a name bound to one).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from ckptaudit import findings as F
from ckptaudit import verdict
from ckptaudit.pipeline import audit_in_process

from .conftest import CASES, REPO, copy_producer_run
from .test_cases import case_config

PKG = REPO / "ckptaudit"
JUDGE = F.usable_for  # the real function, kept before the counter below wraps it

#: Case folders whose verdicts exercise every way a finding reaches a unit after the stages: a dangling pointer,
#: pointers naming a damaged unit (a text pointer, a symbolic link: the finding joins the unit), a damaged
#: resume entry, a run-level finding, and a plain damaged file.
RUNS = [CASES / "ds_latest_points_to_missing_tag", CASES / "megatron_mixed_step_shards",
        CASES / "state_step_reset", CASES / "trunc_zip_at_50pct",
        REPO / "tests" / "cases" / "fw_lightning_link_target_truncated",
        REPO / "tests" / "cases" / "fw_lightning_default_last_truncated",
        REPO / "tests" / "cases" / "fw_deepspeed_optim_partition_missing"]


@pytest.fixture
def counted(monkeypatch):
    """Each ``verdict.build`` of an audit, as ``(verdict, calls of findings.usable_for during that build)``."""
    builds = []
    calls = []
    real_usable_for, real_build = F.usable_for, verdict.build

    def usable_for(findings, start="resume"):
        calls.append(start)
        return real_usable_for(findings, start)

    def build(inv, tables, cfg):
        calls.clear()
        doc = real_build(inv, tables, cfg)
        builds.append((doc, len(calls)))
        return doc

    monkeypatch.setattr(F, "usable_for", usable_for)
    monkeypatch.setattr(verdict, "build", build)
    return builds


def _spoiled(doc: dict) -> int:
    return sum(f["kind"] == "save_spoiled_by_another_rank" for u in doc["units"] for f in u["findings"])


def _assert_judged_once(builds) -> None:
    assert builds, "the audit built no verdict"
    for doc, calls in builds:
        assert calls == len(doc["units"]) + _spoiled(doc), (calls, len(doc["units"]), _spoiled(doc))
        for u in doc["units"]:  # what verdict.json shows of a unit is what it was judged by
            assert JUDGE(u["findings"]) == u["usable_for"], u["unit"]


@pytest.mark.parametrize("run", RUNS, ids=[p.name for p in RUNS])
def test_usable_for_is_taken_once_per_unit(run, counted, tmp_path):
    if not run.exists():
        pytest.fail(f"case folder {run} is missing")
    exp = json.loads((run / "expected.json").read_text())
    doc = audit_in_process(run, case_config(exp), out_dir=tmp_path / "out")
    _assert_judged_once(counted)
    assert len(counted) == 1 and counted[0][0]["units"] == doc["units"]


def test_joined_pointer_and_entry_findings_leave_usable_for_as_it_was(counted, tmp_path):
    """The link names a cut unit (``symlink_target_unusable`` joins it), the entry run's ``last.ckpt`` is cut
    (``resume_entry_damaged`` joins it): both units were unusable by their own findings already."""
    for name, kind in (("fw_lightning_link_target_truncated", "symlink_target_unusable"),
                       ("fw_lightning_default_last_truncated", "resume_entry_damaged")):
        doc = audit_in_process(REPO / "tests" / "cases" / name, {}, out_dir=tmp_path / name)
        [u] = [u for u in doc["units"] if any(f["kind"] == kind for f in u["findings"])]
        own = [f for f in u["findings"] if f["kind"] != kind]
        assert u["usable_for"] == JUDGE(own) == "none"
        assert u["findings"][-1]["kind"] == kind  # joined after the unit's own findings
    _assert_judged_once(counted)


def test_pointer_and_entry_detectors_leave_the_units_they_judge_unchanged(monkeypatch, tmp_path):
    """``pointer_judgements.judge`` and ``resume_entry.entry_findings`` read the judged units and return their
    findings; the units (findings lists included) are equal after the call to a copy taken before it."""
    import copy

    from ckptaudit import pointer_judgements, resume_entry

    seen = []

    def unchanged(fn, units_at):
        def wrapper(*args):
            before = copy.deepcopy(args[units_at])
            out = fn(*args)
            assert args[units_at] == before, f"{fn.__module__}.{fn.__name__} changed the units it judged"
            seen.append(fn.__name__)
            return out
        return wrapper

    monkeypatch.setattr(pointer_judgements, "judge", unchanged(pointer_judgements.judge, 1))
    monkeypatch.setattr(resume_entry, "entry_findings", unchanged(resume_entry.entry_findings, 0))
    for name in ("fw_lightning_link_target_truncated", "fw_lightning_default_last_truncated"):
        doc = audit_in_process(REPO / "tests" / "cases" / name, {}, out_dir=tmp_path / name)
        assert doc["pointer_findings"] or doc["resume_entries"]
    assert seen == ["judge", "entry_findings"] * 2


def test_the_demo_is_judged_once_per_unit(counted, tmp_path):
    from ckptaudit import demo

    d = demo.make_demo_run(tmp_path / "demo" / "run", max_steps=150, save_every=50)
    doc = audit_in_process(d.run_dir, {}, out_dir=tmp_path / "out")
    assert [u["usable_for"] for u in doc["units"]] == ["none", "resume", "none"]  # 50 flipped, 150 cut
    _assert_judged_once(counted)


def test_an_nvrx_spoiled_file_is_the_one_unit_judged_twice(counted, tmp_path):
    """Rank 1's file of iteration 30 cut: rank 0's intact file of 30 is judged alone (resume), then lowered by
    ``save_spoiled_by_another_rank`` — the documented exception, one call more for that one unit."""
    run = copy_producer_run("nvrx_killed", tmp_path)
    (run / "run1" / "0" / "iter_0000030_0_local.dirty.pt").rename(run / "run1" / "0" / "iter_0000030_0_local.pt")
    cut = run / "run1" / "1" / "iter_0000030_1_local.pt"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    doc = audit_in_process(run, out_dir=tmp_path / "out")
    assert _spoiled(doc) == 1
    _assert_judged_once(counted)
    (_, calls), = counted
    assert calls == len(doc["units"]) + 1


# ------------------------------------------------------------------ nothing outside a detector adds findings
#: Modules that build a finding list of their own, with the reason each may.
DETECTORS = {
    "ckptaudit/layouts/result.py": "UnitScan.add: the scan's collector, which every layout adapter (the detectors "
                                   "of the scan stage) fills while it judges its unit",
    "ckptaudit/formats/integrity_json.py": "the integrity-manifest detector puts its own finding into the "
                                           "UnitManifest it returns",
    "ckptaudit/formats/torchzip.py": "check_zip, the torch-zip detector, orders its own findings into the "
                                     "ZipReport it returns",
}


def _is_findings(e: ast.expr, aliases: set) -> bool:
    """``x.findings``, ``x["findings"]``, a slice of either, or a name bound to one."""
    if isinstance(e, ast.Attribute) and e.attr == "findings":
        return True
    if isinstance(e, ast.Subscript):
        if isinstance(e.slice, ast.Constant) and e.slice.value == "findings":
            return True
        return _is_findings(e.value, aliases)
    return isinstance(e, ast.Name) and e.id in aliases


def additions(tree: ast.AST) -> list:
    """``[(line, what)]``: every place ``tree`` changes a findings list in place, or assigns one into a
    finding holder that exists already."""
    out = []
    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and _is_findings(n.value, set())
               for t in n.targets if isinstance(t, ast.Name)}  # module-wide: a name bound to one anywhere
    for n in ast.walk(tree):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("append", "extend", "insert") and _is_findings(n.func.value, aliases)):
            out.append((n.lineno, f"{ast.unparse(n.func)}()"))
        elif isinstance(n, ast.AugAssign) and _is_findings(n.target, aliases):
            out.append((n.lineno, f"{ast.unparse(n.target)} +="))
        elif isinstance(n, ast.Assign):
            out.extend((n.lineno, f"{ast.unparse(t)} =") for t in n.targets
                       if not isinstance(t, ast.Name) and _is_findings(t, set()))
    return sorted(set(out))


def test_the_reader_sees_every_way_to_add_a_finding():
    src = ("def f(u, r, fl):\n    u['findings'].append(1)\n    r.findings.extend([])\n    u['findings'] += [2]\n"
           "    u['findings'] = u['findings'] + [3]\n    r.findings[:0] = [4]\n    g = u['findings']\n"
           "    g.insert(0, 5)\n    fl.append(6)\n    v = {**u, 'findings': u['findings'] + [7]}\n")
    assert [w for _, w in additions(ast.parse(src))] == [
        "u['findings'].append()", "r.findings.extend()", "u['findings'] +=", "u['findings'] =",
        "r.findings[:0] =", "g.insert()"]  # a list of one's own (fl), a new unit dict (v): not an addition


def test_no_function_outside_a_detector_adds_to_a_units_findings():
    found = {str(p.relative_to(REPO)): additions(ast.parse(p.read_text()))
             for p in sorted(PKG.rglob("*.py"))}
    found = {k: v for k, v in found.items() if v}
    outside = {k: v for k, v in found.items() if k not in DETECTORS}
    assert not outside, f"findings added outside a detector: {outside}"
    assert set(DETECTORS) <= set(found), f"no longer adds findings: drop from DETECTORS: {set(DETECTORS) - set(found)}"
