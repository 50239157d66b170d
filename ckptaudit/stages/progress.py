"""Progress of the hash stage: jobs write bytes done of total to small files, the CLI parent reads and draws them.

Stage jobs run with their stderr in log files, so a job cannot draw on the user's terminal.
Instead each hash job writes ``done total`` (bytes) of each unit it hashes to a file under the
folder named by the environment variable :data:`ENV` (``<out>/work/progress/`` when
``ckptaudit audit`` started the workflow; unset otherwise, and then nothing is written).
:class:`ProgressWriter` limits itself to a few writes per second; :func:`read_progress` sums
the files and :func:`line` says it as ``hashed 1.2 GiB of 4.0 GiB, 310 MiB/s, ETA 9 s``.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Optional, Tuple

#: environment variable naming the progress folder (set by ``ckptaudit audit`` for the jobs it starts)
ENV = "CKPTAUDIT_PROGRESS_DIR"
#: at most this many writes per second per writer
WRITES_PER_SECOND = 4


class ProgressWriter:
    """``done total`` bytes of one piece of work in the file ``path``, rewritten (atomically) at most
    :data:`WRITES_PER_SECOND` times a second; :meth:`close` writes the last count."""

    def __init__(self, path: str | Path, total_bytes: int):
        self.path = Path(path)
        self.total = int(total_bytes or 0)
        self.done = 0
        self._last = 0.0
        self._lock = threading.Lock()  # files of one unit may be read on several threads
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._write()

    def add(self, n: int) -> None:
        """Count ``n`` more bytes done; write when the last write is older than 1/WRITES_PER_SECOND s."""
        with self._lock:
            self.done += int(n or 0)
            now = time.monotonic()
            if now - self._last >= 1.0 / WRITES_PER_SECOND:
                self._write(now)

    def close(self) -> None:
        with self._lock:
            self._write()

    def _write(self, now: Optional[float] = None) -> None:
        self._last = time.monotonic() if now is None else now
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(f"{self.done} {self.total}\n")
            os.replace(tmp, self.path)
        except OSError:  # progress is a courtesy: a full disk must not fail the audit
            pass


class _NullWriter:
    """What :func:`for_unit` returns when no progress folder is set: counts nothing, writes nothing."""

    def add(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


NULL = _NullWriter()


def for_unit(unit: dict):
    """The writer of one inventory unit (``unit["unit"]``, ``unit["size_bytes"]``) under ``$CKPTAUDIT_PROGRESS_DIR``,
    or :data:`NULL` when the variable is unset."""
    where = os.environ.get(ENV, "")
    if not where:
        return NULL
    name = hashlib.sha1(str(unit.get("unit", "")).encode()).hexdigest()[:16]
    return ProgressWriter(Path(where) / f"{name}.progress", int(unit.get("size_bytes") or 0))


class CountingReader:
    """A binary reader that tells ``writer`` how many bytes each ``readinto`` returned (for
    :func:`hashlib.file_digest`, which reads with ``readinto``)."""

    def __init__(self, fh, writer):
        self._fh, self._writer = fh, writer

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = self._fh.readinto(buf)
        if n:
            self._writer.add(n)
        return n


def read_progress(folder: str | Path) -> int:
    """Bytes done, summed over every progress file in ``folder`` (0 when there is none)."""
    return read_files(folder)[0]


def read_files(folder: str | Path) -> Tuple[int, int, int]:
    """(bytes done, bytes total, files) summed over the progress files in ``folder``."""
    done = total = n = 0
    for p in Path(folder).glob("*.progress"):
        try:
            d, t = (int(x) for x in p.read_text().split()[:2])
        except (OSError, ValueError):
            continue
        done, total, n = done + d, total + t, n + 1
    return done, total, n


def size_text(n: float) -> str:
    """``312 B``, ``4.0 KiB``, ``1.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def line(done: int, total: int, seconds: float, since: int = 0) -> str:
    """``hashed 1.2 GiB of 4.0 GiB (30%), 310.0 MiB/s, ETA 9 s``: the rate is ``done - since`` bytes over
    ``seconds`` (said once both are positive); once ``done`` reaches ``total``, what runs after hashing."""
    if 0 < total <= done:
        return f"hashed all {size_text(total)}; scanning, load-testing and checking the units"
    head = f"hashed {size_text(done)} of {size_text(total)}"
    if total > 0:
        head += f" ({min(100, int(100 * done / total))}%)"
    if seconds <= 0 or done - since <= 0:
        return head
    rate = (done - since) / seconds
    out = f"{head}, {size_text(rate)}/s"
    if total > done:
        out += f", ETA {_duration(int((total - done) / rate))}"
    return out


def _duration(s: int) -> str:
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s" if s < 3600 else f"{s // 3600} h {s % 3600 // 60:02d} min"


def totals(inventory_json: str | Path) -> Tuple[int, int]:
    """(units, bytes) of an inventory document; (0, 0) while it is not written yet."""
    import json

    try:
        units = json.loads(Path(inventory_json).read_text())["units"]
    except (OSError, ValueError, KeyError):
        return 0, 0
    return len(units), sum(int(u.get("size_bytes") or 0) for u in units)
