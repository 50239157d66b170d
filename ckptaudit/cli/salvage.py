"""``ckptaudit salvage UNIT --out DIR``: every proven-intact tensor of a damaged unit, as a warm start.

Exit codes: 0 — tensors were salvaged (``--out`` holds them and ``salvage.json``); 1 — none could be proven
intact (``--out`` holds the report alone); 3 — refused or failed (a missing unit, an ``--out`` inside the run
folder or the unit, or one that exists), one line on stderr.
"""

from __future__ import annotations

import json
import sys

import click

from ..terminal_text import shown
from .common import EXIT_FAILED, ExitThreeOnUsageError


@click.command("salvage", cls=ExitThreeOnUsageError)
@click.argument("unit")
@click.option("--out", "out_dir", required=True, metavar="DIR",
              help="New folder for the salvaged safetensors and salvage.json (outside the run folder).")
@click.option("--fill-from", "fill_from", default=None, metavar="OLDER_UNIT",
              help="An older unit of the same structure: each tensor not salvaged is taken from it when intact there.")
@click.option("--run", "run_dir", default=None, metavar="RUN_DIR",
              help="The run folder --out must stay out of (default: the unit's parent folder).")
@click.option("--include-unproven", is_flag=True,
              help="Also write tensors whose bytes are all there but nothing checks (safetensors without manifest).")
@click.option("--json", "as_json", is_flag=True, help="Print salvage.json instead of the summary.")
def salvage_command(unit, out_dir, fill_from, run_dir, include_unproven, as_json):
    """Write every tensor of UNIT whose bytes are proven intact (zip record CRC-32, manifest chunk digests)
    into a new folder, with a report of each tensor: intact, lost, unproven or suspect.  Nothing is
    unpickled; UNIT is only read.  The result is a warm start, never a resume."""
    from ..salvage import SalvageRefused, salvage

    try:
        report = salvage(unit, out_dir, fill_from=fill_from, run_dir=run_dir, include_unproven=include_unproven)
    except SalvageRefused as e:
        click.echo(f"ckptaudit salvage: refused: {shown(e)}", err=True)
        sys.exit(EXIT_FAILED)
    except OSError as e:
        click.echo(f"ckptaudit salvage: {type(e).__name__}: {shown(e)}", err=True)
        sys.exit(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(summary(report, out_dir))
    sys.exit(0 if report["written"] else 1)


def summary(report: dict, out_dir: str) -> str:
    """The lines printed for a salvage ``report`` written into ``out_dir``."""
    c = report["counts"]
    named = sum(c.values())
    lines = [f"salvage of {shown(report['unit'])} (step {report['step']}): {c['intact']} of {named} tensors proven "
             f"intact ({100 * report['intact_share']:.1f} % of their bytes), {c['lost']} lost, "
             f"{c['unproven']} unproven, {c['suspect']} suspect"]
    if report["fill_from"]:
        lines.append(f"  {report['filled']} filled from {shown(report['fill_from'])}")
    for f in report["files"]:
        if f["problem"]:
            lines.append(f"  {shown(f['file'])}: {shown(f['problem'])}")
    if report["written"]:
        outs = ", ".join(shown(v) for v in report["outputs"].values())
        lines.append(f"  wrote {report['written']} tensors to {shown(out_dir)}/ ({outs}); report: salvage.json")
        first = _top_key(report)
        take = (f"{{k[{len(first) + 1}:]: v for k, v in sd.items() if k.startswith({first + '.'!r})}}" if first
                else "sd")
        lines.append("  a warm start, not a resume: keys are the tensors' paths in the saved object; "
                     f"sd = safetensors.torch.load_file(path); model.load_state_dict({take}, strict=False), "
                     "and check the missing keys it returns")
    else:
        lines.append(f"  nothing proven intact; the report is in {shown(out_dir)}/salvage.json")
    return "\n".join(lines)


def _top_key(report: dict) -> str:
    """The first path component under which most tensor bytes lie (``model`` of ``model.fc.weight``), leaving
    out an optimizer state_dict (its tensors sit under ``<key>.state.<n>``), or "" when there is one."""
    if all(f["kind"] != "torch_zip" for f in report["files"]):  # safetensors: already a flat state_dict
        return ""
    tops: dict = {}
    every = set()
    for t in report["tensors"]:
        parts = t["name"].split(".")
        every.add(parts[0])
        if len(parts) > 1 and parts[1] != "state":
            tops[parts[0]] = tops.get(parts[0], 0) + t["nbytes"]
    return max(tops, key=tops.get) if tops and len(every) > 1 else ""
