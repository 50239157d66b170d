"""``python -m ckptaudit.drill run|dated|child|status``: the entry point of rules/drill.smk and of the drill child."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from .child import child_main
from .contract import EXIT_FAILED
from .outputs import copy_dated
from .parent import run_drill
from ..terminal_text import shown, shown_lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m ckptaudit.drill run|child|dated|status …``: ``run`` and ``dated`` are what
    rules/drill.smk calls; ``status DRILL_JSON`` prints the summary and exits with the drill's code."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ckptaudit.drill", description="Restore drill: \"it loads\" is not \"it resumes\".")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="drill the verdict's rollback point (or --unit)")
    r.add_argument("--verdict", required=True)
    g = r.add_mutually_exclusive_group(required=True)
    g.add_argument("--out-dir", help="folder for drill.parquet, drill.json, drill.html and the children's files")
    g.add_argument("--out-parquet", help="path of drill.parquet; the other outputs go next to it")
    r.add_argument("--run-dir", default=None, help="default: the verdict's run_dir")
    r.add_argument("--config-json", default="{}", help="the drill block as JSON")
    r.add_argument("--unit", default=None)
    r.add_argument("--exit-zero", action="store_true", help="exit 0 once the outputs are written (Snakemake)")
    c = sub.add_parser("child", help="internal: the fresh process that restores one unit on one device")
    c.add_argument("--spec", required=True)
    c.add_argument("--out", required=True)
    d = sub.add_parser("dated", help="copy reports into a dated folder")
    d.add_argument("--date", required=True)
    d.add_argument("--summary", required=True, help="path of summary.txt; the copies go next to it")
    d.add_argument("--drill-json", required=True)
    d.add_argument("files", nargs="+")
    st = sub.add_parser("status", help="print a drill.json's summary line and exit with its exit code")
    st.add_argument("drill_json")
    a = ap.parse_args(argv)
    if a.cmd == "status":
        try:
            doc = json.loads(Path(a.drill_json).read_text())
        except (OSError, ValueError) as e:
            print(shown(f"ckptaudit drill: DRILL FAILED: {a.drill_json}: {e}"))
            return EXIT_FAILED
        print(shown_lines(doc["summary"].split("\n")))
        return int(doc["exit_code"])
    if a.cmd == "child":
        return child_main(a.spec, a.out)
    if a.cmd == "dated":
        copy_dated(a.files, str(Path(a.summary).parent), a.date, a.drill_json)
        return 0
    out_dir = a.out_dir or str(Path(a.out_parquet).parent)
    drill_block = json.loads(a.config_json)
    rows, code = run_drill(a.run_dir, out_dir, {"drill": drill_block}, a.unit, verdict=a.verdict)
    print(shown_lines(json.loads((Path(out_dir) / "drill.json").read_text())["summary"].split("\n")))
    return 0 if a.exit_zero else code


if __name__ == "__main__":
    sys.exit(main())
