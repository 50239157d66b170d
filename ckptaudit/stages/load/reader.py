"""The reader's load test is the load it returns: one ``torch.load`` of the chosen unit per resume, not two.

In the audit each file is load-tested in a forked child with time and memory limits
(:mod:`ckptaudit.stages.load.loadtest`).  :func:`ckptaudit.safe_load_checkpoint` then loaded the unit it chose again, in
the caller's process: two loads of the same bytes and a fork per examined unit (issue 23: the fork and the
child's load were ~0.2 s of a 1.2 s resume on a 256 MiB unit).  :class:`ReaderLoads` is the load stage's
``loader`` in the reader: a torch zip or safetensors file is loaded here, in the caller's process, exactly as the
final load does it (``torch.load(weights_only=True)`` with the file's allowed globals, or
``safetensors.torch.load_file``; ``map_location`` "cpu"), its ``load`` row is what the child would report
(:func:`ckptaudit.stages.load.loaded_object.summary`), and the object is kept for the return.

Only where the load is the same risk as the final load it replaces: the file passed the file layer (the load
stage loads no file with a file-layer error, :func:`ckptaudit.stages.load.loadtest.load_units`) and the security layer, and
its kind allocates no more than the file's own records or header say (a torch zip's records, a safetensors
header checked against the file's size).  A legacy (pre-1.6) pickle, whose tensor sizes come from the pickle
itself, a caller's ``map_location`` other than "cpu", and an object-store run are load-tested in a child, as in
the audit.

The bytes loaded are the bytes verified.  The hash stage and the load each open the file by its name, so a file
renamed over the verified one (or rewritten in place) between the two would be loaded unverified.
:meth:`ReaderLoads.pin` records each file's identity (:func:`identity`: device, inode, size, mtime and ctime) before
its bytes are read for verification, and every load of the reader (:func:`load_file` with ``pin``) opens the file
once, checks that the open file is the one pinned, loads through that open file (``/proc/self/fd/N`` where the
kernel has it), and checks the identity again after the load: a rename swaps the inode, a write in place moves
the ctime (which no caller can set back).  A file that changed raises :class:`ChangedSinceVerified`.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

IN_PROCESS_KINDS = ("torch_zip", "safetensors")

#: (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of a file: what :func:`pinned` compares.
Identity = Tuple[int, int, int, int, int]


class ChangedSinceVerified(OSError):
    """A file is not the one whose bytes were verified: renamed over, or written, after :meth:`ReaderLoads.pin`."""


def identity(st: os.stat_result) -> Identity:
    """The identity of a file as :func:`os.stat`/:func:`os.fstat` give it (see :data:`Identity`)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@contextlib.contextmanager
def pinned(path: Path, pin: Optional[Identity]) -> Iterator[Tuple[str, Any]]:
    """``(name, file)`` of a file whose bytes were verified when it had identity ``pin``: ``path`` opened once
    for binary reading (``O_NONBLOCK``: a FIFO swapped in never blocks), and a name that opens that same file
    (``/proc/self/fd/N``; ``path`` itself where the kernel has no such folder, and then only ``file`` is pinned).
    The open file's identity must equal ``pin`` on entry and again on leaving; raises
    :class:`ChangedSinceVerified` (an ``OSError``) otherwise, and ``OSError`` when the file cannot be opened.
    Without ``pin``: ``(str(path), None)``, nothing opened."""
    if pin is None:
        yield str(path), None
        return
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)), "rb") as f:
        if identity(os.fstat(f.fileno())) != pin:
            raise ChangedSinceVerified(f"{path.name} changed after its bytes were verified (renamed over or "
                                       "rewritten): not loaded")
        by_fd = f"/proc/self/fd/{f.fileno()}"
        yield (by_fd if os.path.exists(by_fd) else str(path)), f
        if identity(os.fstat(f.fileno())) != pin:
            raise ChangedSinceVerified(f"{path.name} was written while it was loaded: not used")


