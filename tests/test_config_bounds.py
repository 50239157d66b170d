"""Config values and arguments the audit cannot survive are refused up front: exit 3, one line, no traceback."""

import math
import os
import threading

import pytest
from click.testing import CliRunner

from ckptaudit.cli import main
from ckptaudit.pipeline import audit_in_process, check_config, config_problems, default_config


def _audit(*args):
    """Run ``ckptaudit audit`` in process; (exit code, stderr) with a watchdog so a hang fails, not blocks."""
    result = {}

    def go():
        result["r"] = CliRunner().invoke(main, ["audit", *args])

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), f"ckptaudit audit {args} hung"
    r = result["r"]
    return r.exit_code, r.stderr


def _assert_refused(code, err, *needles):
    assert code == 3, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 15, err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err


BAD_VALUES = [
    ("load:\n  timeout_seconds: .inf\n", "load.timeout_seconds: inf is not finite"),
    ("load:\n  timeout_seconds: .nan\n", "load.timeout_seconds: nan is not finite"),
    ("load:\n  timeout_seconds: 86401\n", "load.timeout_seconds: 86401 is greater than the maximum of 86400"),
    ('{"load": {"memory_limit_mib": 1e13}}',
     "load.memory_limit_mib: 10000000000000.0 is greater than the maximum of 1048576"),
    ("state:\n  chunk_mib: 100000000\n", "state.chunk_mib: 100000000 is greater than the maximum of 1024"),
    ('{"state": {"chunk_mib": 1e8}}', "state.chunk_mib: 100000000.0 is greater than the maximum of 1024"),
    ("state:\n  norm_jump_ratio: .inf\n", "state.norm_jump_ratio: inf is not finite"),
    ("drill:\n  timeout_seconds: -.inf\n", "drill.timeout_seconds: -inf is not finite"),
]


