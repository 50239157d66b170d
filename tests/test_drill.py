"""The restore drill: restore a unit in a fresh process through a hook, continue, compare.

Every drill here runs a real child process on real checkpoints of the tiny demo trainer; the broken
copies are made by loading with ``torch.load(weights_only=True)``, editing and re-saving (with a
fresh sidecar, so the audit still picks the same rollback point).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptaudit import drill as dr

from .conftest import CASES, PAYLOAD, REPO

ROLLBACK = "ckpt_000250.pt"  # rollback point of the conftest demo run (300 is truncated, 150 bit-flipped)


def _audit(run_dir: Path, out: Path) -> dict:
    from ckptaudit.pipeline import audit_in_process

    return audit_in_process(run_dir, out_dir=out)


def _by_check(rows, device="cpu"):
    return {r["check"]: r for r in rows if r["device"] in (device, "")}


def _bad(rows):
    return sorted((r["check"], r["status"]) for r in rows if r["status"] in ("fail", "warn"))


@pytest.fixture(scope="module")
def verdict(demo_run, tmp_path_factory):
    return _audit(demo_run.run_dir, tmp_path_factory.mktemp("audit"))


# ------------------------------------------------------------------ the demo run
@pytest.mark.slow
def test_drill_passes_on_rollback_point(demo_run, tmp_path):
    """The README's `ckptaudit drill RUN --out DIR`: the real workflow (audit, then the drill rule)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("units_per_job: 64\n")  # one part: fewer Snakemake jobs, same checks
    out = tmp_path / "out"
    xml, prom = tmp_path / "drill.xml", tmp_path / "drill.prom"
    p = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "drill", str(demo_run.run_dir), "--out", str(out),
                        "--config", str(cfg), "--junit", str(xml), "--metrics", str(prom)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == dr.EXIT_PASSED, p.stdout + p.stderr
    assert p.stdout.startswith(f"ckptaudit drill: PASSED {ROLLBACK} (step 250) on cpu: 11 checks passed")
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "drill" / "drill.parquet").to_pylist()
    assert [n for n, _ in dr.COLUMNS] == list(rows[0])
    assert _bad(rows) == []
    by = _by_check(rows)
    for name in ("eligibility", "child_process", "restore_hook", "model_load_strict", "optimizer_load_strict",
                 "optimizer_moments", "global_step", "rng_stream", "loss_at_restore", "continuation_steps",
                 "lr_continuity"):
        assert by[name]["status"] == "pass", (name, by[name])
    assert by["global_step"]["actual"] == "step 250; optimizer per-parameter step [250.0]"
    assert by["rng_stream"]["expected"] == "live RNG == saved for ['torch', 'numpy', 'python']"
    assert by["lr_continuity"]["message"] == ("the LR continues the schedule from step 250 (no re-warm-up), "
                                              "through its next change")
    # the newest unit is truncated: nothing later to compare with; no sampler or scaler in the demo
    assert {k: by[k]["status"] for k in ("next_unit_match", "data_sampler", "loss_scale")} == {
        "next_unit_match": "skip", "data_sampler": "skip", "loss_scale": "skip"}
    child = by["child_process"]
    assert child["wall_seconds"] > 0 and child["peak_rss_bytes"] > 50 * 2**20
    import torch

    if not torch.cuda.is_available():
        cuda = [(r["check"], r["status"]) for r in rows if r["device"] == "cuda"]
        assert cuda == [("device_available", "skip")]
    doc = json.loads((out / "drill" / "drill.json").read_text())
    assert doc["exit_code"] == 0 and doc["unit"] == ROLLBACK and doc["step"] == 250
    assert [e["step"] for e in doc["devices"][0]["trace"]] == [250, 251, 252, 253, 254]
    html = (out / "drill" / "drill.html").read_text()
    assert "<script" not in html and "PASSED (exit 0)" in html and "lr_continuity" in html
    assert (out / "benchmarks" / "drill" / "drill.tsv").exists()
    _check_watched_outputs(xml, prom, doc, rows, demo_run.run_dir)


