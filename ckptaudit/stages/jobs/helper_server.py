"""An audit's helper server: a process started once per audit, listening on a private Unix socket, recorded in a
JSON file of the audit's work folder, and ended with the audit.

Two servers use it: the load server (:mod:`ckptaudit.stages.load.server`: one ``import torch`` for every load) and
the stage job server (:mod:`ckptaudit.stages.jobs.server`: the stage jobs forked from one process that has imported
the stages).  Each is ``python -m MODULE FD PARENT_PID FOLDER RECORD``: ``FD`` is a socket already bound and listening
(a job that connects while the server still imports waits in the listen backlog), ``PARENT_PID`` the process that
started it (the server exits when that one has gone, so a killed audit leaves no server behind), ``FOLDER`` the
private temporary folder (mode 0700: no other user can connect) that holds the socket; Unix socket paths are
limited to 107 bytes, which an output folder's path could exceed; ``RECORD`` the record's path (its folder is the
audit's work folder).  The server runs in a session of its own
(a Ctrl-C in the terminal reaches the jobs, not it).

The record, ``{"socket", "pid", "folder"}``, is written atomically; :func:`stop` ends only a server this process
started, never what a record left by another (or a killed) audit names.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

#: {record path: (pid, socket folder)} of the servers this process started
_STARTED: dict = {}


def start(module: Sequence[str], record: str | os.PathLike, log_path: str | os.PathLike | None = None,
          prefix: str = "ckptaudit-") -> Optional[dict]:
    """Spawn ``python -m *module FD PARENT_PID FOLDER RECORD`` (``module``: the module and any arguments before
    those) and write its record to ``record``; return the record
    (``{"socket", "pid", "folder"}``), or None when it could not be started (an ``OSError``: the jobs then work
    without it).  ``log_path``: where its stderr goes (default: discarded)."""
    record = Path(record)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        folder = tempfile.mkdtemp(prefix=prefix)  # mode 0700
        sock = os.path.join(folder, "s")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:  # bound and listening before the server starts: a job that connects early waits in the backlog
            listener.bind(sock)
            listener.listen(64)
            err = open(log_path, "ab") if log_path else subprocess.DEVNULL
            try:
                proc = subprocess.Popen([sys.executable, "-m", *module, str(listener.fileno()), str(os.getpid()),
                                         folder, str(record.resolve())],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                        pass_fds=(listener.fileno(),), start_new_session=True)
            finally:
                if log_path:
                    err.close()
        finally:
            listener.close()
        doc = {"socket": sock, "pid": proc.pid, "folder": folder}
        tmp = record.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, record)
        _STARTED[str(record.resolve())] = (proc.pid, folder)
        return doc
    except OSError:
        return None


def started_here(record: str | os.PathLike) -> bool:
    """Whether this process started the server recorded at ``record`` with :func:`start`, has not stopped it,
    and it still runs."""
    pid, _folder = _STARTED.get(str(Path(record).resolve()), (0, ""))
    if pid <= 0:
        return False
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    except ChildProcessError:
        return False


def stop(record: str | os.PathLike) -> None:
    """End the server this process started with the record ``record`` (if any: SIGTERM, then reaped within
    ~1 s) and remove the record (a stale one too)."""
    record = Path(record)
    try:
        record.unlink()
    except OSError:
        pass
    pid, folder = _STARTED.pop(str(record.resolve()), (0, ""))
    if pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        try:  # reap it (it is this process's child)
            for _ in range(50):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
                time.sleep(0.02)
        except ChildProcessError:
            pass
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def socket_of(record: str | os.PathLike) -> Optional[str]:
    """The socket path a record names, or None (no record, unreadable, malformed)."""
    try:
        return str(json.loads(Path(record).read_text())["socket"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket connection (``SO_PEERCRED``, Linux)."""
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[2]


def other_user(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` runs as another user (the socket's folder is 0700: a second guard)."""
    return hasattr(socket, "SO_PEERCRED") and peer_uid(conn) != os.getuid()