def load_file(path: Path, layout: str, map_location: Any, benign: Sequence[str],
              kept: Optional[Dict[str, Any]] = None, rel: str = "", pin: Optional[Identity] = None) -> Any:
    """The object of one file as :func:`ckptaudit.safe_load_checkpoint` returns it: ``kept[rel]`` when the
    reader's load test already loaded it here (:class:`ReaderLoads`), else ``safetensors.torch.load_file`` for a
    safetensors file (``layout`` "safetensors" or the name says so) and ``torch.load(weights_only=True)`` with
    ``benign`` globals allowed for any other.  ``pin``: the identity the file had when its bytes were verified
    (:meth:`ReaderLoads.pin`); the load goes through one open file that must keep it (:func:`pinned`).  Raises
    what those loaders raise, and :class:`ChangedSinceVerified`."""
    if kept and rel in kept:
        return kept.pop(rel)
    import torch

    from .loadtest import resolve_benign

    with pinned(path, pin) as (name, f):
        if layout == "safetensors" or path.name.endswith(".safetensors"):
            from safetensors.torch import load as st_load, load_file as st_load_file

            if f is not None and name == str(path):  # no /proc: the bytes of the pinned open file
                return {k: v.to(map_location) for k, v in st_load(f.read()).items()}
            return st_load_file(name, device=str(map_location))
        with torch.serialization.safe_globals(resolve_benign(list(benign))):
            return torch.load(f if f is not None and name == str(path) else name, map_location=map_location,
                              weights_only=True)


class ReaderLoads:
    """The reader's ``loader`` (:func:`ckptaudit.stages.load.loadtest.load_units`) and what it loaded: ``kept`` maps a file
    (relative to the run) to its loaded object, for :func:`ckptaudit.safe_load._load_unit` to take."""

    #: the reader returns the objects it loads: no file's load stands for another's (:mod:`.equivalent`)
    loads_every_file = True

    def __init__(self, map_location: Any = "cpu") -> None:
        self.in_process = map_location in (None, "cpu")
        self.kept: Dict[str, Any] = {}
        self.pins: Dict[str, Identity] = {}  # file (relative to the run) -> its identity before verification

    def pin(self, run_dir, unit: dict) -> None:
        """Record the identity of each file of ``unit`` (an inventory unit dict) before its bytes are read for
        verification; every later load of the file must find it unchanged (:func:`pinned`).  A file that cannot
        be stat'ed is left unpinned (its verification fails on the same error); an object-store run is not
        pinned (its loads are tested in a child on a copy)."""
        from ... import fs

        if fs.is_remote(run_dir):
            return
        for rel in unit["files"]:
            try:
                self.pins[rel] = identity(os.stat(os.path.join(run_dir, rel)))
            except OSError:
                self.pins.pop(rel, None)

    def __call__(self, run_dir, todo: list, cfg: dict, timeout: float, limit: int, kept=None) -> List[Dict]:
        from ... import fs
        from . import loadtest

        here = [self.in_process and k in IN_PROCESS_KINDS and not fs.is_remote(run_dir) for _, _, k, _ in todo]
        rest = iter(loadtest.load_todo(run_dir, [t for t, h in zip(todo, here) if not h], cfg, timeout, limit, kept)
                    if not all(here) else [])
        return [self._load_here(run_dir, f, k, benign) if h else next(rest) for (_, f, k, benign), h in zip(todo, here)]

    def _load_here(self, run_dir, rel: str, kind: str, benign: List[str]) -> Dict:
        from . import loaded_object, loadtest

        t0 = time.perf_counter()
        try:
            obj = load_file(Path(run_dir) / rel, "safetensors" if kind == "safetensors" else "", "cpu", benign,
                            pin=self.pins.get(rel))
        except Exception as e:  # noqa: BLE001 - reported as the child reports it
            res = loadtest.failed_load(e)
        else:
            res = loaded_object.summary(obj)
            self.kept[rel] = obj
        res.update(load_seconds=time.perf_counter() - t0,
                   peak_rss_bytes=int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024)
        return res

    def drop(self) -> None:
        """Forget every kept object (a unit examined but not returned)."""
        self.kept.clear()
