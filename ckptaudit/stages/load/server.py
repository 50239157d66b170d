"""One ``import torch`` per audit: a process that has imported torch serves every load job's loads.

Why: ``import torch`` costs 1.4–2.4 s of CPU and ~220 MiB (torch 2.13, this project's 2-core VM), and the load
stage was the only job that paid it — once per part, on the audit's critical path right after hashing (issue 22:
most of a small audit's fixed cost, and 16 imports in a 1,000-unit audit).  The server is started when the
workflow starts, so its import runs while the inventory and the hash stage do, and every load job of the audit
forks from it.

Lifecycle (local execution only; on a cluster each load job imports torch itself, as without a server):

* :func:`start` (the Snakefile's ``onstart``; ``ckptaudit audit`` calls it earlier, before it imports Snakemake,
  so that torch's import runs beside the workflow's own start on one core instead of beside the hash pass on
  both, and ``onstart`` keeps that server: :func:`started_here`) spawns ``python -m ckptaudit.stages.load.server
  FD PARENT_PID FOLDER`` on a private listening socket and records it in ``<work>/load_server.json``
  (:mod:`ckptaudit.stages.jobs.helper_server`, shared with the stage job server).
* The server imports torch, then accepts; a load job that connects during the import waits in the listen
  backlog.  Each connection is served on a thread of its own, which runs
  :func:`ckptaudit.stages.load.loadtest.load_todo`: the same forked, time- and memory-limited
  ``torch.load(weights_only=True)`` children as a load job without a server, and answers with the results.
  The server itself never loads a file (its children do), so no load leaves state in it.  Threads, not a
  forked child per connection: a fork of the server would count torch's ~230 MiB once more in every
  per-process RSS sum, and its own children again (issue 22: 624 MiB for the server's tree at 200,000
  tensors).  The server's other threads only wait on sockets and pipes, and CPython takes its import lock
  around ``fork``, so a child forked from one thread finds no lock held.
* It exits when the workflow's ``load_server_done`` rule, which runs once every load job has written its table,
  asks it to (:func:`done`: the server's ~230 MiB of torch are not held while structure, state and the report
  run), when :func:`stop` signals it (``onsuccess``/``onerror``), or, checked every second, when the process
  that started it has gone (a killed audit leaves no server behind).

A job that finds no server (none started, a stale ``load_server.json`` after a SIGKILL, a remote run, a socket
error) loads in its own process, exactly as before: the server changes the cost, never the result.

Wire format, both ways: an 8-byte big-endian length, then that many bytes of JSON.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import struct
import sys
import threading
from pathlib import Path
from typing import Optional

from ..jobs import helper_server as server_process

INFO_NAME = "load_server.json"
_HEADER = struct.Struct(">Q")


def info_path(work_dir: str | os.PathLike) -> Path:
    """Where :func:`start` records the server of an audit whose work folder is ``work_dir``."""
    return Path(work_dir) / INFO_NAME


def start(work_dir: str | os.PathLike, log_path: str | os.PathLike | None = None) -> Optional[int]:
    """Spawn the server for this process's audit (:func:`ckptaudit.stages.jobs.helper_server.start`); return its pid, or
    None when it could not be started (the load jobs then import torch themselves).  ``log_path``: where its stderr
    goes (default: discarded)."""
    doc = server_process.start(["ckptaudit.stages.load.server"], info_path(work_dir), log_path, "ckptaudit-load-")
    return doc["pid"] if doc else None


def started_here(work_dir: str | os.PathLike) -> bool:
    """Whether this process started the server of ``work_dir`` with :func:`start`, has not stopped it, and it
    still runs (``ckptaudit audit`` starts it before Snakemake's import; the Snakefile's ``onstart`` keeps it)."""
    return server_process.started_here(info_path(work_dir))


def stop(work_dir: str | os.PathLike) -> None:
    """End the server this process started for ``work_dir`` (if any) and remove ``load_server.json`` there (a
    stale one too).  A record this process did not write is only removed: its pid may be anyone's by now."""
    server_process.stop(info_path(work_dir))


def request(info: str | os.PathLike, run_dir: str, todo: list, cfg: dict, timeout: float,
            limit: int) -> Optional[dict]:
    """Ask the server named by ``info`` (a ``load_server.json``) to load ``todo``; return its answer
    ``{"results": [...], "child_bytes": int}`` (``results`` as :func:`ckptaudit.stages.load.loadtest.load_todo` returns
    them, in ``todo`` order), or None when there is no server to ask or the exchange failed."""
    # the server's import (once) plus each file's own timeout, and slack: past that, the job loads itself
    answer = _exchange(info, {"run_dir": run_dir, "todo": todo, "cfg": cfg, "timeout": timeout, "limit": limit},
                       120.0 + timeout * max(1, len(todo)))
    if not isinstance(answer, dict) or len(answer.get("results") or []) != len(todo):
        return None
    return answer