def _check_watched_outputs(xml, prom, doc, rows, run_dir):
    """--junit: one case per drill check and device, valid junit-10.xsd; --metrics: the drill's series."""
    import xml.etree.ElementTree as ET

    from prometheus_client.parser import text_string_to_metric_families

    from ckptaudit.schemas import drill_problems

    from .junit_schema import junit_schema

    assert drill_problems(doc) == []
    junit_schema().validate(str(xml))
    suites = {s.get("name"): s for s in ET.parse(xml).getroot().findall("testsuite")}
    cases = [(c.get("classname"), c.get("name")) for c in suites["drill"].findall("testcase")]
    assert cases == [(f"ckptaudit.drill.{r['device'] or 'run'}", r["check"]) for r in rows]
    assert suites["drill"].get("failures") == suites["drill"].get("errors") == "0"
    assert int(suites["drill"].get("skipped")) == sum(r["status"] == "skip" for r in rows) >= 3
    assert suites["audit"].get("tests") == str(1 + len(json.loads((xml.parent / "out" / "verdict.json").read_text())
                                                       ["units"]))
    val = {(s.name, s.labels.get("status")): s.value for f in text_string_to_metric_families(prom.read_text())
           for s in f.samples if s.labels.get("run") == str(run_dir.resolve())}
    assert val[("ckptaudit_drill_success", None)] == 1 and val[("ckptaudit_drill_exit_code", None)] == 0
    assert val[("ckptaudit_drill_step", None)] == doc["step"] == 250
    assert val[("ckptaudit_drill_duration_seconds", None)] == doc["wall_seconds"] > 0
    assert val[("ckptaudit_drill_checks", "pass")] == sum(r["status"] == "pass" for r in rows) == 11
    assert val[("ckptaudit_rollback_step", None)] == 250  # the audit's series are in the same file


def test_continuation_reproduces_next_unit_bit_for_bit(demo_run, verdict, tmp_path):
    rows, code = dr.run_drill(demo_run.run_dir, tmp_path, {"drill": {"devices": ["cpu"]}}, unit="ckpt_000200.pt",
                              verdict=verdict)
    assert code == dr.EXIT_PASSED, _bad(rows)
    nxt = _by_check(rows)["next_unit_match"]
    assert nxt["status"] == "pass"
    assert nxt["expected"] == f"weights bitwise equal to {ROLLBACK} after 50 updates"
    assert nxt["message"].startswith(f"bit-exact: continuing reproduces {ROLLBACK}")
    doc = json.loads((tmp_path / "drill.json").read_text())
    assert doc["next_unit"] == ROLLBACK  # 300 (truncated) is refused; 150 is earlier
    assert len(doc["devices"][0]["trace"]) == 50
    assert doc["devices"][0]["trace"][-1]["loss"] == demo_run.losses[250]


# ------------------------------------------------------------------ broken copies
def _zero_moments(ck):
    for st in ck["optimizer"]["state"].values():
        st["exp_avg"].zero_()
        st["exp_avg_sq"].zero_()


