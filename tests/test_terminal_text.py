"""Text from the run never steers the terminal: names with OSC/CSI sequences, CR, LF and U+202E (issue 24).

The run is written the way an attacker would name files: a terminal-title OSC, a CSI that clears the
screen, a name whose newline forges a second ``ckptaudit: RESUME`` line, a bidi override that shows
``ckpt_000500.pt`` reversed, a CR that redraws the line.  Every such character reaches the summary, the
error lines and the reader's log records escaped (``\\x1b``, ``\\n``, ``\\u202e``), never raw.
"""

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptaudit.outputs import job_errors
from ckptaudit import safe_load_checkpoint
from ckptaudit.terminal_text import shown

REPO = Path(__file__).resolve().parents[1]
#: what must never reach a terminal raw (the separators between lines are the program's own "\n")
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
FORGED = "ckptaudit: RESUME from forged_999999.pt (step 999999), no steps lost"
HOSTILE = {
    "osc_title": "ckpt_000200\x1b]0;owned\x07.pt",
    "csi_clear": "ckpt_000300\x1b[2J\x1b[H.pt",
    "newline_forgery": f"ckpt_000400\n{FORGED}\n.pt",
    "bidi_override": "ckpt_000500\u202elive.pt",
    "carriage_return": f"ckpt_000600\r{FORGED}.pt",
    "c1_csi": "ckpt_000700\x9b2J.pt",
}


def test_shown_escapes_every_steering_character_and_nothing_else():
    assert shown("a\x1b]0;t\x07b\nc\rd\te\u202ef\x9bg\u2028h") == "a\\x1b]0;t\\x07b\\nc\\rd\\te\\u202ef\\x9bg\\u2028h"
    assert shown("ckpt_000100.pt é 中文 — ok") == "ckpt_000100.pt é 中文 — ok"


def _hostile_run(d: Path) -> Path:
    import torch

    d.mkdir()
    good = {"model": {"w": torch.ones(4)}, "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
            "iter_num": 100}
    torch.save(good, d / "ckpt_000100.pt")
    for i, name in enumerate(HOSTILE.values()):
        p = d / name
        torch.save({**good, "iter_num": 200 + 100 * i, "model": {f"w\x1b[31m{i}\n{FORGED}": torch.ones(4)}}, p)
        with open(p, "r+b") as f:  # cut short: each hostile unit gets a line of its own in the summary
            f.truncate(p.stat().st_size // 2)
    return d


def _assert_clean(text: str) -> None:
    assert not RAW.search(text), [ln for ln in text.split("\n") if RAW.search(ln)][:3]
    assert FORGED not in text.split("\n")  # no line of its own, whatever prefix
    assert not any(ln.startswith("ckptaudit: RESUME from forged") for ln in text.split("\n"))


def test_summary_and_exit_lines_of_an_audit_of_hostile_names(tmp_path):
    run = _hostile_run(tmp_path / "run")
    p = subprocess.run([sys.executable, "-m", "ckptaudit.cli", "audit", str(run), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]  # roll back to ckpt_000100.pt
    assert out.splitlines()[0].startswith("ckptaudit: RESUME from ckpt_000100.pt (step 100)"), out[-3000:]
    _assert_clean(out)
    for name in HOSTILE.values():  # each damaged unit is still named, escaped
        assert shown(name) in out, (shown(name), out[-3000:])


def test_reader_logs_and_error_name_hostile_units_escaped(tmp_path, caplog):
    run = _hostile_run(tmp_path / "run")
    with caplog.at_level(logging.WARNING, logger="ckptaudit"):
        ckpt = safe_load_checkpoint(run)
    assert ckpt.unit == "ckpt_000100.pt"
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert len(caplog.records) == len(HOSTILE) + 1
    _assert_clean(logged)
    (run / "ckpt_000100.pt").unlink()
    from ckptaudit.safe_load import NoUsableCheckpointError

    with pytest.raises(NoUsableCheckpointError) as e:
        safe_load_checkpoint(run)
    _assert_clean(str(e.value))


def test_failed_job_lines_escape_what_the_run_put_in_wildcards_and_logs(tmp_path):
    log = tmp_path / "x.log"
    log.write_text(f"Traceback (most recent call last):\n  ...\nValueError: bad unit \x1b]0;t\x07\u202e{FORGED}\n")
    job = type("J", (), {"rule": type("R", (), {"name": "hash"})(), "wildcards": {"part": "p\x1b[2J\n" + FORGED},
                         "log": [str(log)]})()
    lines = job_errors.job_lines([job])
    assert len(lines) == 1
    _assert_clean("\n".join(lines))
    assert lines[0].startswith("hash p\\x1b[2J\\nckptaudit: RESUME from forged")