@pytest.mark.parametrize("text,reason", BAD_VALUES, ids=[r.split(":")[0] + str(i) for i, (_, r) in enumerate(BAD_VALUES)])
def test_bad_config_value_exits_3_with_the_key_and_the_bound(tmp_path, text, reason):
    (tmp_path / "run").mkdir()
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    code, err = _audit(str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--config", str(cfg))
    _assert_refused(code, err, reason)
    assert not (tmp_path / "out").exists()


def test_config_dev_zero_is_refused_unread(tmp_path):
    """/dev/zero passed click's exists check and was read whole, forever."""
    (tmp_path / "run").mkdir()
    code, err = _audit(str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--config", "/dev/zero")
    _assert_refused(code, err, "--config /dev/zero: is a device; expected a regular YAML/JSON file")


def test_config_fifo_is_refused_without_blocking(tmp_path):
    """A FIFO config blocked the audit forever in open() waiting for a writer."""
    (tmp_path / "run").mkdir()
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    code, err = _audit(str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--config", str(fifo))
    _assert_refused(code, err, "is a FIFO; expected a regular YAML/JSON file")


def test_config_over_one_mib_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    code, err = _audit(str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--config", str(big))
    _assert_refused(code, err, "more than the 1048576 bytes a config file may have")


def test_missing_config_exits_3(tmp_path):
    (tmp_path / "run").mkdir()
    code, err = _audit(str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--config", str(tmp_path / "no.yaml"))
    _assert_refused(code, err, "cannot open: No such file or directory")


def test_empty_run_path_is_refused(tmp_path, monkeypatch):
    """``audit ""`` audited the current folder."""
    monkeypatch.chdir(tmp_path)
    code, err = _audit("", "--out", str(tmp_path / "out"))
    _assert_refused(code, err, "RUN_DIR is empty")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("inner", ["report", ".", "a/b"])
def test_out_inside_the_run_folder_is_refused(tmp_path, inner):
    """--out inside the run wrote .snakemake/ and tables into what was audited."""
    run = tmp_path / "run"
    run.mkdir()
    code, err = _audit(str(run), "--out", str(run / inner))
    _assert_refused(code, err, "is inside the run folder", "choose an output folder outside the run")
    assert sorted(os.listdir(run)) == []


def test_out_inside_the_run_folder_through_a_symlink_is_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "alias").symlink_to(run)
    code, err = _audit(str(run), "--out", str(tmp_path / "alias" / "out"))
    _assert_refused(code, err, "is inside the run folder")


def test_usage_errors_exit_3_not_2(tmp_path):
    """Exit 2 means "retrain"; a missing --out is the audit's own failure."""
    (tmp_path / "run").mkdir()
    code, err = _audit(str(tmp_path / "run"))
    _assert_refused(code, err, "Missing option '--out'")


def test_default_config_passes():
    assert config_problems(default_config()) == []
    check_config({})


@pytest.mark.parametrize("key,value,reason", [
    ("timeout_seconds", math.inf, "load.timeout_seconds: inf is not finite"),
    ("timeout_seconds", math.nan, "load.timeout_seconds: nan is not finite"),
    ("timeout_seconds", 0, "load.timeout_seconds: 0 is less than or equal to the minimum of 0"),
    ("memory_limit_mib", 10 ** 13, "load.memory_limit_mib: 10000000000000 is greater than the maximum of 1048576"),
    ("memory_limit_mib", 1e13, "load.memory_limit_mib: 10000000000000.0 is greater than the maximum of 1048576"),
])
def test_audit_in_process_raises_value_error_with_key_and_bound(tmp_path, key, value, reason):
    with pytest.raises(ValueError) as ei:
        audit_in_process(tmp_path, {"load": {key: value}}, out_dir=tmp_path / "out")
    assert str(ei.value).startswith(f"invalid config: {reason}")
    assert "\n" not in str(ei.value)
    assert not (tmp_path / "out").exists()


def test_audit_in_process_chunk_bound(tmp_path):
    with pytest.raises(ValueError, match=r"^invalid config: state.chunk_mib: 100000000.0 is greater than the "
                                         r"maximum of 1024$"):
        audit_in_process(tmp_path, {"state": {"chunk_mib": 1e8}}, out_dir=tmp_path / "out")


def test_every_numeric_schema_key_has_both_bounds():
    """A numeric key without a maximum lets a value through that the audit cannot survive."""
    import yaml

    from ckptaudit.pipeline import SCHEMA_PATH

    missing = []

    def walk(node, key):
        types = node.get("type")
        types = types if isinstance(types, list) else [types]
        if {"integer", "number"} & set(types):
            if "maximum" not in node or not ({"minimum", "exclusiveMinimum"} & set(node)):
                missing.append(key)
        for k, v in (node.get("properties") or {}).items():
            walk(v, f"{key}.{k}" if key else k)
        for v in node.get("oneOf") or []:
            walk(v, key)

    walk(yaml.safe_load(SCHEMA_PATH.read_text()), "")
    assert missing == []


def test_snakemake_config_gets_the_same_check(tmp_path):
    """``snakemake --configfile`` with a NaN stops in rules/common.smk with the key, before any job."""
    import subprocess
    import sys

    from .conftest import REPO

    cfg = tmp_path / "nan.yaml"
    cfg.write_text("load:\n  timeout_seconds: .nan\n")
    p = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(cfg)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "invalid config: load.timeout_seconds: nan is not finite" in p.stdout + p.stderr


def _drill(*args):
    """``ckptaudit drill`` in process, like :func:`_audit`."""
    result = {}

    def go():
        result["r"] = CliRunner().invoke(main, ["drill", *args])

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), f"ckptaudit drill {args} hung"
    return result["r"].exit_code, result["r"].stderr


DRILL_REFUSALS = [
    # (arguments given a run folder R and a scratch folder T, text the one-line reason names)
    (lambda r, t: [r], "Missing option '--out'"),
    (lambda r, t: ["", "--out", t + "/out"], "RUN_DIR is empty"),
    (lambda r, t: [t + "/nope", "--out", t + "/out"], "not a folder"),
    (lambda r, t: [r, "--out", r + "/report"], "--out"),
    (lambda r, t: [r, "--out", t + "/out", "--config", t + "/missing.yaml"], "missing.yaml"),
    (lambda r, t: [r, "--out", t + "/out", "--config", "/dev/zero"], "/dev/zero"),
    (lambda r, t: [r, "--out", t + "/out", "--config", t + "/bad.yaml"], "drill.timeout_seconds: inf is not finite"),
    (lambda r, t: [r, "--out", t + "/out", "--device", "tpu"], "--device 'tpu'"),
    (lambda r, t: [r, "--out", t + "/out", "--cores", "0"], "--cores"),
]


@pytest.mark.parametrize("i", range(len(DRILL_REFUSALS)))
def test_drill_refusals_exit_3_not_2(tmp_path, i):
    """Exit 2 of ``drill`` means "no restorable unit": a bad argument must never look like that."""
    make, needle = DRILL_REFUSALS[i]
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "bad.yaml").write_text("drill:\n  timeout_seconds: .inf\n")
    code, err = _drill(*make(str(run), str(tmp_path)))
    _assert_refused(code, err, needle)
    assert not (tmp_path / "out").exists() and not (run / "report").exists()
