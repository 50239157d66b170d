"""Private helpers of the framework fixtures: run a training function in child
processes (1 or 2 gloo ranks on localhost, torchrun-style environment), and
SIGKILL a process partway through one file of the framework's own save.

A fixture's make_fn cannot kill itself and still return its truth, so every
training runs in child processes started here, from the fixture's fork server
(:mod:`._forked`: torch and the framework already imported); ``main`` below runs
the same function in a fresh interpreter, by hand::

    python -m tests.frameworks._dist --module tests.frameworks.fw_deepspeed --fn _train \
        --kwargs JSON   # with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set

Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1
and a free MASTER_PORT.  When a rank exits non-zero (a staged SIGKILL), the
others are ended (SIGTERM, then SIGKILL) as torchrun's agent does, so no rank
waits on a collective for gloo's 30-minute timeout.

No framework is imported at module level.
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Optional

from . import _forked

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- launching

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(module: str, fn: str, world_size: int, kwargs: dict, log_dir: Path,
           timeout: float = 300.0, env: Optional[Dict[str, str]] = None) -> Dict[int, int]:
    """Run ``module.fn(**kwargs)`` on ``world_size`` ranks; return {rank: returncode}
    (a SIGKILLed rank: -9; a rank ended here after another failed: -15 or -9)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = {}
    base = dict(os.environ)
    base.update(env or {})
    base["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p])
    base.setdefault("OMP_NUM_THREADS", "1")
    base.setdefault("PYTHONHASHSEED", "0")
    for r in range(world_size):
        e = dict(base, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world_size),
                 LOCAL_WORLD_SIZE=str(world_size), GROUP_RANK="0", NODE_RANK="0",
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        log = log_dir / f"rank{r}.log"
        log.write_bytes(b"")
        procs[r] = _forked.start(module, fn, kwargs, stdout=str(log), stderr=str(log), env=e, cwd=str(REPO),
                                 ranks=True)
    codes: Dict[int, int] = {}
    deadline = time.monotonic() + timeout
    failed_at = None
    while len(codes) < world_size:
        for r, p in procs.items():
            if r not in codes and p.poll() is not None:
                codes[r] = p.returncode
                if p.returncode != 0 and failed_at is None:
                    failed_at = time.monotonic()
                    for r2, p2 in procs.items():
                        if r2 not in codes and p2.poll() is None:
                            p2.terminate()
        if failed_at is not None and time.monotonic() - failed_at > 10:
            for r2, p2 in procs.items():
                if r2 not in codes and p2.poll() is None:
                    p2.kill()
        if time.monotonic() > deadline:
            for r2, p2 in procs.items():
                if p2.poll() is None:
                    p2.kill()
            for r2, p2 in procs.items():
                codes.setdefault(r2, p2.wait())
            break
        time.sleep(0.05)
    return codes


def log_tail(log_dir: Path, n: int = 3000) -> str:
    out = []
    for f in sorted(log_dir.glob("rank*.log")):
        out.append(f"--- {f.name}\n" + f.read_bytes()[-n:].decode("utf-8", "replace"))
    return "\n".join(out)


def check_codes(codes: Dict[int, int], log_dir: Path, expect_killed: Optional[int] = None) -> None:
    """Raise unless every rank exited 0 (or, with ``expect_killed``, that rank died of SIGKILL)."""
    if expect_killed is None:
        if any(c != 0 for c in codes.values()):
            raise RuntimeError(f"training failed: exit codes {codes}\n{log_tail(log_dir)}")
    else:
        if codes.get(expect_killed) != -signal.SIGKILL:
            raise RuntimeError(f"rank {expect_killed} was meant to die of SIGKILL: exit codes {codes}\n"
                               f"{log_tail(log_dir)}")


# --------------------------------------------------------------------------- killing a save

def _die(note: Optional[Path], info: dict) -> None:
    if note is not None:
        note.write_text(json.dumps(info))
    os.kill(os.getpid(), signal.SIGKILL)


class KillingWriter(io.RawIOBase):
    """A binary writer over a real open file that, once ``after`` bytes have gone
    through it, writes the bytes up to ``after``, flushes and fsyncs them, and
    SIGKILLs this process.  No ``fileno`` is offered, so torch's serializer
    writes every byte through :meth:`write`."""

    def __init__(self, raw, after: int, note: Optional[Path] = None, info: Optional[dict] = None):
        super().__init__()
        self._raw = raw
        self._after = int(after)
        self._n = 0
        self._note = note
        self._info = dict(info or {})

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        b = bytes(b)
        if self._n + len(b) >= self._after:
            cut = self._after - self._n
            self._raw.write(b[:cut])
            self._raw.flush()
            os.fsync(self._raw.fileno())
            self._info.update(bytes_written=self._after)
            _die(self._note, self._info)
        self._raw.write(b)
        self._n += len(b)
        return len(b)

    def tell(self) -> int:
        return self._n

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        self._raw.flush()


def kill_torch_save(match: Callable[[str], bool], fraction: float = 0.5, note: Optional[Path] = None) -> None:
    """Patch ``torch.save`` in this process so that a save to a path for which
    ``match`` is true stops partway and the process SIGKILLs itself.

    The save itself is torch's own, to the real path, with the caller's options
    (so the bytes, zip folder name included, are the ones the framework writes):
    for the duration of that one call the process's file-size limit
    (``RLIMIT_FSIZE``) is set to ``fraction`` of the file's size (measured first by
    a save of the same object to memory) and SIGXFSZ is ignored, so torch's
    writer gets EFBIG once that many bytes are on disk; the process then
    SIGKILLs itself before the error reaches the framework.  What is left is the
    prefix that a SIGKILL at that point of the save leaves.  (The full size is
    measured by the same save to a file of the same name in a temp folder.)"""
    import resource
    import tempfile

    import torch

    orig = torch.save

    def save(obj, f, *a, **kw):
        if isinstance(f, (str, os.PathLike)) and match(os.fspath(f)):
            with tempfile.TemporaryDirectory() as td:
                probe = os.path.join(td, os.path.basename(os.fspath(f)))
                orig(obj, probe, *a, **kw)
                size = os.path.getsize(probe)
            after = max(1, int(size * fraction))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            err = None
            resource.setrlimit(resource.RLIMIT_FSIZE, (after, hard))
            try:
                orig(obj, f, *a, **kw)
            except BaseException as e:  # noqa: BLE001 - EFBIG from torch's writer, expected
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            _die(note, {"file": os.fspath(f), "size": size, "bytes_written": os.path.getsize(os.fspath(f)),
                        "how": "torch.save to the path, stopped by RLIMIT_FSIZE, then SIGKILL",
                        "writer_error": err})
        return orig(obj, f, *a, **kw)

    torch.save = save


# --------------------------------------------------------------------------- rank entry point

def _seed(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def prepare_rank() -> None:
    """What every rank does before its function, started here (``_forked``) or by hand (:func:`main`): one
    intra-op thread, every generator seeded with 0."""
    import torch

    torch.set_num_threads(1)
    _seed(0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", required=True)
    ap.add_argument("--fn", required=True)
    ap.add_argument("--kwargs", default="{}")
    a = ap.parse_args(argv)
    from . import _torchvision

    _torchvision.install()  # lightning imports torchmetrics, which imports torchvision when it is installed
    prepare_rank()
    mod = importlib.import_module(a.module)
    getattr(mod, a.fn)(**json.loads(a.kwargs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
