"""The ``latest`` pointer: read it, and move it forwards atomically."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

from .._io import atomic_symlink
from ..units import step_from_name
from .clock import Clock
from .files import durable_write, fsync_dir
from .names import LATEST_NAME

log = logging.getLogger("ckptaudit.publish")


def read_latest(run_dir: str | os.PathLike) -> Optional[str]:
    """The unit name in ``run_dir/latest`` (stripped), or None when there is none."""
    try:
        return (Path(run_dir) / LATEST_NAME).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def update_latest(run_dir: str | os.PathLike, unit: str, step: int, *, symlink: Optional[str] = None,
                  clock: Optional[Clock] = None) -> bool:
    """Point ``run_dir/latest`` at ``unit`` (of ``step``) atomically, only forwards.

    Writes the name (no newline, as DeepSpeed does) to a temp file, fsyncs, ``os.replace``
    onto ``latest``, fsyncs the folder; never removes then creates.  Leaves ``latest``
    alone when it names an existing unit of a later step.  ``symlink``: also point a
    symbolic link of that name at ``unit`` (``os.symlink`` to a temp name, then
    ``os.replace``).  Returns True when ``latest`` was moved.  Raises ``OSError``."""
    run_dir = Path(run_dir)
    clock = clock or Clock()
    cur = read_latest(run_dir)
    if cur is not None and cur != unit and os.path.lexists(run_dir / cur):
        cur_step = step_from_name(cur)
        if cur_step is not None and cur_step > step:
            log.info("%s: latest stays at %s (step %s > %s)", run_dir, cur, cur_step, step)
            return False
    durable_write(run_dir / LATEST_NAME, unit.encode(), clock)
    if symlink:
        atomic_symlink(run_dir / symlink, unit)
    fsync_dir(run_dir, clock)
    return True
