"""Helpers shared by the fw_*.py fixture modules (no framework is imported at module level).

Kills during a framework's own save
-----------------------------------
``kill_in_torch_save(match)`` wraps ``torch.save``: when the framework calls it
for a path ``match`` accepts, the wrapper measures the object's serialized size
(into memory), sets ``RLIMIT_FSIZE`` to a fraction of it and installs a native
``SIGXFSZ`` handler that sends the process ``SIGKILL``; then it calls the real
``torch.save`` on the real path.  torch's own zip writer writes the file in
place, the kernel stops it at exactly that many bytes, and the process dies by
SIGKILL inside the write: the folder holds exactly what torch leaves.

``kill_in_safetensors_save(module, match)`` does the same for
``safetensors.torch.save_file`` as bound in ``module``.  safetensors >= 0.7
writes in Rust, holding the GIL, through ``tempfile::NamedTempFile`` in the
target folder (``.tmp`` + 6 characters, mode 0600, ``O_EXCL``), sizes it to the
final length with ``ftruncate`` first, then writes header and tensors
sequentially and renames (seen with strace for 0.8.0).  ``ftruncate`` beyond
``RLIMIT_FSIZE`` fails before any byte is written, so the limit cannot stop it
midway; the wrapper therefore replays that same sequence in Python with the
bytes of ``safetensors.torch.save`` (the same serializer) and SIGKILLs itself
after the given fraction of the bytes is written.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import random
import resource
import signal
import string
import subprocess
import sys
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_HANDLER_T = ctypes.CFUNCTYPE(None, ctypes.c_int)


def _on_sigxfsz(_sig):
    _libc.kill(_libc.getpid(), signal.SIGKILL)


_HANDLER = _HANDLER_T(_on_sigxfsz)   # kept alive for the life of the process


def arm_kill_at_file_size(nbytes: int) -> None:
    """SIGKILL this process as soon as any write would grow a file past ``nbytes``."""
    _libc.signal.restype = ctypes.c_void_p
    _libc.signal.argtypes = [ctypes.c_int, _HANDLER_T]
    _libc.signal(signal.SIGXFSZ, _HANDLER)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (max(1, int(nbytes)), hard))


def kill_in_torch_save(match, fraction: float = 0.5, log: Path | None = None) -> None:
    """Wrap torch.save: the call whose path ``match(path)`` accepts is killed after ``fraction`` of its bytes."""
    import torch

    orig = torch.save

    def save(obj, f, *a, **kw):
        if isinstance(f, (str, os.PathLike)) and match(os.fspath(f)):
            buf = io.BytesIO()
            orig(obj, buf, *a, **kw)
            n = buf.getbuffer().nbytes
            cut = int(n * fraction)
            if log:
                Path(log).write_text(json.dumps({"file": os.fspath(f), "full_bytes": n, "killed_at_byte": cut}))
            arm_kill_at_file_size(cut)
            orig(obj, f, *a, **kw)
            raise RuntimeError("the armed save was not killed")   # pragma: no cover
        return orig(obj, f, *a, **kw)

    torch.save = save


def safetensors_partial_write_then_kill(tensors, filename, metadata=None, fraction: float = 0.5,
                                        log: Path | None = None):
    """Replay safetensors' own write sequence for ``filename`` and SIGKILL partway (see module doc)."""
    from safetensors.torch import save as st_save

    data = st_save(tensors, metadata=metadata)
    folder = os.path.dirname(os.path.abspath(os.fspath(filename)))
    header = 8 + int.from_bytes(data[:8], "little")
    cut = header + int((len(data) - header) * fraction)
    while True:
        tmp = os.path.join(folder, ".tmp" + "".join(random.choices(string.ascii_letters + string.digits, k=6)))
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    os.ftruncate(fd, len(data))
    if log:
        Path(log).write_text(json.dumps({"file": os.fspath(filename), "temp": os.path.basename(tmp),
                                         "full_bytes": len(data), "header_bytes": header, "killed_at_byte": cut}))
    view = memoryview(data)
    done = 0
    while done < cut:
        done += os.write(fd, view[done:cut])
    os.kill(os.getpid(), signal.SIGKILL)


def kill_in_safetensors_save(module, match, fraction: float = 0.5, attr: str = "safe_save_file",
                             log: Path | None = None) -> None:
    """Wrap ``module.<attr>`` (safetensors.torch.save_file as the framework bound it)."""
    orig = getattr(module, attr)

    def save_file(tensors, filename, metadata=None, *a, **kw):
        if match(os.fspath(filename)):
            return safetensors_partial_write_then_kill(tensors, filename, metadata, fraction, log)
        return orig(tensors, filename, metadata, *a, **kw)

    setattr(module, attr, save_file)


# ---- running training in a child that may die
def run_child(target: str, kwargs: dict, expect_kill: bool = False, timeout: float = 600,
              cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run ``module:function(**kwargs)`` in a child of the fork server (:mod:`._forked`: torch and the fixture's
    framework imported; ``python -m tests.frameworks._util module:function JSON`` runs it in a fresh interpreter by
    hand); check it exits 0, or dies by SIGKILL.  Returns its exit code and output; raises ``RuntimeError`` with
    the output's tail otherwise, ``subprocess.TimeoutExpired`` (after killing it) past ``timeout`` seconds."""
    import tempfile

    from . import _forked

    module, fn = target.split(":")
    with tempfile.TemporaryDirectory(prefix="ckptaudit-child-") as td:
        out, err = os.path.join(td, "stdout"), os.path.join(td, "stderr")
        p = _forked.start(module, fn, kwargs, stdout=out, stderr=err, cwd=cwd)
        if p.wait(timeout) is None:
            p.kill()
            p.wait()
            raise subprocess.TimeoutExpired(target, timeout)
        with open(out, errors="replace") as fo, open(err, errors="replace") as fe:
            r = subprocess.CompletedProcess([target], p.returncode, fo.read(), fe.read())
    want = -signal.SIGKILL if expect_kill else 0
    if r.returncode != want:
        raise RuntimeError(f"{target} exited {r.returncode}, expected {want}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r


def seed_all(seed: int = 0) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)


def truncate(path: Path, fraction: float = 0.5) -> dict:
    path = Path(path)
    n = path.stat().st_size
    keep = int(n * fraction)
    with open(path, "r+b") as f:
        f.truncate(keep)
    return {"file": str(path), "full_bytes": n, "kept_bytes": keep}


def st_all_finite(path: Path) -> bool:
    """True when every float tensor of a safetensors file is finite (read with safetensors itself)."""
    import torch
    from safetensors.torch import load_file

    return all(torch.isfinite(t).all().item() for t in load_file(str(path)).values() if t.is_floating_point())


def truth(fixture, framework, producer, description, expect, expected_model_args=None, target=None) -> dict:
    return {"fixture": fixture, "framework": framework, "producer": producer, "description": description,
            "audit_config": {"expected_model_args": dict(expected_model_args or {}), "target": dict(target or {})},
            "expect": expect}


def clean_expect(newest: str) -> dict:
    return {"recommendation": "resume", "rollback": newest, "clean": True, "damaged": {}}


def _main(argv):
    import importlib

    from . import _torchvision

    _torchvision.install()  # as generate.py's children: torchvision importable with the CPU torch

    mod, fn = argv[0].split(":")
    getattr(importlib.import_module(mod), fn)(**json.loads(argv[1]))


if __name__ == "__main__":
    _main(sys.argv[1:])