BREAKS = {
    "scheduler_removed": (lambda ck: ck.pop("scheduler"), dr.EXIT_PROBLEM, [("lr_continuity", "fail")]),
    "moments_zeroed": (_zero_moments, dr.EXIT_PROBLEM, [("optimizer_moments", "fail")]),
    "rng_missing": (lambda ck: ck.pop("rng"), dr.EXIT_PASSED, [("rng_stream", "warn")]),
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_broken_copy(name, demo_run, tmp_path):
    import torch

    from ckptaudit.demo import save_checkpoint

    edit, want_code, want_bad = BREAKS[name]
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    ck = torch.load(run / ROLLBACK, weights_only=True)
    edit(ck)
    save_checkpoint(ck, run / ROLLBACK)  # a fresh sidecar: the bytes are what the writer meant
    v = _audit(run, tmp_path / "audit")
    assert v["rollback"]["unit"] == ROLLBACK  # the audit still resumes from it
    rows, code = dr.run_drill(run, tmp_path / "drill", {"drill": {"devices": ["cpu"]}}, verdict=v)
    assert code == want_code
    assert _bad(rows) == want_bad
    summary = json.loads((tmp_path / "drill" / "drill.json").read_text())["summary"]
    if name == "scheduler_removed":
        msg = _by_check(rows)["lr_continuity"]["message"]
        assert msg.startswith("the update after step 251 used LR [")
        assert "the learning rate re-warms" in msg and "built a fresh scheduler" in msg
        assert summary.startswith(f"ckptaudit drill: FAILED {ROLLBACK} (step 250): lr_continuity@cpu: ")
    elif name == "moments_zeroed":
        r = _by_check(rows)["optimizer_moments"]
        assert r["actual"] == "all-zero moments for 28 of 28 parameters"
        assert summary.startswith(f"ckptaudit drill: FAILED {ROLLBACK} (step 250): optimizer_moments@cpu: ")
    else:
        r = _by_check(rows)["rng_stream"]
        assert r["message"] == ("the unit holds no RNG state: the continuation is not bit-exact and the data "
                                "order may repeat")
        assert summary.endswith("1 warning(s): rng_stream@cpu")


# ------------------------------------------------------------------ security
def test_refuses_unit_with_security_findings(tmp_path):
    """A unit whose pickle would run code must never reach a drill child, whatever the hook does."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(CASES / "security_malicious_reduce_zip" / "ckpt.pt", run / "ckpt_000100.pt")
    v = _audit(run, tmp_path / "audit")
    unit = v["units"][0]
    assert [(f["layer"], f["kind"]) for f in unit["findings"] if f["severity"] == "error" and f["layer"] == "security"
            ] == [("security", "malicious_pickle_code_exec")]  # its other layers are judged too (a name-step reset)
    rows, code = dr.run_drill(run, tmp_path / "drill", {}, unit="ckpt_000100.pt", verdict=v)
    assert code == dr.EXIT_NO_UNIT
    assert [(r["check"], r["status"]) for r in rows] == [("eligibility", "fail")]
    assert rows[0]["message"] == ("ckpt_000100.pt: refused: the audit found security errors "
                                  "(malicious_pickle_code_exec); the drill never loads such a unit, not even with "
                                  "weights_only=True")
    assert not (tmp_path / "drill" / "children").exists()  # no child was started
    assert not (Path.cwd() / PAYLOAD).exists()


def test_security_error_wins_over_usable_for():
    """A verdict edited (or produced by an older audit) to call a malicious unit resumable is still refused."""
    f = {"layer": "security", "kind": "unknown_pickle_global", "severity": "error", "message": "m"}
    v = {"rollback": {"unit": "a.pt", "step": 5}, "recommendation": "resume",
         "units": [{"unit": "a.pt", "step": 5, "usable_for": "resume", "findings": [f]}]}
    chosen, nxt, why = dr.select_unit(v)
    assert chosen is None and why.startswith("a.pt: refused: the audit found security errors (unknown_pickle_global)")


def test_child_refuses_weights_only_false(demo_run, verdict, tmp_path, monkeypatch):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "unsafe_hook.py").write_text(
        "import os\nimport torch\n\n\n"
        "def restore_hook(path, device):\n"
        "    assert os.environ['TORCH_FORCE_WEIGHTS_ONLY_LOAD'] == '1'\n"
        "    return torch.load(path, weights_only=False)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]))
    rows, code = dr.run_drill(demo_run.run_dir, tmp_path / "drill",
                              {"drill": {"devices": ["cpu"], "hook": "unsafe_hook:restore_hook"}}, verdict=verdict)
    assert code == dr.EXIT_PROBLEM
    r = _by_check(rows)["restore_hook"]
    assert r["status"] == "fail"
    assert r["message"] == (f"the restore hook raised while restoring {ROLLBACK}: RuntimeError: "
                            f"{dr.WEIGHTS_ONLY_REFUSAL}")


def test_child_environment_forces_weights_only():
    env = dr.child_env(1)
    assert env["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] == "1" and "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in env


# ------------------------------------------------------------------ exit codes 2 and 3
def test_no_restorable_unit(tmp_path):
    v = {"run_dir": str(tmp_path), "recommendation": "retrain", "rollback": None, "units": []}
    rows, code = dr.run_drill(None, tmp_path, {}, verdict=v)
    assert code == dr.EXIT_NO_UNIT
    assert rows[0]["message"] == "the audit found no restorable unit (recommendation 'retrain', no rollback point)"
    doc = json.loads((tmp_path / "drill.json").read_text())
    assert doc["summary"] == ("ckptaudit drill: NO RESTORABLE UNIT: the audit found no restorable unit "
                              "(recommendation 'retrain', no rollback point)")
    _, code = dr.run_drill(None, tmp_path, {}, unit="nope.pt", verdict={**v, "units": [
        {"unit": "a.pt", "step": 1, "usable_for": "resume", "findings": []}]})
    assert code == dr.EXIT_NO_UNIT


@pytest.mark.slow
def test_drill_command_exits_with_the_drills_code(tmp_path):
    """Regression: after the CLI moved into cli/, ``ckptaudit drill`` printed the summary and exited 0 whatever
    the drill found.  A run with nothing restorable must exit 2."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "ckpt_000100.pt").write_bytes(b"\0" * 4096)  # all zero: no restorable unit
    p = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "drill", str(run), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == dr.EXIT_NO_UNIT, p.stdout + p.stderr
    assert "NO RESTORABLE UNIT" in p.stdout.upper(), p.stdout


def test_unimportable_hook_is_a_drill_failure(demo_run, verdict, tmp_path):
    rows, code = dr.run_drill(demo_run.run_dir, tmp_path, {"drill": {"devices": ["cpu"],
                                                                     "hook": "no_such_module_xyz:hook"}},
                              verdict=verdict)
    assert code == dr.EXIT_FAILED
    r = _by_check(rows)["child_process"]
    assert r["status"] == "fail"
    assert r["message"].startswith("the restore hook could not be used: drill.hook 'no_such_module_xyz:hook': "
                                   "ModuleNotFoundError")


def test_timeout_kills_the_child(demo_run, verdict, tmp_path):
    rows, code = dr.run_drill(demo_run.run_dir, tmp_path, {"drill": {"devices": ["cpu"], "timeout_seconds": 0.3}},
                              verdict=verdict)
    assert code == dr.EXIT_FAILED
    r = _by_check(rows)["child_process"]
    assert r["message"].startswith("the drill child was killed after 0.3 s (drill.timeout_seconds)")
    assert json.loads((tmp_path / "drill.json").read_text())["summary"].startswith(
        f"ckptaudit drill: DRILL FAILED {ROLLBACK} (step 250): child_process@cpu: the drill child was killed")


def test_no_available_device_is_a_drill_failure(demo_run, verdict, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    rows, code = dr.run_drill(demo_run.run_dir, tmp_path, {"drill": {"devices": ["cuda"]}}, verdict=verdict)
    assert code == dr.EXIT_FAILED
    assert [(r["check"], r["status"]) for r in rows if r["device"] == "cuda"] == [
        ("child_process", "pass"), ("device_available", "skip")]
    assert rows[-1]["message"] == "none of drill.devices ['cuda'] is available here: nothing was restored"


def test_unit_pruned_while_drilled_voids_the_drill(demo_run, verdict, tmp_path, monkeypatch):
    """A writer's retention deleting the rollback point mid-drill: exit 3 with why, never "a check failed"."""
    run = tmp_path / "run"
    shutil.copytree(demo_run.run_dir, run)
    real = dr.run_child

    def child_then_prune(spec, *a, **kw):
        res = real(spec, *a, **kw)
        os.unlink(spec["unit_path"])
        return res

    monkeypatch.setattr("ckptaudit.drill.parent.run_child", child_then_prune)
    rows, code = dr.run_drill(run, tmp_path / "out", {"drill": {"devices": ["cpu"]}},
                              verdict={**verdict, "run_dir": str(run)})
    assert code == dr.EXIT_FAILED
    r = _by_check(rows)["unit_stable"]
    assert r["status"] == "fail" and r["actual"] == f"1 file(s) changed or vanished ({ROLLBACK})"
    assert r["message"].startswith(f"{ROLLBACK} changed while it was drilled")


def test_exit_code_precedence():
    fail = {"check": "lr_continuity", "status": "fail"}
    child = {"check": "child_process", "status": "fail"}
    assert dr.exit_code([fail, child], infra_failed=True, no_unit=False) == dr.EXIT_PROBLEM
    assert dr.exit_code([child], infra_failed=True, no_unit=False) == dr.EXIT_FAILED
    assert dr.exit_code([{"check": "rng_stream", "status": "warn"}], False, False) == dr.EXIT_PASSED
    assert dr.exit_code([], False, no_unit=True) == dr.EXIT_NO_UNIT
    assert dr.exit_code([fail, {"check": "unit_stable", "status": "fail"}], True, False) == dr.EXIT_FAILED


# ------------------------------------------------------------------ config, workflow, README
def test_config_block_matches_defaults_and_schema():
    import yaml
    from snakemake.utils import validate

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    assert cfg["drill"] == dr.DEFAULTS
    validate(cfg, str(REPO / "config" / "schema.yaml"))
    schema = yaml.safe_load((REPO / "config" / "schema.yaml").read_text())["properties"]["drill"]
    for key, prop in schema["properties"].items():
        assert prop["default"] == dr.DEFAULTS[key] and prop["description"], key
    cfg["drill"]["stepz"] = 5
    with pytest.raises(Exception, match="'stepz' was unexpected"):
        validate(cfg, str(REPO / "config" / "schema.yaml"))


def test_demo_hook_implements_the_protocol(demo_run):
    from ckptaudit.demo import restore_hook

    r = restore_hook(str(demo_run.run_dir / ROLLBACK), "cpu")
    assert isinstance(r, dr.Restored)
    assert r.step == 250 and r.deterministic and r.saved["loss_source"] == "loss (train loss of the save step)"
    assert [round(x, 12) for x in r.lr_at(250)] == [round(g["lr"], 12) for g in r.optimizer.param_groups]


def _dag_rules(*args, cwd) -> set:
    """Rule names in the DAG Snakemake would run (``--dag`` builds it without running anything)."""
    import re

    p = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--dag", *args],
                       capture_output=True, text=True, cwd=cwd, timeout=300)
    assert p.returncode == 0, p.stderr
    return set(re.findall(r'label = "(\w+)', p.stdout))


def test_drill_is_not_in_the_default_target_and_nightly_profile_parses(demo_run, tmp_path):
    run = str(demo_run.run_dir)
    audit = _dag_rules("--cores", "1", "--config", f"run_dir={run}", cwd=tmp_path)
    assert {"audit", "report", "inventory"} <= audit  # part jobs appear once the inventory checkpoint ran
    assert not {r for r in audit if r.startswith("drill")}
    nightly = _dag_rules("--profile", str(REPO / "config" / "profiles" / "nightly"), "drill_nightly",
                         "--config", f"run_dir={run}", "drill={'report_date': '2030-01-02'}", cwd=tmp_path)
    assert {"drill_nightly", "drill_dated", "drill", "report", "inventory"} <= nightly


def test_readme_documents_the_drill():
    text = (REPO / "docs" / "drill.md").read_text()
    sec = text[text.index("## Restore drill (nightly)"):]
    assert "snakemake --profile config/profiles/nightly drill_nightly" in sec
    for code in ("**0**", "**1**", "**2**", "**3**"):
        assert code in sec
    for check in dr.CHECKS:
        assert f"`{check}`" in sec, check


@pytest.mark.slow
def test_a_hook_module_beside_the_user_is_found_by_the_children_too(demo_run, tmp_path):
    """A new user's trial: ``drill.hook: "myhook:restore"`` with myhook.py in the folder they ran
    ``ckptaudit drill`` from passed the import check, then every child failed with ModuleNotFoundError
    (exit 3).  The children now import it from that folder as the check did."""
    user = tmp_path / "me"
    user.mkdir()
    (user / "myhook.py").write_text("from ckptaudit.demo import restore_hook as restore  # noqa: F401\n")
    (user / "drill.yaml").write_text('units_per_job: 64\ndrill: {hook: "myhook:restore", devices: [cpu]}\n')
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "drill", str(demo_run.run_dir), "--out",
                        str(tmp_path / "out"), "--config", "drill.yaml"], cwd=user, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == dr.EXIT_PASSED, p.stdout + p.stderr
    assert p.stdout.startswith(f"ckptaudit drill: PASSED {ROLLBACK} (step 250) on cpu"), p.stdout
