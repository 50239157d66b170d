"""The stage job server: every ``python -m ckptaudit.stages …`` job of an audit on one machine is forked from one
process that has imported the stages, instead of importing them itself.

Why (issue 45): a stage job's own work on a small part takes tens of milliseconds, its imports (pyarrow with
numpy, ``pyarrow.compute``, the stage modules) 0.2–0.36 s of one core, and an audit runs its jobs in a chain
(inventory → hash → scan → load, structure, configdiff, state → report, the target beside): on a small run most
of the audit's fixed cost was imports paid again by each job, and on a run of many parts ~0.3 CPU-s per job.
With this server a job costs a fork and the job's work; its command line, log, exit status and outputs are the
same.

How: the Snakefile's ``onstart`` (and ``ckptaudit audit``, before it imports Snakemake) starts the server
(:mod:`ckptaudit.stages.jobs.helper_server`: ``<work>/stage_server.json``, a private socket) and sets
:data:`~ckptaudit.stages.jobs.client.ENV` to its socket in its own environment, which the jobs inherit.  A job's
``__main__`` first calls :func:`~ckptaudit.stages.jobs.client.run_in_server`: it connects, sends its arguments,
working folder and environment, and passes its stdin, stdout and stderr (``SCM_RIGHTS``); the server forks a
child which takes those as its own (the job's log), runs :func:`ckptaudit.stages.cli.main` on the arguments, and
ends as an interpreter ends (non-daemon threads joined, atexit handlers run, streams flushed; no module
teardown).  The server sends the child's exit status
(a signal's as a negative number) and the job exits with it, or dies of the same signal.

Each child is the leader of a process group of its own; when its job process ends first (Snakemake killed it:
Ctrl-C, a timeout), the server sends that group SIGINT (what a Ctrl-C gives a job in its own process) and, if it
still runs :data:`GRACE_S` later, SIGKILL, so nothing of a killed job runs on.  The server is
single-threaded (it forks from its only thread; it reaps children on ``SIGCHLD``) and imports what the stages
import (:data:`PRELOAD`) before it accepts; a job that connects meanwhile waits in the listen backlog.

When there is no server (a cluster, ``--use-conda``, a job run by hand, no ``ENV``), or it does not answer within
:data:`~ckptaudit.stages.jobs.client.START_TIMEOUT_S`, the job runs in its own process as before: the server
changes the cost, never the result.  The wire format is :mod:`~ckptaudit.stages.jobs.client`'s.

This module imports only the standard library at its top (it is the job process's first import).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from . import helper_server
from .client import ENV, SERVE, recv, send

#: a forked job's process name is this and its stage (``ckpt-hash``, ``ckpt-configdiff``: ``ps -o comm``)
NAME_PREFIX = "ckpt-"
INFO_NAME = "stage_server.json"
#: seconds a job whose process was killed gets between SIGINT (its ``finally`` blocks run, as on a Ctrl-C in a
#: terminal) and SIGKILL
GRACE_S = 5.0

#: Modules the server imports before it serves: the stage modules and what their functions import lazily when
#: they run (measured with ``sys.modules`` after each stage on a part).  A module missing here costs each job
#: its import, nothing else.
PRELOAD = (
    "ctypes", "numpy", "pyarrow", "pyarrow.parquet", "pyarrow.compute",
    "ckptaudit.stages.cli", "ckptaudit.stages.inventory", "ckptaudit.stages.hash", "ckptaudit.stages.scan",
    "ckptaudit.stages.load", "ckptaudit.stages.load.server", "ckptaudit.stages.load.loadtest",
    "ckptaudit.stages.target", "ckptaudit.stages.structure", "ckptaudit.stages.configdiff", "ckptaudit.stages.state",
    "ckptaudit.stages.report",
    "ckptaudit.stages.inventory.run_folder", "ckptaudit.discovery.folders", "ckptaudit.discovery.irregular",
    "ckptaudit.discovery.object_store",
    "ckptaudit.onepass.filepass", "ckptaudit.onepass.facts", "ckptaudit.onepass.plan", "ckptaudit.onepass.plan_dcp",
    "ckptaudit.onepass.consumers", "ckptaudit.formats.torchzip", "ckptaudit.formats.integrity_json",
    "ckptaudit.formats.zip.crc_finding", "ckptaudit.formats.zip.cut", "ckptaudit.verification.hash_job",
    "ckptaudit.verification.budget", "ckptaudit.components.restore_rules",
)


def info_path(work_dir: str | os.PathLike) -> Path:
    """Where :func:`start` records the server of an audit whose work folder is ``work_dir``."""
    return Path(work_dir) / INFO_NAME


def start(work_dir: str | os.PathLike, log_path: str | os.PathLike | None = None) -> Optional[int]:
    """Spawn the server for this process's audit and set ``ENV`` (:mod:`.client`) for the jobs it starts; return
    the server's pid, or None when it could not be started (the jobs then import the stages themselves)."""
    doc = helper_server.start(["ckptaudit.stages", SERVE], info_path(work_dir), log_path, "ckptaudit-jobs-")
    if doc is None:
        return None
    os.environ[ENV] = doc["socket"]
    return doc["pid"]


