"""``ckptaudit salvage UNIT --out DIR``: every proven-intact tensor of a damaged unit, as a warm start.

Exit codes: 0 — tensors of the unit itself were salvaged (``--out`` holds them and ``salvage.json``); 1 — none
of its own could be proven intact (``--out`` holds the report, and what ``--fill-from`` gave, if anything);
3 — refused or failed (a missing unit, a path that is no checkpoint unit, an ``--out`` inside the run folder or
the unit, or one that exists; a file that cannot be read; any unexpected error, whose traceback is written to a
log file the line names), one line on stderr, and nothing published under ``--out``.
"""

from __future__ import annotations

import json
import os
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
    """Write every tensor of UNIT proven intact (its bytes and the bytes that name it: zip record CRC-32,
    manifest chunk digests, whole-file SHA-256) into a new folder, with a report of each tensor: intact, lost,
    unproven or suspect, and what proved it.  Nothing is unpickled; UNIT is only read.  The result is a warm
    start, never a resume."""
    from ..salvage import SalvageRefused, salvage

    try:
        report = salvage(unit, out_dir, fill_from=fill_from, run_dir=run_dir, include_unproven=include_unproven)
    except SalvageRefused as e:
        click.echo(f"ckptaudit salvage: refused: {shown(e)}", err=True)
        sys.exit(EXIT_FAILED)
    except OSError as e:
        click.echo(f"ckptaudit salvage: {type(e).__name__}: {shown(e)}", err=True)
        sys.exit(EXIT_FAILED)
    except Exception as e:  # noqa: BLE001 - never exit 1 (that means "nothing proven"): 3, one line, the log
        click.echo(f"ckptaudit salvage: failed: {type(e).__name__}: {shown(e)} (traceback: {_log_traceback()}); "
                   f"nothing was published under {shown(out_dir)}", err=True)
        sys.exit(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo(summary(report, out_dir))
    sys.exit(0 if report["counts"]["intact"] and report["written"] else 1)


def _log_traceback() -> str:
    """Write the current exception's traceback to a new file in the temp folder; returns its path."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="ckptaudit-salvage-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(f"ckptaudit salvage {' '.join(sys.argv[1:])}\n")
        traceback.print_exc(file=f)
    return path


def summary(report: dict, out_dir: str) -> str:
    """The lines printed for a salvage ``report`` written into ``out_dir``."""
    from ..salvage_option import share_words

    c = report["counts"]
    named = sum(c.values())
    step = "step unknown" if report["step"] is None else f"step {report['step']}"
    lines = [f"salvage of {shown(report['unit'])} ({step}): {c['intact']} of {named} tensors proven "
             f"intact, {c['lost']} lost, {c['unproven']} unproven, {c['suspect']} suspect",
             f"  {share_words(report['shares'])} are proven intact"]
    if report["fill_from"]:
        nf = report.get("not_filled") or {}
        why = [f"{nf[k]} {w}" for k, w in (("absent", "have no tensor of that name there"),
                                           ("not_intact", "are not proven intact there"),
                                           ("different", "differ there in dtype or shape")) if nf.get(k)]
        lines.append(f"  {report['filled']} filled from {shown(report['fill_from'])}"
                     + (f"; not filled: {', '.join(why)}" if why else ""))
    for f in report["files"]:
        if f["problem"]:
            lines.append(f"  {shown(f['file'])}: {shown(f['problem'])}")
    if report["written"]:
        outs = ", ".join(shown(v) for v in report["outputs"].values())
        lines.append(f"  wrote {report['written']} tensors to {shown(out_dir)}/ ({outs}); report: salvage.json")
        lines.append("  a warm start, not a resume: " + load_hint(report, out_dir))
    if not c["intact"]:
        lines.append(f"  nothing of the unit itself is proven intact; the report is in {shown(out_dir)}/salvage.json")
    return "\n".join(lines)


def load_hint(report: dict, out_dir: str) -> str:
    """How to load the model weights: the written file holding the most weight bytes, and the key of the saved
    dict its state_dict sits under (``weights_prefix`` of the file, from the structure of what was saved)."""
    from pathlib import Path

    from ..intact import is_optimizer_state

    weight_bytes: dict = {}
    for t in report["tensors"]:
        if t["status"] in ("intact", "filled") and not is_optimizer_state(t["name"]):
            weight_bytes[t["file"]] = weight_bytes.get(t["file"], 0) + t["nbytes"]
    written = [f for f in report["outputs"] if f in weight_bytes] or list(report["outputs"])
    best = max(written, key=lambda f: weight_bytes.get(f, 0))
    prefix = next((f.get("weights_prefix") or "" for f in report["files"] if f["file"] == best), "")
    path = Path(out_dir) / report["outputs"][best]
    take = f"{{k[{len(prefix) + 1}:]: v for k, v in sd.items() if k.startswith({prefix + '.'!r})}}" if prefix else "sd"
    return (f"sd = safetensors.torch.load_file({str(path)!r}); missing, unexpected = "
            f"model.load_state_dict({take}, strict=False) (keys are the tensors' paths in the saved object)")
