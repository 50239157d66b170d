"""What a drill writes: drill.parquet, drill.json, drill.html, the summary line, and the dated nightly copies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from .._io import atomic_write
from ..text import clip, step_text
from .contract import CHECKS, EXIT_FAILED, EXIT_NO_UNIT, EXIT_PROBLEM, INFRA_CHECKS, STATUS_WORDS


def summary_line(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """One line for cron mail and CI logs."""
    code = doc.get("exit_code", EXIT_FAILED)
    head = f"ckptaudit drill: {STATUS_WORDS[code]}"
    where = f" {doc['unit']} ({step_text(doc.get('step'))})" if doc.get("unit") else ""

    def short(s: str, n: int = 180) -> str:
        return clip(s, n)  # at a word boundary, ended with …

    if code == EXIT_NO_UNIT:
        why = next((r["message"] for r in rows if r["check"] == "eligibility"), "")
        return f"{head}: {short(why)}"
    if code in (EXIT_PROBLEM, EXIT_FAILED):
        bad = [r for r in rows if r["status"] == "fail" and (code == EXIT_FAILED or r["check"] not in INFRA_CHECKS)]
        parts = [f"{r['check']}@{r.get('device') or '-'}: {short(r['message'], 140)}" for r in bad[:3]]
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        return f"{head}{where}: " + "; ".join(parts) + more
    ran = [d["device"] for d in doc.get("devices", []) if d.get("outcome") != "skipped"]
    skipped = [d["device"] for d in doc.get("devices", []) if d.get("outcome") == "skipped"]
    n_pass = sum(r["status"] == "pass" for r in rows)
    warns = sorted({f"{r['check']}@{r.get('device')}" for r in rows if r["status"] == "warn"})
    tail = f"; {len(warns)} warning(s): {', '.join(warns)}" if warns else ""
    sk = f"; skipped: {', '.join(skipped)} (not available)" if skipped else ""
    return f"{head}{where} on {', '.join(ran)}: {n_pass} checks passed{tail}{sk}"


def write_outputs(out: Path, doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
    """``drill.parquet`` (table ``drill`` of :mod:`ckptaudit.tables`), ``drill.json`` and a self-contained
    ``drill.html`` in ``out``."""
    from .. import tables  # pyarrow: imported when a drill writes, not when the package is imported
    from ..schemas import check_drill

    check_drill(json.loads(json.dumps(doc, default=str)))  # as it will be read back
    tables.write("drill", [dict(r) for r in rows], out / "drill.parquet")
    atomic_write(out / "drill.json", (json.dumps(doc, indent=2, default=str) + "\n").encode())
    atomic_write(out / "drill.html", render_html(doc, rows).encode())


def render_html(doc: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    """The drill report section (``templates/drill.html.j2``): one self-contained page, with the
    continuation loss and LR against the schedule as inline SVG (:func:`ckptaudit.charts.drill_charts`)."""
    from ..outputs import templating
    from .._version import __version__
    from ..charts import drill_charts

    return templating.render(
        "drill.html.j2", doc=doc, rows=rows, checks=CHECKS, version=__version__, charts=drill_charts(doc),
        devices=[d["device"] for d in doc.get("devices", [])] or [""],
        mib=lambda b: templating.mib(b, "-"))


def copy_dated(src_files: Sequence[str], out_dir: str, date: str, drill_json: str) -> None:
    """Copy the drill (and audit) reports into ``out_dir`` and write ``summary.txt`` (date + summary)."""
    import shutil

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in src_files:
        shutil.copy2(f, out / Path(f).name)
    doc = json.loads(Path(drill_json).read_text())
    (out / "summary.txt").write_text(f"{date} exit {doc['exit_code']} {doc['summary']}\n")
