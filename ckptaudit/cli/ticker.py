"""The one updating progress line ``ckptaudit audit`` draws on a terminal while the workflow hashes.

The hash jobs write their bytes done under ``<out>/work/progress/`` (:mod:`ckptaudit.stages.progress`,
switched on by ``$CKPTAUDIT_PROGRESS_DIR``); a thread of the CLI reads them a few times a second
and rewrites one stderr line.  When stderr is not a terminal (cron, CI, a pipe) nothing is drawn.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..stages import progress
from ..terminal_text import shown

#: seconds between two redraws
PERIOD = 0.5


@contextmanager
def progress_line(workdir: Path, stream=None) -> Iterator[None]:
    """Set ``$CKPTAUDIT_PROGRESS_DIR`` to a fresh ``workdir/work/progress`` for the jobs started inside, and
    draw ``hashed … of …, rate, ETA`` on ``stream`` (stderr) while inside, when it is a terminal."""
    stream = stream or sys.stderr
    folder = workdir / "work" / "progress"
    shutil.rmtree(folder, ignore_errors=True)  # our own output folder: last run's counts are stale
    folder.mkdir(parents=True, exist_ok=True)
    old = os.environ.get(progress.ENV)
    os.environ[progress.ENV] = str(folder)
    stop = threading.Event()
    drawer = None
    if getattr(stream, "isatty", lambda: False)():
        drawer = threading.Thread(target=_draw, args=(folder, workdir / "work" / "inventory.json", stream, stop),
                                  daemon=True)
        drawer.start()
    try:
        yield
    finally:
        stop.set()
        if drawer is not None:
            drawer.join(2 * PERIOD)
        if old is None:
            os.environ.pop(progress.ENV, None)
        else:
            os.environ[progress.ENV] = old


class Meter:
    """What the progress line says now: bytes done (summed over the jobs' files) of the total, with the rate
    measured from the first bytes seen.  The total is the inventory's, or the sum of the progress files' own
    totals once every unit has one."""

    def __init__(self, folder: Path, inventory: Path, clock=time.monotonic):
        self.folder, self.inventory, self.clock = folder, inventory, clock
        self.t0 = None
        self.base = 0
        self.units, self.total = 0, 0

    def text(self) -> str:
        """The line, or "" while nothing has been hashed yet."""
        done, file_total, files = progress.read_files(self.folder)
        if done <= 0:
            return ""
        if self.t0 is None:
            self.t0, self.base = self.clock(), done
        if not self.total:
            self.units, self.total = progress.totals(self.inventory)
        total = file_total if files and files >= self.units else self.total
        return progress.line(done, total, self.clock() - self.t0, since=self.base)


def _draw(folder: Path, inventory: Path, stream, stop: threading.Event) -> None:
    meter, width, last = Meter(folder, inventory), 0, ""
    while not stop.wait(PERIOD):
        text = shown(meter.text())
        if text and text != last:
            last = text
            stream.write("\r" + text.ljust(width))
            stream.flush()
            width = len(text)
    if width:
        stream.write("\r" + " " * width + "\r")
        stream.flush()
