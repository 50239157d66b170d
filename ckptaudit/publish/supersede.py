"""A unit of the name a publish is about to write, moved aside: the resume went back past it.

After a rollback (``safe_load_checkpoint`` skipped the damaged ``ckpt_000120.pt`` and the loop resumed at step
100), the next save of step 120 meets the old, damaged unit of that name.  Refusing it stopped the job at every
restart (a new user's trial: resume at 100, crash at 120, forever); deleting it would destroy the evidence and
the bytes ``ckptaudit salvage`` can still use.  :func:`supersede` moves the unit, with its sidecar and manifest,
into ``<run>/.ckptaudit-superseded/<UTC time>-<name>/`` (a rename in the same file system: nothing is copied or
lost) and the publish goes on.  The audit never takes a unit there for a rollback point
(:data:`ckptaudit._io.SUPERSEDED_DIR`); delete the folder once the incident is understood.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from .._io import SUPERSEDED_DIR, fsync_dir
from .names import SIDECAR_SUFFIX

log = logging.getLogger("ckptaudit.publish")


def supersede(run_dir: Path, name: str) -> Path:
    """Move unit ``name`` of ``run_dir`` (a file or a folder) and its ``.sha256`` sidecar and
    ``.manifest.json`` manifest into a new folder under ``run_dir/.ckptaudit-superseded/``; return that folder.
    Logs one warning.  Raises ``OSError`` when a rename fails (what was moved stays moved: a second publish
    finds the name free or retries the rest)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest = run_dir / SUPERSEDED_DIR / f"{stamp}-{os.getpid()}-{name}"
    dest.mkdir(parents=True)
    for n in (name + SIDECAR_SUFFIX, name + ".manifest.json", name):  # digests first: never beside other bytes
        if os.path.lexists(run_dir / n):
            os.rename(run_dir / n, dest / n)
    fsync_dir(dest)
    fsync_dir(run_dir)
    log.warning("%s: a unit of this name was already there (the run was resumed from an earlier step); it was "
                "moved, with its digests, to %s and is kept there, never a rollback point: delete that folder once "
                "the incident is understood", run_dir / name, dest)
    return dest
