"""The training-loop example of the docs, run as written, leaves a run the audit finds no warning in.

Every ``python`` block marked ``<!-- test:training-loop -->`` in README.md or docs/*.md is written to a
file in a temp folder and run there in a subprocess (as a user would paste it), twice (the second run
resumes); then the run it leaves is audited, with the producer contracts on and off (structure alone
must reach the same verdict), and no unit may carry a warning or an error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from .conftest import REPO

MARK = "<!-- test:training-loop -->"


def marked_blocks():
    out = []
    for doc in [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md")):
        for m in re.finditer(re.escape(MARK) + r"\s*```python\n(.*?)```", doc.read_text(), re.S):
            out.append((doc.relative_to(REPO).as_posix(), m.group(1)))
    return out


BLOCKS = marked_blocks()

AUDIT = ("import json, sys\n"
         "from ckptaudit.pipeline import audit_in_process\n"
         "print(json.dumps(audit_in_process(sys.argv[1])))\n")


def test_the_example_is_marked():
    assert [d for d, _ in BLOCKS] == ["docs/training-loop.md"]


@pytest.mark.parametrize("doc,code", BLOCKS, ids=[d for d, _ in BLOCKS])
def test_training_loop_example_audits_clean(doc, code, tmp_path):
    (tmp_path / "loop.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for _ in range(2):  # a fresh run, then a resume from it
        r = subprocess.run([sys.executable, "loop.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "out"
    units = sorted(n for n in os.listdir(run) if n.endswith(".pt"))
    assert units == ["ckpt_000040.pt", "ckpt_000050.pt", "ckpt_000060.pt"]
    for contracts in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", AUDIT, str(run)], cwd=tmp_path, capture_output=True, text=True,
                           env={**env, "CKPTAUDIT_PRODUCER_CONTRACTS": contracts}, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        v = json.loads(r.stdout.strip().splitlines()[-1])
        assert v["recommendation"] == "resume" and v["rollback"]["unit"] == "ckpt_000060.pt"
        loud = [(u["unit"], f["kind"], f["severity"]) for u in v["units"] for f in u["findings"]
                if f["severity"] in ("warning", "error")]
        loud += [(p["path"], p["kind"], "pointer") for p in v["pointers"] if not p["ok"]]
        assert loud == [], f"contracts={contracts}: {loud}"
        assert {u["unit"]: u["usable_for"] for u in v["units"]} == {u: "resume" for u in units}
