"""A training run that several fixtures start from, made once and copied into each.

Fixtures of one framework often begin with the same run (the clean run that one
fixture truncates and another flips a bit in; the same killed run that one
fixture keeps and another points the tracker at).  :func:`made_once` runs the
making function once per fixture folder's parent (the generator's output folder,
shared by its ``--jobs`` and by every pytest worker) under a file lock, and the
fixture copies the run out of it (``shutil.copytree(..., symlinks=True)``), so the
damage each fixture adds lands on its own copy.  The bytes are the framework's own
either way: only the number of trainings changes.
"""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path
from typing import Callable

DONE = "made.json"


def made_once(dest: Path, key: str, make: Callable[[Path], dict]) -> tuple[Path, dict]:
    """``(folder, facts)``: ``make(folder)`` run once in ``dest.parent/.shared-<key>/`` (an empty folder), and the
    JSON-able facts it returned (exit codes, …), read back from ``made.json``.

    Raises what ``make`` raises; a failed making leaves no ``made.json``, so the next caller makes it again."""
    folder = dest.parent / f".shared-{key}"
    with open(dest.parent / f".shared-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one making per folder, across processes
        if not (folder / DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            facts = make(folder)
            (folder / DONE).write_text(json.dumps(facts))
    return folder, json.loads((folder / DONE).read_text())


def copy_run(folder: Path, dest: Path) -> Path:
    """``folder/run`` copied to ``dest/run`` (links kept as links); returns the copy."""
    shutil.copytree(folder / "run", dest / "run", symlinks=True)
    return dest / "run"
