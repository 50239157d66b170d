"""What a forked load child runs besides ``load_in_child``'s one file: the globals it allows, its read counter, and a batch of small files.

Small files are load-tested by one forked child, one after another: a fork per batch of files, not per file.

A fork of the load stage's process (which has imported torch) costs ~80 ms; the load of a small checkpoint
~30 ms (issue 22: 1,000 small units spent 75 ms each in the load stage).  :func:`load_many` forks one child
for up to :data:`BATCH_FILES` local files (:data:`BATCH_BYTES` in all); the child loads each exactly as :func:`ckptaudit.stages.load.loadtest.load_in_child`
does (``weights_only=True``, the same ``RLIMIT_AS``), with each file's own allowed globals in force only while
that file loads (``torch.serialization.safe_globals``, restored after), and writes one result line per file.

Only an ``ok`` is taken from a batch.  A file whose load in the batch did not succeed, went past its own
timeout, or was under way when the child died, is loaded again alone by ``load_in_child`` — whatever state an
earlier load left in the child can never turn into a finding — and the files after it go on in a new batch.
In a batch, ``load_seconds`` is the load's own time (no fork) and ``peak_rss_bytes`` the child's peak so far.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from ... import fs
from . import loaded_object

#: Files one child loads at most, and their bytes at most (at least one file): a fork per 32 small units cost
#: more than their loads (issue 45: 2,000 units of 87 KB, 63 forks of a process that has imported torch).
BATCH_FILES = 1024
BATCH_BYTES = 256 << 20
#: Files up to this size are batched; a bigger one gets a child of its own (its own peak RSS, its own limit).
BATCH_FILE_BYTES = 64 << 20


def batched_loads(run_dir: Path, todo: list, timeout: float, limit: int, *, alone: Callable) -> Dict[int, Dict]:
    """{index in ``todo`` ((unit, file, kind, allowed globals) of :func:`ckptaudit.stages.load.loadtest.load_units`): result}
    of its local files small enough to share a child; ``alone``: ``load_in_child``.  A result keeps
    ``read_bytes`` (the load's own reads) for the caller to count."""
    idx = [i for i, (_, f, _, _) in enumerate(todo) if not fs.is_remote(run_dir / f)
           and 0 <= _size(run_dir / f) <= BATCH_FILE_BYTES]
    items = [(str(run_dir / todo[i][1]), todo[i][2], todo[i][3]) for i in idx]
    if len(idx) < 2:
        return {}
    return dict(zip(idx, load_many(items, timeout_seconds=timeout, memory_limit_bytes=limit, alone=alone)))


def _size(p) -> int:
    try:
        return os.stat(p).st_size
    except OSError:
        return -1


def load_many(items: List[Tuple[str, str, List[str]]], *, timeout_seconds: float, memory_limit_bytes: int,
              alone: Callable) -> List[Dict]:
    """Results for ``items`` (path, kind, allowed globals), in order, as ``alone`` (``load_in_child``) returns
    them; a file not ``ok`` in a batch is ``alone``'s."""
    out: List[Dict] = []
    sizes = [max(0, _size(path)) for path, _, _ in items]
    while len(out) < len(items):
        end, total = len(out) + 1, sizes[len(out)]
        while end < len(items) and end - len(out) < BATCH_FILES and total + sizes[end] <= BATCH_BYTES:
            total += sizes[end]
            end += 1
        batch = items[len(out):end]
        got = _batch(batch, timeout_seconds, memory_limit_bytes) if len(batch) > 1 else []
        out.extend(got)
        if len(got) < len(batch):  # not ok in the batch, or never reached: that one alone, then a new batch
            path, kind, benign = batch[len(got)]
            out.append(alone(path, kind, benign, timeout_seconds=timeout_seconds,
                             memory_limit_bytes=memory_limit_bytes))
    return out


def _batch(batch: List[Tuple[str, str, List[str]]], timeout_seconds: float, limit: int) -> List[Dict]:
    """The ``ok`` results of the longest run of files at the start of ``batch`` that loaded in one child."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        _child(batch, limit, w)
    os.close(w)
    got: List[Dict] = []
    try:
        _read_results(r, got, len(batch), timeout_seconds)
    except (_Stop, ValueError):
        pass
    finally:
        if len(got) < len(batch):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(pid, 0)
        os.close(r)
    return got


def load_file(path: str, kind: str, benign: List[str]) -> dict:
    """Load ``path`` as the resume would, in this (child) process: a ``.safetensors`` file tensor by tensor with
    ``safe_open``, else ``torch.load(weights_only=True)`` (memory-mapped for a zip), the ``benign`` globals allowed
    (:func:`resolve_benign`); the loaded object's summary (:func:`loaded_object.summary`): ``{"status": "ok", …}``.
    Raises whatever the load raises (the caller reports it as data)."""
    import contextlib

    import torch

    if kind == "safetensors":
        from safetensors import safe_open

        n = 0
        with safe_open(path, framework="pt", device="cpu") as f:
            for k in f.keys():
                f.get_tensor(k)
                n += 1
        return {"status": "ok", "n_top_level_keys": n, "n_tensors": n}
    allowed = torch.serialization.safe_globals(resolve_benign(benign)) if benign else contextlib.nullcontext()
    with allowed:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=(kind == "torch_zip"))
    return loaded_object.summary(obj)


def resolve_benign(names: List[str]):
    """The classes named by ``names`` (``module.Name``), imported, for ``torch.serialization.add_safe_globals``."""
    import importlib

    out = []
    if any(n.endswith(("numpy.dtype", "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar")) for n in names):
        # numpy.dtype(...) builds an instance of a numpy.dtypes.*DType class, which
        # weights_only checks too (torch docs, "weights_only" numpy example)
        try:
            import numpy.dtypes as npd

            out.extend(getattr(npd, a) for a in dir(npd) if a.endswith("DType") and isinstance(getattr(npd, a), type))
        except ImportError:
            pass
    from ...security import BENIGN

    for full in names:
        mod, _, attr = full.rpartition(".")
        obj = None
        if BENIGN.get(full) is not None and BENIGN[full].add_safe.startswith("(dict,"):
            # a dict subclass that torch's SETITEMS check refuses even when allowlisted: load it as dict
            out.append((dict, full))
            continue
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except Exception:  # noqa: BLE001 - any failure means "use the stand-in"
            obj = None
        # not installed here: map the name to plain dict (the weights_only unpickler
        # only allows SETITEMS on dict itself, and the benign non-stdlib classes on
        # the list, Lightning's AttributeDict, are dict subclasses)
        out.append((obj, full) if obj is not None else (dict, full))
    return out



def read_chars() -> int:
    """Bytes this process has read through read(2)-like calls (Linux ``/proc/self/io`` ``rchar``; 0 elsewhere).
    Pages of an ``mmap`` that are touched are not in it: a ``mmap=True`` load that builds the object tree
    without touching tensor data reads only the zip directory, the headers and data.pkl."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f:
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class _Stop(Exception):
    """A file of the batch did not load ok: it is tried alone."""


def _child(batch: List[Tuple[str, str, List[str]]], limit: int, wfd: int) -> None:
    """Runs in the forked child: limit memory, load each file in turn, one JSON line per file, exit."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ValueError, OSError):
        pass
    try:
        import torch

        torch.set_num_threads(1)
        for path, kind, benign in batch:
            rchar0, t0 = read_chars(), time.perf_counter()
            try:
                res = load_file(path, kind, benign)
            except BaseException as e:  # noqa: BLE001 - reported, then this file is tried alone
                res = {"status": "failed", "error_type": type(e).__name__}
            res.update(load_seconds=time.perf_counter() - t0, read_bytes=max(0, read_chars() - rchar0),
                       peak_rss_bytes=int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024)
            os.write(wfd, json.dumps(res).encode() + b"\n")
            if res["status"] != "ok":
                break
    finally:
        os._exit(0)


def _read_results(r: int, got: List[Dict], n: int, timeout_seconds: float) -> None:
    """Append to ``got`` the child's results (one JSON line per file, from pipe ``r``) until ``n`` came, the
    pipe closed, or a file took longer than ``timeout_seconds``; raises ``_Stop`` at the first that is not
    ``ok`` (and ``ValueError`` for a line that is not JSON)."""
    buf = b""
    deadline = time.perf_counter() + timeout_seconds
    while len(got) < n:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if not select.select([r], [], [], left)[0]:
            continue
        data = os.read(r, 1 << 16)
        if not data:
            return
        buf += data
        while b"\n" in buf and len(got) < n:
            line, buf = buf.split(b"\n", 1)
            res = json.loads(line)
            if res.get("status") != "ok":
                raise _Stop
            got.append(res)
            deadline = time.perf_counter() + timeout_seconds  # each file has its own timeout