def started_here(work_dir: str | os.PathLike) -> bool:
    """Whether this process started the server of ``work_dir``, has not stopped it, and it still runs."""
    return helper_server.started_here(info_path(work_dir))


def stop(work_dir: str | os.PathLike) -> None:
    """End the server this process started for ``work_dir`` (if any; jobs still running in it are killed),
    remove its record, and unset ``ENV`` when it named that server."""
    sock = helper_server.socket_of(info_path(work_dir))
    helper_server.stop(info_path(work_dir))
    if sock is not None and os.environ.get(ENV) == sock:
        del os.environ[ENV]


# ------------------------------------------------------------------------------------------------- the server


class _Stopped(Exception):
    """SIGTERM from :func:`stop`."""


def _stop_now(*_) -> None:
    raise _Stopped


def _preload() -> None:
    import gc
    import importlib

    from .process import without_pandas

    without_pandas()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as e:  # an optional module absent: its jobs import (and report) it themselves
            print(f"ckptaudit stage job server: not preloaded: {name}: {e}", file=sys.stderr, flush=True)
    # what was imported goes to the collector's permanent generation: a forked job's collections never walk
    # those objects again, nor write to their pages (Python's ``gc.freeze`` documentation: before a fork)
    gc.collect()
    gc.freeze()


