"""A stage job's side of the stage job server (:mod:`ckptaudit.stages.jobs.server`): hand the job to the server
that :data:`ENV` names and take its exit status, or say there is none; and the wire format both sides use, an
8-byte big-endian length, then that many bytes of JSON.

This module imports only the standard library (it is a job process's first import: ``python -m ckptaudit.stages``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from typing import Optional

#: the environment variable naming the server's socket (set by :func:`ckptaudit.stages.jobs.server.start` for the
#: jobs its process starts)
ENV = "CKPTAUDIT_STAGE_SERVER"
#: seconds a job waits for the server to take its job (it may still be importing) before it runs on its own
START_TIMEOUT_S = 60.0
#: ``python -m ckptaudit.stages job-server FD PARENT_PID FOLDER RECORD`` runs the server
#: (:func:`ckptaudit.stages.jobs.server.serve`; the stages' entry point hands it the job's ``main``)
SERVE = "job-server"
_HEADER = struct.Struct(">Q")


def run_in_server(argv: list) -> Optional[int]:
    """Run the stage job ``argv`` (``sys.argv``: the program, then the stage's arguments) in the server that
    :data:`ENV` names; return its exit status, or None when there is no server to run it (the caller runs it
    itself).  When the job's child died of a signal, this process dies of the same signal."""
    sock_path = os.environ.get(ENV)
    if not sock_path:
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(START_TIMEOUT_S)
        s.connect(sock_path)
        payload = json.dumps({"argv": list(argv), "cwd": os.getcwd(), "env": dict(os.environ),
                              "executable": sys.executable}).encode()
        socket.send_fds(s, [_HEADER.pack(len(payload)) + payload], [0, 1, 2])
        replies = s.makefile("rb")
        started = read(replies)  # {"pid": …} once the child runs the job; {"refused": why} when it cannot
        if not isinstance(started, dict) or "pid" not in started:
            raise ValueError(started)
    except (OSError, ValueError, EOFError):
        s.close()
        return None
    try:
        s.settimeout(None)  # the job's own time
        status = read(replies)["status"]
    except (OSError, ValueError, EOFError, KeyError, TypeError):
        sys.stderr.write("ckptaudit: the stage job server ended before this job did; run the audit again\n")
        return 1
    finally:
        replies.close()
        s.close()
    if status < 0:  # died of signal -status: so does this process, as the job's own process would have
        try:
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
            pass
        os.kill(os.getpid(), -status)
        return 128 - status
    return int(status)


def send(s: socket.socket, message: dict) -> None:
    out = json.dumps(message).encode()
    s.sendall(_HEADER.pack(len(out)) + out)


def read(replies):
    """The next message from the buffered reader of a connection."""
    head = replies.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise EOFError("connection closed")
    body = replies.read(_HEADER.unpack(head)[0])
    if len(body) < _HEADER.unpack(head)[0]:
        raise EOFError("connection closed")
    return json.loads(body)


def recv(s: socket.socket, first: bytes = b""):
    """The one message a job sends (after ``first``, the bytes already received with its descriptors)."""
    buf = bytearray(first)
    while len(buf) < _HEADER.size or len(buf) < _HEADER.size + _HEADER.unpack_from(buf)[0]:
        chunk = s.recv(1 << 16)
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return json.loads(bytes(buf[_HEADER.size:_HEADER.size + _HEADER.unpack_from(buf)[0]]))
