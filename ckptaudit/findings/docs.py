"""The catalogue as Markdown: the generated ``docs/findings.md`` that the README links to."""

from __future__ import annotations

from pathlib import Path
from typing import List

from .catalogue import KINDS_IN_ORDER
from .model import LAYERS, STAGES, Kind

#: docs/findings.md, relative to the repository root (the folder of README.md)
DOCS_PATH = Path("docs") / "findings.md"


def _sorted() -> List[Kind]:
    return sorted(KINDS_IN_ORDER, key=lambda e: (LAYERS.index(e.layer), e.kind))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def catalogue_markdown() -> str:
    """The catalogue as a Markdown section: one row per kind, with its stage and detector."""
    lines = [
        "## Finding catalogue",
        "",
        "Every finding the audit can report, one row per kind. *Stage* is the Snakemake rule whose job runs the",
        "detector (`rules/<stage>.smk`, table `<stage>.parquet`; `report` is the run-level pass that writes",
        "`verdict.json`, `any` a kind every stage can raise). *Detector* is the function that decides and builds",
        "the finding (`module:function`); report.html prints both under each finding.",
        "*Unit still usable for* is the best use left to a unit carrying the finding (the verdict takes the",
        "minimum over a unit's findings). `{fields}` are filled with the unit's values.",
        "",
        "Stages: " + ", ".join(f"`{s}`" for s in STAGES) + ".",
        "",
        "| kind | layer | stage | detector | severity | unit still usable for | what it means | next step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k in _sorted():
        lines.append(f"| `{k.kind}` | {k.layer} | {k.stage} | `{k.detector}` | {k.severity} | {k.caps} | "
                     f"{_cell(k.message)} | {_cell(k.next_step)} |")
    return "\n".join(lines) + "\n"


def findings_markdown() -> str:
    """The text of ``docs/findings.md``: a title, the generation note and :func:`catalogue_markdown`."""
    return ("# Findings\n\n<!-- Generated from ckptaudit/findings/ by `ckptaudit findings --update-docs`; "
            "do not edit by hand. -->\n\n" + catalogue_markdown()
            + "\n[← README](../README.md) · [all documents](README.md)\n")


def _write_if_changed(p: Path, new: str) -> bool:
    if p.exists() and p.read_text() == new:
        return False
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(new)
    return True


def update_docs(root) -> bool:
    """(Re)write ``docs/findings.md`` under repository ``root``; True if it changed."""
    return _write_if_changed(Path(root) / DOCS_PATH, findings_markdown())


def update_readme(path) -> bool:
    """(Re)write ``docs/findings.md`` beside README ``path`` (the README links to it and no longer carries the
    table); a README that still has ``<!-- findings:start -->``/``<!-- findings:end -->`` markers gets the
    table between them too.  True if anything changed."""
    p = Path(path)
    changed = update_docs(p.parent)
    text = p.read_text()
    start, end = "<!-- findings:start -->", "<!-- findings:end -->"
    if start in text and end in text:
        i, j = text.index(start) + len(start), text.index(end)
        new = text[:i] + "\n" + catalogue_markdown() + text[j:]
        if new != text:
            p.write_text(new)
            changed = True
    return changed
