"""Whether the run folder can be audited at all: it exists, it is a folder, and it holds a checkpoint unit.

A wrong path is not a lost run: a missing path, a file, an empty folder or one holding only
files that are not checkpoints (logs, configs, notes) stop the audit with exit 3 and say what
was found and ignored, instead of a verdict of "retrain" (exit 2).  :func:`check_run_dir` runs
before the workflow (the CLI and ``rules/common.smk``); :func:`require_units` runs in the
inventory job, on what it found.  A folder holding several runs (:func:`runs_in`) stops the same way: one
rollback point for two runs would name the other run's checkpoint.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List

#: how many ignored file names the error lists before "and N more"
LISTED = 8


def check_run_dir(run_dir: str | Path) -> None:
    """Raise ``ValueError`` with a one-line reason when a local ``run_dir`` does not exist or is not a folder.

    An ``s3://`` run is listed once (:func:`ckptaudit.fs.reach.remote_problem`, with the ``s3:`` settings
    already applied): no credentials or an endpoint that does not answer is one line here, not a traceback
    in the first job; the rest is the inventory stage's to say."""
    if "://" in str(run_dir):
        import os

        from ...fs.reach import remote_problem

        problem = remote_problem(str(run_dir), endpoint=os.environ.get("CKPTAUDIT_S3_ENDPOINT_URL", ""))
        if problem:
            raise ValueError(problem)
        return
    p = Path(run_dir)
    if not p.exists():
        raise ValueError(f"{run_dir}: does not exist (nothing there: not a folder, not a file); "
                         "give the folder that holds the run's checkpoints")
    if not p.is_dir():
        from ...layouts import is_checkpoint_file

        if p.is_file() and is_checkpoint_file(p.name):  # one checkpoint file: audited as that unit
            return
        raise ValueError(f"{run_dir}: is a file, not a folder or a checkpoint file; give the folder that holds the "
                         "run's checkpoints")


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


#: sub-folders that hold one rank's files of the same run (NVRx ``<session>/<rank>/``, ``rank_3/``, ``mp_rank_00``)
_RANK_FOLDER = re.compile(r"^\d+$|rank", re.IGNORECASE)


def runs_in(doc: Dict) -> Dict[str, List[int]]:
    """``{sub-folder: its units' name steps}`` of the inventory ``doc`` when its folder holds several runs of their
    own, else ``{}``.

    A run is a series of saves; two sub-folders (or the folder's own files, ``"."``) that each hold a series of
    at least two finished units numbered by step, and that share a step number, are two runs: one training job
    does not save step 500 twice in two places.  A sub-folder named like a rank (``0/``, ``rank_1/``) is one
    rank's part of the same run; a series that starts after another ends is the same run continued."""
    series: Dict[str, set] = {}
    for u in doc.get("units") or []:
        if u.get("in_progress") or u.get("step_from_name") is None:
            continue
        top = u["unit"].split("/", 1)[0] if "/" in u["unit"] else "."
        if top != "." and _RANK_FOLDER.search(top):
            continue
        series.setdefault(top, set()).add(int(u["step_from_name"]))
    series = {k: v for k, v in series.items() if len(v) >= 2}
    clash = {a for a in series for b in series if a != b and series[a] & series[b]}
    return {k: sorted(series[k]) for k in sorted(clash)} if len(clash) >= 2 else {}


def several_runs_message(doc: Dict) -> str:
    """The one-line reason an inventory that holds several runs (:func:`runs_in`) gets no single verdict, naming
    each run and how to audit it ("" for one run)."""
    runs = runs_in(doc)
    if not runs:
        return ""
    where = doc.get("run_dir", "")
    each = "; ".join(f"{name}/ ({len(steps)} saves, steps {steps[0]}–{steps[-1]})" if name != "." else
                     f"its own files ({len(steps)} saves, steps {steps[0]}–{steps[-1]})" for name, steps in runs.items())
    how = " and ".join(f"ckptaudit audit {where}/{name} --out <folder>" for name in runs if name != ".")
    return (f"{where}: holds {len(runs)} runs of their own, each saving the same steps: {each}; a rollback point "
            f"taken across runs would name another run's checkpoint, so audit each run alone: {how}")


def check_one_run(doc: Dict) -> Dict:
    """``doc`` when it is one run; ``ValueError`` (:func:`several_runs_message`) when its folder holds several."""
    msg = several_runs_message(doc)
    if msg:
        raise ValueError(msg)
    return doc


def check_has_units(run_dir: str) -> None:
    """Raise ``ValueError`` when ``run_dir`` does not exist, is a file, or holds no checkpoint unit (for the
    commands that act on a run without the workflow: ``seal``, ``prune``)."""
    from . import run_inventory

    check_run_dir(run_dir)
    msg = no_units_message(run_inventory(run_dir))
    if msg:
        raise ValueError(msg)


def require_units(doc: Dict) -> Dict:
    """``doc`` when it holds a unit or a pointer and is one run; otherwise exit 3 with :func:`no_units_message` or
    :func:`several_runs_message` on stderr."""
    msg = no_units_message(doc) or several_runs_message(doc)
    if msg:
        import sys

        print(f"ckptaudit: error: {msg}", file=sys.stderr, flush=True)
        raise SystemExit(3)
    return doc
