"""The workflow's plain helpers: which interpreter the rules run, and the job entry points' arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml
from snakemake.settings.types import DeploymentSettings
from snakemake_interface_executor_plugins.settings import DeploymentMethod

from ckptaudit.stages import target
from ckptaudit.workflow import support as ws

from .conftest import REPO


def test_rules_run_the_conda_envs_python_only_when_snakemake_deploys_conda():
    conda = DeploymentSettings(deployment_method={DeploymentMethod.CONDA})
    both = DeploymentSettings(deployment_method={DeploymentMethod.APPTAINER, DeploymentMethod.CONDA})
    assert ws.rule_python(conda, "/venv/bin/python") == "python"
    assert ws.rule_python(both, "/venv/bin/python") == "python"
    assert ws.rule_python(DeploymentSettings(), "/venv/bin/python") == "/venv/bin/python"
    assert ws.rule_python(DeploymentSettings(deployment_method={DeploymentMethod.APPTAINER}),
                          "/venv/bin/python") == "/venv/bin/python"
    assert ws.rule_python(None, "/venv/bin/python") == "/venv/bin/python"  # no deployment settings at all
    assert ws.rule_python(SimpleNamespace(deployment_method=frozenset())) == sys.executable


def test_conda_env_installs_this_checkout_and_cpu_torch():
    env = yaml.safe_load((REPO / "rules" / "envs" / "ckptaudit.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert "pip" in env["dependencies"]
    assert pip == ["--extra-index-url https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu",
                   "-e ${CKPTAUDIT_SOURCE}"]
    common = (REPO / "rules" / "common.smk").read_text()
    assert 'os.environ.setdefault("CKPTAUDIT_SOURCE", workflow.basedir)' in common
    assert "PYTHON = ws.rule_python(workflow.deployment_settings)" in common


@pytest.mark.parametrize("module, argv", [
    ("ckptaudit.workflow.support", []),
    ("ckptaudit.workflow.support", ["write-config", "{}"]),
    ("ckptaudit.stages.target", []),
    ("ckptaudit.stages.target", ["write", "config.json"]),
    ("ckptaudit.stages.target", ["child", "pkg.mod:fn"]),
])
def test_entry_points_refuse_missing_arguments(module, argv, tmp_path):
    p = subprocess.run([sys.executable, "-m", module, *argv], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2
    assert "error: the following arguments are required" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_write_config_writes_sorted_indented_json(tmp_path):
    out = tmp_path / "work" / "config.json"
    assert ws.main(["write-config", '{"b": 1, "a": [2]}', str(out)]) == 0
    assert out.read_text() == '{\n "a": [\n  2\n ],\n "b": 1\n}'
    assert [p.name for p in out.parent.iterdir()] == ["config.json"]


def test_target_write_without_a_source(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_factory": "", "reference": ""}))
    out = tmp_path / "work" / "target.json"
    assert target.main(["write", str(cfg), str(out)]) == 0
    assert json.loads(out.read_text()) == {"source": "none", "detail": "", "weights": None}