def done(info: str | os.PathLike) -> bool:
    """Tell the server named by ``info`` (a ``load_server.json``) that no load job is left: it exits (a load
    job that still came would load in its own process).  False when there was no server to tell."""
    answer = _exchange(info, {"done": True}, 10.0)
    return isinstance(answer, dict) and answer.get("done") is True


def _exchange(info: str | os.PathLike, message: dict, timeout: float):
    """Send ``message`` to the server named by ``info`` and return its JSON answer, or None (no record, no
    server, a socket error, a malformed answer) within ``timeout`` seconds."""
    sock_path = server_process.socket_of(info)
    if sock_path is None:
        return None
    payload = json.dumps(message).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(_HEADER.pack(len(payload)) + payload)
        return json.loads(_recv(s))
    except (OSError, ValueError, EOFError):
        return None
    finally:
        s.close()


class ServerLoads:
    """A ``loader`` for :func:`ckptaudit.stages.load.loadtest.load_units`: the files of a local run go to the server that
    ``info`` (a ``load_server.json``) names, and its answer counts to :attr:`files_served` and to the children's
    bytes read; without an answer (or for a remote run) they load in this process
    (:func:`ckptaudit.stages.load.loadtest.load_todo`)."""

    def __init__(self, info: str | os.PathLike | None) -> None:
        self.info = info
        self.files_served = 0  # files the load server loaded for this loader (the load stage's bytes file)

    def __call__(self, run_dir, todo, cfg, timeout, limit, kept=None):
        from ... import fs
        from . import loadtest

        answer = None
        if self.info and not fs.is_remote(run_dir):
            answer = request(self.info, str(run_dir), [[u["unit"], f, k, b] for u, f, k, b in todo], cfg, timeout,
                             limit)
        if answer is None:
            return loadtest.load_todo(run_dir, todo, cfg, timeout, limit, kept)
        loadtest.count_child_bytes(int(answer.get("child_bytes") or 0))
        self.files_served += len(todo)
        return answer["results"]


def loader(info: str | os.PathLike | None) -> ServerLoads:
    """The load stage's loader of the server ``info`` names (:class:`ServerLoads`)."""
    return ServerLoads(info)


def _recv(s: socket.socket) -> bytes:
    head = _recv_exactly(s, _HEADER.size)
    return _recv_exactly(s, _HEADER.unpack(head)[0])


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def _serve_one(conn: socket.socket) -> None:
    """Runs on a thread of the server for one connection: load what it asks for (in forked children), answer."""
    from ... import fs
    from . import loadtest

    try:
        req = json.loads(_recv(conn))
        if req.get("done") is True:  # :func:`done`: the main thread ends the server (SIGTERM: out of its select)
            out = b'{"done": true}'
            conn.sendall(_HEADER.pack(len(out)) + out)
            print("ckptaudit load server: every load job has run; exiting", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        before = loadtest.child_bytes_read()  # this thread's count
        results = loadtest.load_todo(fs.path(req["run_dir"]), [tuple(t) for t in req["todo"]], req["cfg"],
                                     float(req["timeout"]), int(req["limit"]))
        out = json.dumps({"results": results, "child_bytes": loadtest.child_bytes_read() - before}).encode()
        conn.sendall(_HEADER.pack(len(out)) + out)
    except Exception:  # noqa: BLE001 - the job sees a closed connection and loads itself
        pass
    finally:
        conn.close()


class _Stopped(Exception):
    """SIGTERM from :func:`stop`."""


def _stop_now(*_) -> None:
    raise _Stopped


def serve(fd: int, parent: int, folder: str) -> int:
    """The server's main loop on the listening socket ``fd`` (see the module docstring); removes ``folder``
    (the socket's) when it ends; returns its exit status."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as the stage jobs (ckptaudit.stages.main)
    from ..jobs.process import without_pandas

    without_pandas()
    listener = socket.socket(fileno=fd)
    signal.signal(signal.SIGTERM, _stop_now)
    try:
        import torch  # noqa: F401 - the point of the server: once, before any request is served
        try:
            import safetensors.torch  # noqa: F401
        except ImportError:
            pass
        while os.getppid() == parent:
            if select.select([listener], [], [], 1.0)[0]:
                conn, _ = listener.accept()
                if server_process.other_user(conn):
                    conn.close()  # another user's process (the folder is 0700; this is a second guard)
                    continue
                threading.Thread(target=_serve_one, args=(conn,), daemon=True).start()
    except _Stopped:
        pass
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
        if os.getpgid(0) == os.getpid():  # started by start(): a group of its own, whose other members are
            os.killpg(0, signal.SIGKILL)  # load children still running (their timeouts were its threads')
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["done"]:  # the load_server_done rule: python -m ckptaudit.stages.load.server done INFO
        done(sys.argv[2])
        raise SystemExit(0)  # no server (a cluster, a remote run, a re-run whose loads were kept) is no error
    status = serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    sys.stderr.flush()
    os._exit(status)  # no interpreter teardown: unloading torch's modules took ~1 s
