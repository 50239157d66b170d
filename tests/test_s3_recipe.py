"""The local S3 recipe of docs/s3.md, run as written: moto's server on loopback, the demo run uploaded
to a bucket, ``ckptaudit audit s3://…`` (issue 28).

Guards against a recipe that no longer runs when pasted (a renamed command, a moto or s3fs change, an
endpoint the audit does not pick up) and against an S3 audit of it that disagrees with the local audit of
the same run. The block is taken from the document itself (the fenced block after
``<!-- recipe: s3-local -->``); only its ``PORT`` comes from the environment, which the recipe allows.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO

# the recipe needs both; under CI=true a skip here fails (tests/conftest.py)
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

DOC = REPO / "docs" / "s3.md"
MARK = "<!-- recipe: s3-local -->"


def recipe_blocks(text: str) -> list[str]:
    """The fenced ``bash`` blocks that directly follow a recipe mark, in document order."""
    return re.findall(re.escape(MARK) + r"\s*\n```bash\n(.*?)\n```", text, flags=re.S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _kill_group(proc: subprocess.Popen) -> None:
    """The recipe's shell and whatever it left (moto's server) share one process group: end it all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.2)  # the group may outlive its leader for a moment


def _clean_env(tmp: Path, port: int) -> dict:
    """This venv's commands first on PATH, no AWS setting of the caller's, the recipe's PORT."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""), PORT=str(port),
               AWS_CONFIG_FILE=str(tmp / "no-aws-config"), AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-creds"),
               AWS_EC2_METADATA_DISABLED="true")
    return env


def _facts(v: dict) -> dict:
    """What the audit decided, without paths: recommendation, rollback point, newest unit, each unit's use."""
    return {"recommendation": v["recommendation"], "rollback": v["rollback"], "steps_lost": v["steps_lost"],
            "newest": v["newest"], "units": {u["unit"]: (u["step"], u["usable_for"]) for u in v["units"]}}


def test_the_document_has_one_recipe_that_audits_an_s3_url():
    blocks = recipe_blocks(DOC.read_text())
    assert len(blocks) == 1, f"expected one ```bash block after {MARK} in {DOC}"
    assert re.search(r"^ckptaudit audit s3://\S+ --out \S+$", blocks[0], flags=re.M), blocks[0]
    assert "PORT=${PORT:-" in blocks[0]  # the port the test replaces through the environment, not the text
    assert "pip install torch==2.13.0 -e '.[s3-local]'" in DOC.read_text()


def test_recipe_runs_as_written_and_agrees_with_the_local_audit(tmp_path):
    (block,) = recipe_blocks(DOC.read_text())
    url, out = re.search(r"^ckptaudit audit (s3://\S+) --out (\S+)$", block, flags=re.M).groups()
    run_name = url.rstrip("/").rsplit("/", 1)[1]
    script = tmp_path / "recipe.sh"
    script.write_text(block + "\n")
    port = _free_port()
    env = _clean_env(tmp_path, port)
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=240)
    finally:
        _kill_group(proc)  # a recipe that failed or hung must not leave moto's server behind
    moto_log = tmp_path / "moto.log"
    context = log + ("\n--- moto.log ---\n" + moto_log.read_text()[-3000:] if moto_log.exists() else "")
    # exit 1: a rollback is needed and possible (the demo's newest save is cut short)
    assert proc.returncode == 1, context
    assert not _listening(port), "the recipe's trap did not stop moto's server"
    v_s3 = json.loads((tmp_path / out / "verdict.json").read_text())
    assert v_s3["run_dir"].rstrip("/") == url.rstrip("/"), v_s3["run_dir"]

    # the same bytes audited from the local folder the recipe uploaded
    local = subprocess.run(["ckptaudit", "audit", run_name, "--out", "local-report"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=240)
    assert local.returncode == proc.returncode, local.stdout + local.stderr
    v_local = json.loads((tmp_path / "local-report" / "verdict.json").read_text())
    assert _facts(v_s3) == _facts(v_local)
    assert v_s3["recommendation"] == "resume" and v_s3["rollback"]["unit"] == "ckpt_000500.pt", _facts(v_s3)