def serve(fd: int, parent: int, folder: str, record: str, main: Callable[[list], int]) -> int:
    """The server's main loop on the listening socket ``fd`` (see the module docstring), running each job as
    ``main(arguments)`` (:func:`ckptaudit.stages.cli.main`) in a forked child; writes each job's cost to
    :data:`ckptaudit.stages.jobs.costs.JOBS_NAME` beside ``record`` (this audit's jobs only); removes ``folder``
    (the socket's) and kills the jobs still running when it ends; returns its exit status."""
    import shutil

    from .costs import JOBS_NAME

    costs = open(Path(record).parent / JOBS_NAME, "w")  # this audit's jobs
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as ckptaudit.stages.cli.main: read at numpy's import
    listener = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGTERM, _stop_now)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    jobs: dict = {}  # pid → (the job's connection, its arguments, when it started)
    watched: dict = {}  # connection → pid, while its job process is there
    ending: dict = {}  # pid → when a job whose process was killed gets SIGKILL
    try:
        _preload()
        while os.getppid() == parent:
            ready = select.select([listener, wake_r, *watched], [], [], 0.2 if ending else 1.0)[0]
            if wake_r in ready:
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            _reap(jobs, watched, costs)
            for conn in [c for c in ready if c in watched]:  # the job process closed its end: it was killed
                pid = watched.pop(conn)
                ending[pid] = time.monotonic() + GRACE_S
                _kill_group(pid, signal.SIGINT)
            for pid in [p for p, t in ending.items() if t <= time.monotonic()]:
                del ending[pid]
                if pid in jobs:
                    _kill_group(pid)
            if listener in ready:
                _accept(listener, (listener.fileno(), wake_r, wake_w, costs.fileno()), jobs, watched, main)
    except _Stopped:
        pass
    finally:
        for pid in list(jobs):
            _kill_group(pid)
        listener.close()
        costs.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def _reap(jobs: dict, watched: dict, costs) -> None:
    """Collect ended children; send each one's exit status to its job and write its cost to ``costs``."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        job = jobs.pop(pid, None)
        if job is None:
            continue
        conn, argv, t0 = job
        watched.pop(conn, None)
        part = argv[argv.index("--part") + 1] if "--part" in argv[:-1] else ""
        code = os.waitstatus_to_exitcode(status)
        costs.write(json.dumps({"stage": argv[1] if len(argv) > 1 else "", "part": part, "status": code, "wall_s": round(time.time() - t0, 3),
                                "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
                                "max_rss_mib": round(usage.ru_maxrss / 1024, 1)}) + "\n")
        costs.flush()
        try:
            send(conn, {"status": code})
        except OSError:
            pass
        conn.close()


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass


def _accept(listener: socket.socket, own_fds: tuple, jobs: dict, watched: dict, main: Callable[[list], int]) -> None:
    """Take one job: read its request and the three descriptors it passed, fork its child."""
    conn, _ = listener.accept()
    fds: list = []
    try:
        if helper_server.other_user(conn):
            conn.close()
            return
        conn.settimeout(10.0)
        first, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
        if len(fds) != 3:
            raise OSError("a job must pass its stdin, stdout and stderr")
        req = recv(conn, first)
        conn.settimeout(None)
        if (why := _not_ours(req)) is not None:
            send(conn, {"refused": why})  # the job runs in its own process
            raise OSError(why)
    except (OSError, ValueError, EOFError):
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        _child(req, fds, main, [*own_fds, conn.fileno(), *(c.fileno() for c in watched), *(
            c.fileno() for c, _, _ in jobs.values() if c not in watched)])
    try:
        os.setpgid(pid, pid)  # also in the child: whichever runs first, the group exists before any kill
    except OSError:
        pass
    for fd in fds:
        os.close(fd)
    try:
        send(conn, {"pid": pid})
    except OSError:  # the job went away already
        _kill_group(pid)
    jobs[pid] = (conn, list(req["argv"]), time.time())
    watched[conn] = pid


def _name_process(name: str) -> None:
    """Set this process's name (``/proc/PID/comm``, what ``ps``, ``top`` and psutil's ``name()`` show; at most 15
    bytes) with ``prctl(PR_SET_NAME)``: a forked job's command line is still the server's."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME (linux/prctl.h)
    except (OSError, AttributeError):  # not Linux: the name stays the server's
        pass


def _not_ours(req: dict) -> Optional[str]:
    """Why the job of ``req`` must not run in this server (another interpreter or import path than the one this
    server imported the stages with), or None."""
    if req.get("executable") != sys.executable:
        return f"the job runs {req.get('executable')!r}, this server {sys.executable!r}"
    if (req.get("env") or {}).get("PYTHONPATH") != os.environ.get("PYTHONPATH"):
        return "the job's PYTHONPATH is not this server's"
    return None


def _child(req: dict, fds: list, main: Callable[[list], int], close_fds: list) -> None:
    """In the forked child: become the job (its descriptors, folder, environment, arguments), run it, exit with
    its status as an interpreter would."""
    import atexit
    import threading
    import traceback

    code = 1
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for fd in close_fds:
            os.close(fd)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ.pop(ENV, None)  # a job the child starts runs in its own process
        sys.argv = list(req["argv"])
        _name_process(f"{NAME_PREFIX}{sys.argv[1] if len(sys.argv) > 1 else ''}")
        atexit._clear()  # the server's handlers are not the job's
        from .process import forked_job_memory_pool

        forked_job_memory_pool(sys.argv[1] if len(sys.argv) > 1 else "")  # jemalloc's threads do not survive a fork
        try:
            code = main(sys.argv[1:])
        except SystemExit as e:  # argparse's usage errors, a stage's own exit
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - what a job's own process prints for an uncaught error
        traceback.print_exc()
        code = 1
    finally:
        try:
            threading._shutdown()
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)
