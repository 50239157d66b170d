"""The finding catalogue is the single source of kinds, and the README shows it."""

import re
from pathlib import Path

from ckptaudit import findings as F

from .conftest import REPO


def test_every_kind_used_in_code_is_catalogued():
    used = set()
    for p in (REPO / "ckptaudit").rglob("*.py"):
        used |= set(re.findall(r'make\(\s*"([a-z0-9_]+)"', p.read_text()))
    assert used, "no finding construction found"
    assert sorted(used - set(F.CATALOGUE)) == []


def test_catalogue_entries_are_complete():
    for k in F.CATALOGUE.values():
        assert k.layer in F.LAYERS and k.severity in F.SEVERITIES and k.caps in F.USES, k.kind
        assert re.fullmatch(r"[a-z][a-z0-9_]+", k.kind)
        assert k.message and k.next_step


def test_make_renders_and_keeps_values():
    f = F.make("checksum_mismatch", path="ckpt_000300.pt", actual="ab" * 32, expected="cd" * 32,
               source="sidecar ckpt_000300.pt.sha256")
    assert f.layer == "file" and f.severity == "error" and f.caps == "none"
    assert f.message == ("ckpt_000300.pt: SHA-256 is " + "ab" * 32 + " but its sidecar ckpt_000300.pt.sha256 "
                         "records " + "cd" * 32 + ": the bytes changed after they were written (silent corruption, "
                         "an interrupted copy, or a later partial overwrite).")
    assert f.detail["expected"] == "cd" * 32


def test_usable_for_is_the_minimum_cap():
    assert F.usable_for([]) == "resume"
    fs = [F.make("missing_scheduler_state", path="x", step=6), F.make("missing_optimizer_state", path="x")]
    assert F.usable_for(fs) == "warm-start"
    assert F.usable_for(fs + [F.make("empty_file", path="x")]) == "none"


def test_readme_catalogue_is_current():
    text = (REPO / "docs" / "findings.md").read_text()
    assert F.catalogue_markdown() in text, "run `ckptaudit findings --update-readme`"
