"""Private helper of the framework fixtures: start the processes a fixture launches (training ranks, resume probes)
from a fork server that has already imported torch and the fixture's framework.

A fixture starts several interpreters (the ranks of a training, the framework's own resume that is its truth,
each in a process of its own so that it can be SIGKILLed mid-save); each paid ``import torch`` (~1.4 s) and its
framework's import (Megatron-Core ~4.3 s, Lightning ~4.4 s of CPU) before any work, about two thirds of a fixture's
time.  Here they are started by the standard library's ``multiprocessing`` fork server instead
(``get_context("forkserver")``): a fresh interpreter, started once per fixture process, imports the modules of
:func:`set_preload` and then forks one child per start, so the children begin with those modules imported and
nothing else run.  The work each child does, the bytes it writes and the way it dies (a real SIGKILL) are the
framework's own, as in a fresh interpreter; what differs is only what was imported before ``main``.

Each child, before the function: ``os.environ`` replaced by the environment given (RANK, WORLD_SIZE, … are read
from it by the framework at run time), the working folder and stdout/stderr set (fds 1 and 2 point at the files
given), the atexit handlers of the fork server cleared; after it, its own atexit handlers run (as an interpreter's
would at exit), and the exit code is 0, the ``SystemExit`` code, 1 with the traceback on stderr after an
exception, or ``-signal`` when it was killed (:attr:`Started.returncode`, as ``subprocess.Popen`` gives).

No framework is imported here; every fork server is the standard library's.
"""

from __future__ import annotations

import atexit
import importlib
import json
import multiprocessing
import os
import sys
import threading
import traceback
from typing import Dict, Optional, Sequence

#: the environment variable that carries the preload list into processes that start fork servers of their own
PRELOAD_ENV = "CKPTAUDIT_FIXTURE_PRELOAD"
_ctx = None


def set_preload(modules: Sequence[str]) -> None:
    """Modules the fork server imports before its first fork (after torchvision's CPU shim and torch), e.g. the
    fixture module and its framework.  Call it before the first :func:`start`; a module that cannot be imported
    there is left to the child, which then reports the error itself (``multiprocessing`` skips it)."""
    os.environ[PRELOAD_ENV] = ",".join(modules)


def _context():
    global _ctx
    if _ctx is None:
        _ctx = multiprocessing.get_context("forkserver")
        extra = [m for m in os.environ.get(PRELOAD_ENV, "").split(",") if m]
        _ctx.set_forkserver_preload(["tests.frameworks._preloaded", *extra])
    return _ctx


def _child(spec: dict) -> None:
    """In the forked child: set up as a fresh interpreter would be, run ``module.fn(**kwargs)``, then end as an
    interpreter ends: non-daemon threads joined, this process's atexit handlers run, and (``multiprocessing``'s
    own ``_bootstrap``, which gets the ``SystemExit``) its child processes ended or joined and streams flushed."""
    atexit._clear()  # the fork server's handlers are not this process's
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    for fd, path in ((1, spec["stdout"]), (2, spec["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    code = 0
    try:
        if spec["ranks"]:
            from . import _dist

            _dist.prepare_rank()
        getattr(importlib.import_module(spec["module"]), spec["fn"])(**spec["kwargs"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported as an interpreter would, exit 1
        traceback.print_exc()
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.exit(code)


class Started:
    """A started child, with the part of ``subprocess.Popen``'s interface that the launchers use."""

    def __init__(self, proc):
        self._p = proc
        self.pid = proc.pid

    @property
    def returncode(self) -> Optional[int]:
        return self._p.exitcode

    def poll(self) -> Optional[int]:
        return self._p.exitcode

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        self._p.join(timeout)
        return self._p.exitcode

    def terminate(self) -> None:
        self._p.terminate()

    def kill(self) -> None:
        self._p.kill()


def start(module: str, fn: str, kwargs: dict, *, stdout: str, stderr: str, env: Optional[Dict[str, str]] = None,
          cwd: Optional[str] = None, ranks: bool = False) -> Started:
    """Start ``module.fn(**kwargs)`` in a child of the fork server; stdout and stderr append to the files named
    (the same file for both is allowed).  ``kwargs`` reach the function as the hand-run command line carries them
    (a JSON round trip: tuples become lists).  ``env`` (default: this process's) replaces the child's environment,
    ``cwd`` (default: this process's) is its working folder; ``ranks``: :func:`._dist.prepare_rank` first, as
    ``_dist.main``.  The child forks from the server, not from this process, so nothing of this one is copied."""
    spec = {"module": module, "fn": fn, "kwargs": json.loads(json.dumps(kwargs)), "env": dict(os.environ if env is None else env),
            "cwd": cwd or os.getcwd(), "stdout": str(stdout), "stderr": str(stderr), "ranks": ranks}
    p = _context().Process(target=_child, args=(spec,), daemon=False)
    p.start()
    return Started(p)
