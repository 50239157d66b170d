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
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

IN_PROCESS_KINDS = ("torch_zip", "safetensors")


def load_file(path: Path, layout: str, map_location: Any, benign: Sequence[str],
              kept: Optional[Dict[str, Any]] = None, rel: str = "") -> Any:
    """The object of one file as :func:`ckptaudit.safe_load_checkpoint` returns it: ``kept[rel]`` when the
    reader's load test already loaded it here (:class:`ReaderLoads`), else ``safetensors.torch.load_file`` for a
    safetensors file (``layout`` "safetensors" or the name says so) and ``torch.load(weights_only=True)`` with
    ``benign`` globals allowed for any other.  Raises what those loaders raise."""
    if kept and rel in kept:
        return kept.pop(rel)
    import torch

    from .loadtest import resolve_benign

    if layout == "safetensors" or path.name.endswith(".safetensors"):
        from safetensors.torch import load_file as st_load_file

        return st_load_file(str(path), device=str(map_location))
    with torch.serialization.safe_globals(resolve_benign(list(benign))):
        return torch.load(path, map_location=map_location, weights_only=True)


class ReaderLoads:
    """The reader's ``loader`` (:func:`ckptaudit.stages.load.loadtest.load_units`) and what it loaded: ``kept`` maps a file
    (relative to the run) to its loaded object, for :func:`ckptaudit.safe_load._load_unit` to take."""

    def __init__(self, map_location: Any = "cpu") -> None:
        self.in_process = map_location in (None, "cpu")
        self.kept: Dict[str, Any] = {}

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
            obj = load_file(Path(run_dir) / rel, "safetensors" if kind == "safetensors" else "", "cpu", benign)
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
