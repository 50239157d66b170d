"""Whether the run folder can be audited at all: it exists, it is a folder, and it holds a checkpoint unit.

A wrong path is not a lost run: a missing path, a file, an empty folder or one holding only
files that are not checkpoints (logs, configs, notes) stop the audit with exit 3 and say what
was found and ignored, instead of a verdict of "retrain" (exit 2).  :func:`check_run_dir` runs
before the workflow (the CLI and ``rules/common.smk``); :func:`require_units` runs in the
inventory job, on what it found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict

#: how many ignored file names the error lists before "and N more"
LISTED = 8


def check_run_dir(run_dir: str | Path) -> None:
    """Raise ``ValueError`` with a one-line reason when a local ``run_dir`` does not exist or is not a folder.

    An ``s3://`` run is listed once (:func:`ckptaudit.fs.reach.remote_problem`, with the ``s3:`` settings
    already applied): no credentials or an endpoint that does not answer is one line here, not a traceback
    in the first job; the rest is the inventory stage's to say."""
    if "://" in str(run_dir):
        import os

        from .fs.reach import remote_problem

        problem = remote_problem(str(run_dir), endpoint=os.environ.get("CKPTAUDIT_S3_ENDPOINT_URL", ""))
        if problem:
            raise ValueError(problem)
        return
    p = Path(run_dir)
    if not p.exists():
        raise ValueError(f"{run_dir}: does not exist (nothing there: not a folder, not a file); "
                         "give the folder that holds the run's checkpoints")
    if not p.is_dir():
        raise ValueError(f"{run_dir}: is a file, not a folder; give the folder that holds the run's checkpoints")


def no_units_message(doc: Dict) -> str:
    """The one-line reason an inventory with neither a unit nor a pointer cannot be audited ("" when it can)."""
    if doc.get("units") or doc.get("pointers"):
        return ""
    stray = list(doc.get("stray_files") or [])
    where = doc.get("run_dir", "")
    if not stray:
        return f"{where}: the folder is empty: no checkpoint in it; is this the run's checkpoint folder?"
    shown = ", ".join(stray[:LISTED]) + (f" and {len(stray) - LISTED} more" if len(stray) > LISTED else "")
    return (f"{where}: no checkpoint found; ignored {len(stray)} file{'s' * (len(stray) != 1)} that are not "
            f"checkpoints: {shown}; is this the run's checkpoint folder?")


def check_has_units(run_dir: str) -> None:
    """Raise ``ValueError`` when ``run_dir`` does not exist, is a file, or holds no checkpoint unit (for the
    commands that act on a run without the workflow: ``seal``, ``prune``)."""
    from .inventory import run_inventory

    check_run_dir(run_dir)
    msg = no_units_message(run_inventory(run_dir))
    if msg:
        raise ValueError(msg)


def require_units(doc: Dict) -> Dict:
    """``doc`` when it holds a unit or a pointer; otherwise exit 3 with :func:`no_units_message` on stderr."""
    msg = no_units_message(doc)
    if msg:
        import sys

        print(f"ckptaudit: error: {msg}", file=sys.stderr, flush=True)
        raise SystemExit(3)
    return doc
