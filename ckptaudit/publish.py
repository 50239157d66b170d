"""Writer side: publish checkpoints that are fully visible or not at all.

The audit finds damage after the fact; this module keeps training code from making it.
Use it from any training loop::

    from ckptaudit.publish import save, Retention
    save(ckpt, "out/", step=iter_num, config=cfg, metrics={"val_loss": loss},
         retention=Retention(keep_last=3, keep_every=10_000))

or, to write several files (or one per rank)::

    with publish("out/", step, folder=True, rank=rank, world_size=ws) as pub:
        pub.save(model_shard, f"model_rank{rank:05d}.pt")        # torch.save through a hashing writer
        with pub.open("extra.bin") as f: f.write(blob)             # any bytes
        some_library.save_file(tensors, pub.path("w.safetensors")) # writers that need a path

On-disk protocol
----------------
Names.  A *file unit* is ``<run_dir>/ckpt_<step:06d>.pt`` (or ``name=``) with
``<file>.sha256`` and ``<file>.manifest.json`` beside it; a *folder unit* is
``<run_dir>/checkpoint-<step>/`` (or ``name=``; name it after its layout:
``global_stepN`` for DeepSpeed, ``checkpoint-N`` for the HF Trainer, any name for a
torch.distributed.checkpoint folder, since the audit recognises folders by layout) with
``<file>.sha256`` beside every file, ``manifest.json`` and the completion marker
``COMPLETE``.  Temporary names start with ``.ckptaudit-tmp-<host>-<pid>-<random>-``
(``ckptaudit.inventory.IN_PROGRESS_PATTERNS``: the audit and
:func:`ckptaudit.safe_load_checkpoint` treat them as in progress, never as a rollback
point).  ``<host>`` is 8 hex digits of the SHA-256 of the host name, ``<pid>`` the
writer's process id (rank 0's for a folder), so :func:`prune` can sweep leftovers of dead
writers on this host.

Sidecars are ``sha256sum`` format, ``<64 hex>  <file name>\\n`` (GNU coreutils manual,
"md5sum invocation"), so ``cd unit && sha256sum -c *.sha256`` checks a unit without
Python.  The manifest (``ckptaudit.manifest/1``, read by
:func:`ckptaudit.hashing.load_manifest`) is JSON whose first key is ``schema`` (the
inventory recognises it from its first 64 bytes)::

    {"schema": "ckptaudit.manifest/1", "unit": "checkpoint-500", "step": 500,
     "files": [{"path": "model.pt", "size_bytes": 372216, "sha256_hex": "…",
                "chunk_bytes": 67108864, "chunk_sha256_hex": ["…"], "rank": 0}],
     "versions": {"python": "3.12.3", "torch": "2.13.0", "ckptaudit": "…"},
     "world_size": 1, "config": {…}, "metrics": {"val_loss": 1.23}, "created_unix": 1.7e9}

``chunk_sha256_hex`` holds the SHA-256 of each ``chunk_bytes`` slice (64 MiB by default;
the last is shorter), so one huge file is verified on all cores at once and a mismatch
names the damaged byte range (:func:`ckptaudit.hashing.hash_unit`).  ``COMPLETE`` holds
the manifest's SHA-256 in sha256sum format (``sha256sum -c COMPLETE`` checks it).

Order of operations, file unit (``save``; one process)::

    1  create .ckptaudit-tmp-…-ckpt_000500.pt (O_EXCL) and torch.save into it through a
       writer that hashes every byte (whole-file SHA-256 of the buffers torch hands over,
       inline; each finished 64 MiB chunk read back from the file and hashed on a thread
       pool while writing goes on)
    2  fsync(file); with verify=True, re-read it and check every chunk digest
    3  write ckpt_000500.pt.sha256, then ckpt_000500.pt.manifest.json (the marker):
       each to a temp name, fsync, os.replace
    4  os.rename(temp file, ckpt_000500.pt)           <- the commit
    5  fsync(run_dir)
    6  latest: write the unit name to a temp file, fsync, os.replace(temp, latest),
       fsync(run_dir); optional symlink: os.symlink(name, temp); os.replace(temp, link)
    7  retention (prune)

Folder unit (``publish(..., folder=True)``; every rank)::

    1  rank 0 creates .ckptaudit-tmp-…-checkpoint-500/ and broadcasts its name
    2  each rank writes its own files in it (hashed while written, fsynced on close)
       and a <file>.sha256 beside each
    3  all_gather of every rank's file records (or its error) to every rank
    4  rank 0, only if every rank succeeded: each file exists with its recorded size and
       (verify; on by default for world_size > 1) every chunk verifies; files nobody
       registered (e.g. a DCP .metadata) are adopted: fsynced, hashed, given a sidecar
    5  rank 0 writes manifest.json (temp, fsync, os.replace); fsyncs every folder in the unit
    6  os.rename(temp folder, checkpoint-500); fsync(run_dir)   <- the data commit
    7  COMPLETE (temp, fsync, os.replace) in the final folder; fsync(folder)  <- the marker
    8  latest and retention as for a file unit; rank 0 broadcasts the outcome

A folder that has ``manifest.json`` but no ``COMPLETE`` is in progress
(``ckptaudit.inventory._dir_unit``).  Writing the marker *after* the rename (as Orbax does
with ``commit_success.txt`` on GCS) keeps the protocol correct where renaming a folder is
not atomic: on object-store FUSE mounts (gcsfuse, s3fs, mountpoint-s3) a folder rename is a
copy then a delete, so the destination fills up file by file; the folder only counts once
the marker, a single small object, appears.  On POSIX file systems the rename alone is
already atomic (POSIX ``rename()``: "If the link named by the new argument exists, it shall
be removed and old renamed to new ... without an intermediate state").

Why each fsync.  ``rename`` only orders names, not data: after a power loss ext4, XFS
and btrfs can show the new name with a file whose data blocks were never written (the
zero-filled tails the audit reports as ``zero_filled_tail``), so the data is fsynced before
the rename.  A rename is only durable once its folder is fsynced (``fsync(2)``: "Calling
fsync() does not necessarily ensure that the entry in the directory containing the file
has also reached disk. For that an explicit fsync() on a file descriptor for the directory
is also needed"); so the parent is fsynced after every rename.  On NFS, close-to-open
consistency (RFC 7530 §10.3.1) only promises other clients see a file's data after the
writer closes it; fsync sends NFS COMMIT so the server has it on stable storage.  Every
rank therefore fsyncs and closes its own files before rank 0 (possibly on another node)
verifies them.  Folder fsync fails with EINVAL on some FUSE mounts that cannot make a
folder durable; that is logged once and ignored.  NFS clients may retry a rename whose
reply was lost and then report ENOENT although the rename happened; a rename that raises
FileNotFoundError while the destination exists and the source is gone counts as done.

What a crash leaves.  Killed before the commit rename: a temp leftover (in progress, never
a rollback point) and, for a file unit, possibly a sidecar and manifest without their data
file (ignored by the audit; the next publish of that name replaces them).  Killed between
the folder rename and the marker: a folder in progress.  Killed after the commit: a
complete unit, with ``latest`` possibly still naming the previous one (the audit reports
``latest_pointer_not_newest``).  ``latest`` always names a complete unit: it moves only
after the commit and only forwards (never to an older step than it names).

Retention (:func:`prune`) deletes only units that are complete, verified (every file
matches its manifest or sidecar) and older than the newest verified unit (the rollback
point, never deleted), and never the unit ``latest`` names.  A deletion renames the unit
to a temp name first, so a crash mid-delete leaves an in-progress leftover, never a torn
unit.  :func:`seal` writes sidecars and manifests for existing checkpoints that pass the
audit, without touching data files.  :class:`PreemptionGuard` turns SIGTERM/SIGUSR1
into a flag the loop checks, finishing (or abandoning) the save in flight.

Imports nothing heavy at module level: torch is imported by :meth:`Publication.save`,
``torch.distributed`` only for ``world_size > 1``, the audit only by :func:`seal`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import stat
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import click

from ._version import __version__
from . import fs
from .hashing import chunk_sha256, sha256_range

log = logging.getLogger("ckptaudit.publish")

SCHEMA = "ckptaudit.manifest/1"
MANIFEST_NAME = "manifest.json"
COMPLETE_MARKER = "COMPLETE"
TMP_PREFIX = ".ckptaudit-tmp-"
LATEST_NAME = "latest"
SIDECAR_SUFFIX = ".sha256"
DEFAULT_CHUNK_BYTES = 64 << 20
_TMP_RE = re.compile(r"^\.ckptaudit-tmp-([0-9a-f]{8})-(\d+)-([0-9a-f]{8})-(.+)$")
_RESERVED = (MANIFEST_NAME, COMPLETE_MARKER, "ckptaudit.manifest.json")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class PublishError(RuntimeError):
    """A publish that did not happen.  ``causes`` maps each failed rank (or step of the
    protocol, e.g. ``"commit"``) to why; the unit was not made visible."""

    def __init__(self, unit: str, causes: Dict[str, str]):
        self.unit = unit
        self.causes = dict(causes)
        lines = [f"{unit}: not published ({len(causes)} cause(s))"] + [f"  {k}: {v}" for k, v in causes.items()]
        super().__init__("\n".join(lines))


class Preempted(BaseException):
    """Raised by :class:`PreemptionGuard` (``mode="abandon"``) inside a save that is still
    writing data.  A ``BaseException``, like ``KeyboardInterrupt``, so ``except Exception``
    in training code does not swallow it.  ``signum`` is the signal received."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"preempted by signal {signal.Signals(signum).name} during a save; the save was abandoned")


# --------------------------------------------------------------------------- small helpers
def _host_tag() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def tmp_name(final_name: str) -> str:
    """A temporary name for ``final_name``: ``.ckptaudit-tmp-<host8>-<pid>-<rand8>-<final_name>``."""
    return f"{TMP_PREFIX}{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}-{final_name}"


class _Clock:
    """Accumulates wall-clock seconds per key (``fsync_seconds``, ``verify_seconds`` …)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    @contextmanager
    def __call__(self, key: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0


_DIR_FSYNC_WARNED = False


def _fsync_dir(path: Path, clock: _Clock) -> None:
    """fsync a folder so the renames inside it are durable (see the module docstring)."""
    global _DIR_FSYNC_WARNED
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        with clock("fsync_seconds"):
            os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
        if not _DIR_FSYNC_WARNED:
            log.warning("%s: this file system cannot fsync a folder (%s); renames are not made durable",
                        path, e.strerror)
            _DIR_FSYNC_WARNED = True
    finally:
        os.close(fd)


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _atomic_write(path: Path, data: bytes, clock: _Clock) -> None:
    """Write ``data`` to a temp name beside ``path``, fsync, ``os.replace`` onto ``path``.
    The caller fsyncs the folder.  Raises ``OSError`` (the temp file is removed)."""
    tmp = path.with_name(tmp_name(path.name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
    try:
        _write_all(fd, data)
        with clock("fsync_seconds"):
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quiet(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink_quiet(tmp)
        raise


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _remove_tree_quiet(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("%s: could not remove (%s)", path, e.strerror)


def _rename(src: Path, dst: Path) -> None:
    """``os.rename`` that tolerates the NFS retry case (ENOENT although the rename happened)."""
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        if dst.exists() and not src.exists():
            log.warning("%s -> %s: rename reported ENOENT but the destination exists (NFS retry); "
                        "treating it as done", src, dst)
            return
        raise


def sidecar_text(sha256_hex: str, file_name: str) -> str:
    """One ``sha256sum`` line: ``<64 hex>  <name>\\n``."""
    return f"{sha256_hex}  {file_name}\n"


def _versions() -> Dict[str, str]:
    out = {"python": platform.python_version(), "ckptaudit": __version__, "platform": platform.platform()}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
    else:
        try:
            import importlib.metadata as md

            out["torch"] = md.version("torch")
        except Exception:  # noqa: BLE001 - torch not installed: nothing to record
            pass
    return out


def _jsonable(obj: Any) -> Any:
    """``obj`` round-tripped through JSON, with anything JSON cannot hold as ``str``."""
    return json.loads(json.dumps(obj, default=str))


def manifest_bytes(doc: Dict[str, Any]) -> bytes:
    """Manifest JSON with ``schema`` first (the inventory recognises it from 64 bytes)."""
    ordered = {"schema": SCHEMA, **{k: v for k, v in doc.items() if k != "schema"}}
    return (json.dumps(ordered, indent=1) + "\n").encode()


# --------------------------------------------------------------------------- file records
@dataclass
class FileRecord:
    """One published file.  ``path`` is relative to the manifest's folder (the unit folder,
    or the run folder for a file unit); sizes in bytes; ``rank`` is the writer's rank (-1: a
    file no rank registered, adopted by rank 0 at the commit, e.g. a DCP ``.metadata``)."""

    path: str
    size_bytes: int
    sha256_hex: str
    chunk_bytes: int
    chunk_sha256_hex: List[str]
    rank: int = 0


def hash_file(path: Path, rel: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES, rank: int = 0,
              workers: Optional[int] = None) -> FileRecord:
    """Whole-file SHA-256 (streamed, this thread) and chunk digests (thread pool, all cores,
    concurrently) of an existing file.  Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        n = -(-size // chunk_bytes)
        with ThreadPoolExecutor(max_workers=max(1, min(n, workers or os.cpu_count() or 1))) as pool:
            futs = [pool.submit(sha256_range, fd, i * chunk_bytes, min(chunk_bytes, size - i * chunk_bytes))
                    for i in range(n)]
            full = sha256_range(fd, 0, size)
            chunks = [f.result() for f in futs]
    finally:
        os.close(fd)
    return FileRecord(rel, size, full, chunk_bytes, chunks, rank)


class HashingWriter:
    """Binary write-only file (what ``torch.save`` needs: ``write``, ``flush``) that hashes
    every byte it writes: the whole-file SHA-256 inline, and each completed ``chunk_bytes``
    chunk from the page cache (``os.preadv``) on ``pool`` while writing continues.

    ``close()`` fsyncs, waits for the chunk digests, closes the descriptor and sets
    ``record``.  ``abort()`` closes without fsync (the caller removes the file).  Creating
    it raises ``FileExistsError`` if ``path`` exists (``O_EXCL``).
    """

    def __init__(self, path: Path, rel: str, chunk_bytes: int, pool: ThreadPoolExecutor, clock: _Clock,
                 rank: int = 0):
        self.path, self.rel, self.chunk_bytes, self.rank = Path(path), rel, chunk_bytes, rank
        self._pool, self._clock = pool, clock
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
        self._full = hashlib.sha256()
        self.written = 0
        self._chunks: List[Future] = []
        self.closed = False
        self.record: Optional[FileRecord] = None
        self.error: Optional[OSError] = None  # the first failed write, if any

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n = len(view)
        try:
            _write_all(self.fd, view)
        except OSError as e:  # ENOSPC, EDQUOT, EFBIG: kept, since torch.save masks it with its own error
            self.error = e
            raise
        self._full.update(view)
        self.written += n
        cb = self.chunk_bytes
        while (len(self._chunks) + 1) * cb <= self.written:
            self._chunks.append(self._pool.submit(sha256_range, self.fd, len(self._chunks) * cb, cb))
        return n

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.written

    def close(self) -> FileRecord:
        if self.record is not None:
            return self.record
        if self.closed:
            raise ValueError(f"{self.path}: closed after a failure or abort; it has no record")
        cb = self.chunk_bytes
        if len(self._chunks) * cb < self.written:
            off = len(self._chunks) * cb
            self._chunks.append(self._pool.submit(sha256_range, self.fd, off, self.written - off))
        try:
            with self._clock("fsync_seconds"):
                os.fsync(self.fd)
            chunks = [f.result() for f in self._chunks]
        finally:
            self._release()
        self.record = FileRecord(self.rel, self.written, self._full.hexdigest(), cb, chunks, self.rank)
        return self.record

    def abort(self) -> None:
        if not self.closed:
            self._release()

    def _release(self) -> None:
        """Wait for the chunk workers, then close the descriptor exactly once.

        Safe to call again after a :class:`Preempted` raised part-way through it: the
        descriptor is taken out of ``self.fd`` before it is closed, so a second call never
        closes a number the process may have reused (at worst one descriptor leaks)."""
        for f in self._chunks:  # never close the fd while a worker may still read it
            f.cancel()
            if not f.cancelled():
                f.exception()
        fd, self.fd = self.fd, -1
        self.closed = True
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False


# --------------------------------------------------------------------------- collectives
class _Comm:
    """The few collectives a folder publish needs; trivial for one process."""

    def __init__(self, rank: int, world_size: int, group: Any):
        self.rank, self.world_size, self.group = rank, world_size, group
        self.dist = None
        if world_size > 1:
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_initialized():
                raise ValueError(f"world_size={world_size} needs an initialised torch.distributed process group "
                                 "(dist.init_process_group) or group=")
            self.dist = dist
            self.src = dist.get_global_rank(group, 0) if group is not None else 0

    def broadcast(self, obj: Any) -> Any:
        if self.dist is None:
            return obj
        box = [obj if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=self.src, group=self.group)
        return box[0]

    def all_gather(self, obj: Any) -> List[Any]:
        if self.dist is None:
            return [obj]
        out: List[Any] = [None] * self.world_size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out


# --------------------------------------------------------------------------- publish
@dataclass(frozen=True)
class Retention:
    """What :func:`prune` keeps after each publish (see there).  Counts are units; steps
    are optimizer steps; ``metric`` is a key of the ``metrics`` given to publish."""

    keep_last: Optional[int] = None
    keep_every: Optional[int] = None
    keep_best: Optional[int] = None
    metric: Optional[str] = None
    mode: str = "min"
    sweep_stale: bool = False


@dataclass
class PublishResult:
    """A published unit.  ``seconds``: ``write_seconds`` (inside the ``with`` block, torch.save
    included), ``fsync_seconds`` (every fsync of files and folders), ``verify_seconds``,
    ``commit_seconds`` (leaving the block to the marker), ``total_seconds``."""

    unit: str
    path: Path
    step: int
    files: List[FileRecord]
    size_bytes: int
    latest_updated: bool
    seconds: Dict[str, float] = field(default_factory=dict)
    pruned: List[str] = field(default_factory=list)


# phase of the publishes in flight in this process ("writing" or "commit"), for PreemptionGuard
_PHASES: List[str] = []


def _check_name(name: str, what: str) -> None:
    p = Path(name)
    if not name or p.is_absolute() or ".." in p.parts or name != p.as_posix():
        raise ValueError(f"{what} {name!r} must be a relative path inside the unit, without '..'")
    if p.name in _RESERVED or p.name.endswith(SIDECAR_SUFFIX) or p.name.startswith(TMP_PREFIX):
        raise ValueError(f"{what} {name!r} is reserved by the publish protocol (manifest, marker, sidecar, temp)")


class Publication:
    """What ``with publish(...) as pub`` gives: where this rank writes its files.

    ``tmp_path`` is the temporary folder (folder unit) or temporary file (file unit).  Files
    written through :meth:`save` and :meth:`open` are hashed while written; paths handed out
    by :meth:`path` are fsynced and hashed when the block ends.  ``result`` is set after a
    successful publish.
    """

    def __init__(self, ctx: "_Publish"):
        self._ctx = ctx
        self.result: Optional[PublishResult] = None

    @property
    def tmp_path(self) -> Path:
        return self._ctx.tmp_path

    @property
    def dir(self) -> Path:
        """The temporary unit folder (folder units only; raises ``ValueError`` otherwise)."""
        if not self._ctx.folder:
            raise ValueError("a file unit has no folder; use pub.save(obj) or pub.open()")
        return self._ctx.tmp_path

    def open(self, name: Optional[str] = None) -> HashingWriter:
        """A :class:`HashingWriter` for ``name`` (relative to the unit folder; for a file unit
        leave it None).  Raises ``ValueError`` for a bad or second name, ``FileExistsError``."""
        return self._ctx.open(name)

    def save(self, obj: Any, name: Optional[str] = None, **torch_save_kwargs: Any) -> FileRecord:
        """``torch.save(obj, …)`` into ``name`` through a hashing writer; returns its record.

        A failed write (disk full ``ENOSPC``, quota ``EDQUOT``, ``RLIMIT_FSIZE`` ``EFBIG``)
        and a :class:`Preempted` or ``KeyboardInterrupt`` raised mid-save are re-raised as
        themselves, not as the ``RuntimeError`` torch's zip writer raises over them when its
        ``__exit__`` tries to finish the archive (``unexpected pos … vs …``)."""
        import torch

        with self.open(name) as w:
            try:
                torch.save(obj, w, **torch_save_kwargs)
            except Exception as e:
                cause: Optional[BaseException] = w.error
                c = e.__context__
                while cause is None and c is not None:
                    if isinstance(c, (Preempted, KeyboardInterrupt, OSError)):
                        cause = c
                    c = c.__context__
                if cause is not None and cause is not e:
                    raise cause from None
                raise
        return w.record  # type: ignore[return-value]

    def path(self, name: str) -> Path:
        """A path inside the temporary folder for writers that need one (safetensors
        ``save_file``, ``torch.distributed.checkpoint``); this rank fsyncs and hashes it when
        the block ends.  Folder units only."""
        return self._ctx.path(name)


class _Publish:
    def __init__(self, run_dir, step, *, name, folder, config, metrics, rank, world_size, group, chunk_bytes,
                 update_latest, latest_symlink, verify, retention):
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        if world_size is None or rank is None:
            rank0, ws0 = 0, 1
            if "torch.distributed" in sys.modules:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    rank0, ws0 = dist.get_rank(group), dist.get_world_size(group)
            rank = rank0 if rank is None else rank
            world_size = ws0 if world_size is None else world_size
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        folder = world_size > 1 if folder is None else folder
        if world_size > 1 and not folder:
            raise ValueError("a multi-rank publish writes a folder unit (folder=True): each rank writes its own files")
        self.run_dir = Path(run_dir)
        self.step, self.folder, self.rank, self.world_size = step, folder, rank, world_size
        self.name = name or (f"checkpoint-{step}" if folder else f"ckpt_{step:06d}.pt")
        if "/" in self.name or self.name in (".", "..") or self.name.startswith(TMP_PREFIX):
            raise ValueError(f"unit name {self.name!r} must be a plain name inside run_dir")
        self.final = self.run_dir / self.name
        self.config, self.metrics = config, metrics
        self.chunk_bytes, self.verify = chunk_bytes, (world_size > 1 if verify is None else verify)
        self.update_latest, self.latest_symlink, self.retention = update_latest, latest_symlink, retention
        self.comm = _Comm(rank, world_size, group)
        self.clock = _Clock()
        self.writers: List[HashingWriter] = []
        self.path_names: List[str] = []
        self.tmp_path = Path()
        self.pool: Optional[ThreadPoolExecutor] = None
        self.pub = Publication(self)
        self.t_enter = 0.0

    # ----------------------------------------------------------------- enter
    def __enter__(self) -> Publication:
        self.t_enter = time.perf_counter()
        err = ""
        if self.rank == 0:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                if os.path.lexists(self.final):
                    raise FileExistsError(f"{self.final}: a unit with this name already exists; publish never "
                                          "replaces a unit (delete or prune it first)")
                self.tmp_path = self.run_dir / tmp_name(self.name)
                if self.folder:
                    os.mkdir(self.tmp_path)
            except OSError as e:
                err = f"{type(e).__name__}: {e}"
        tmp, err = self.comm.broadcast((str(self.tmp_path), err))
        if err:
            raise PublishError(self.name, {"rank 0 (start)": err})
        self.tmp_path = Path(tmp)
        self.pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="ckptaudit-hash")
        try:
            _PHASES.append("writing")
            return self.pub
        except BaseException:  # a Preempted between the push and the block: __exit__ will not run
            if _PHASES:
                _PHASES.pop()
            self.pool.shutdown(wait=True)
            if self.rank == 0 and self.folder:
                _remove_tree_quiet(self.tmp_path)
            raise

    def open(self, name: Optional[str]) -> HashingWriter:
        if self.folder:
            if name is None:
                raise ValueError("a folder unit needs a file name: pub.save(obj, 'model.pt')")
            _check_name(name, "file name")
            target = self.tmp_path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            rel = name
        else:
            if name not in (None, self.name):
                raise ValueError(f"a file unit holds one file, {self.name!r}; got {name!r} (use folder=True)")
            if self.writers:
                raise ValueError(f"{self.name}: a file unit is written once")
            target, rel = self.tmp_path, self.name
        w = HashingWriter(target, rel, self.chunk_bytes, self.pool, self.clock, self.rank)  # type: ignore[arg-type]
        self.writers.append(w)
        return w

    def path(self, name: str) -> Path:
        if not self.folder:
            raise ValueError("pub.path() is for folder units; a file unit is written with pub.save or pub.open")
        _check_name(name, "file name")
        p = self.tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        self.path_names.append(name)
        return p

    # ----------------------------------------------------------------- exit
    def __exit__(self, exc_type, exc, tb) -> bool:
        if _PHASES:  # from here on a preemption signal is only recorded (PreemptionGuard._handler)
            _PHASES[-1] = "closing"
        t_exit = time.perf_counter()
        self.clock.seconds["write_seconds"] = t_exit - self.t_enter
        try:
            if self.folder:
                self._exit_folder(exc)
            else:
                self._exit_file(exc)
        finally:
            if _PHASES:
                _PHASES.pop()
            if self.pool is not None:
                self.pool.shutdown(wait=True)
        if self.pub.result is not None:
            s = self.pub.result.seconds
            s["commit_seconds"] = time.perf_counter() - t_exit
            s["total_seconds"] = time.perf_counter() - self.t_enter
        return False  # an exception of the block propagates after the abandon

    def _close_local(self) -> List[FileRecord]:
        """Close this rank's writers (fsync) and hash its path-registered files."""
        recs = []
        for w in self.writers:
            recs.append(w.close())
        for name in self.path_names:
            p = self.tmp_path / name
            fd = os.open(p, os.O_RDONLY | _O_CLOEXEC)
            try:
                with self.clock("fsync_seconds"):
                    os.fsync(fd)
            finally:
                os.close(fd)
            recs.append(hash_file(p, name, self.chunk_bytes, self.rank))
        return recs

    def _abort_local(self) -> None:
        for w in self.writers:
            w.abort()

    def _verify(self, base: Path, recs: Sequence[FileRecord]) -> List[str]:
        """Problems with ``recs`` under ``base``: missing, wrong size, chunk mismatch."""
        problems = []
        with self.clock("verify_seconds"):
            for r in recs:
                p = base / r.path if self.folder else base
                try:
                    size = os.stat(p).st_size
                except OSError as e:
                    problems.append(f"rank {r.rank}'s file {r.path}: {e.strerror}")
                    continue
                if size != r.size_bytes:
                    problems.append(f"rank {r.rank}'s file {r.path}: expected {r.size_bytes} bytes, found {size}")
                    continue
                if self.verify:
                    got = chunk_sha256(p, r.chunk_bytes)
                    bad = [i for i, (a, b) in enumerate(zip(got, r.chunk_sha256_hex)) if a != b]
                    if bad or len(got) != len(r.chunk_sha256_hex):
                        problems.append(f"rank {r.rank}'s file {r.path}: chunk(s) {bad} of {r.chunk_bytes} bytes "
                                        "differ from what was written")
        return problems

    def _manifest(self, recs: Sequence[FileRecord]) -> Dict[str, Any]:
        return {"schema": SCHEMA, "unit": self.name, "step": self.step,
                "files": [asdict(r) for r in sorted(recs, key=lambda r: r.path)],
                "versions": _versions(), "world_size": self.world_size,
                "config": _jsonable(self.config) if self.config is not None else None,
                "metrics": _jsonable(self.metrics) if self.metrics is not None else None,
                "created_unix": time.time()}

    # file unit -----------------------------------------------------------
    def _exit_file(self, exc) -> None:
        if exc is not None or not self.writers:
            self._abort_local()
            _unlink_quiet(self.tmp_path)
            if exc is None:
                raise PublishError(self.name, {"rank 0": "nothing was written: call pub.save(obj) or pub.open()"})
            return
        sidecar = self.final.with_name(self.name + SIDECAR_SUFFIX)
        manifest = self.final.with_name(self.name + ".manifest.json")
        committed = False
        try:
            recs = self._close_local()
            _PHASES[-1] = "commit"
            problems = self._verify(self.tmp_path, recs)
            if problems:
                raise PublishError(self.name, {f"verify {i}": p for i, p in enumerate(problems)})
            if os.path.lexists(self.final):
                raise FileExistsError(f"{self.final}: appeared while publishing; not replacing it")
            _atomic_write(sidecar, sidecar_text(recs[0].sha256_hex, self.name).encode(), self.clock)
            _atomic_write(manifest, manifest_bytes(self._manifest(recs)), self.clock)
            _rename(self.tmp_path, self.final)
            committed = True
        except BaseException as e:
            self._abort_local()
            if not committed:
                _unlink_quiet(self.tmp_path)
                if not os.path.lexists(self.final):
                    _unlink_quiet(sidecar)
                    _unlink_quiet(manifest)
            if isinstance(e, (PublishError, KeyboardInterrupt, Preempted)):
                raise
            raise PublishError(self.name, {"rank 0 (commit)": f"{type(e).__name__}: {e}"}) from e
        _fsync_dir(self.run_dir, self.clock)  # after the commit: an OSError here is raised as is
        self._after_commit(recs)

    # folder unit ---------------------------------------------------------
    def _exit_folder(self, exc) -> None:
        local: Dict[str, Any] = {"rank": self.rank, "error": "", "files": []}
        local_exc: Optional[BaseException] = None
        if exc is not None:
            self._abort_local()
            local["error"] = f"{type(exc).__name__}: {exc}"
        else:
            try:
                recs = self._close_local()
                for r in recs:  # this rank's sidecars, beside each of its files
                    p = self.tmp_path / r.path
                    _atomic_write(p.with_name(p.name + SIDECAR_SUFFIX),
                                  sidecar_text(r.sha256_hex, p.name).encode(), self.clock)
                local["files"] = [asdict(r) for r in recs]
            except BaseException as e:  # noqa: BLE001 - reported to rank 0, re-raised below
                self._abort_local()
                local["error"] = f"{type(e).__name__}: {e}"
                local_exc = e
        _PHASES[-1] = "commit"
        gathered = self.comm.all_gather(local)
        outcome: Dict[str, Any] = {"error": {}, "result": None}
        if self.rank == 0:
            outcome = self._commit_folder(gathered)
        outcome = self.comm.broadcast(outcome)
        if exc is not None:
            return  # the block's own exception propagates
        if local_exc is not None:
            raise local_exc
        if outcome["error"]:
            raise PublishError(self.name, outcome["error"])
        res = outcome["result"]
        res["files"] = [FileRecord(**f) for f in res["files"]]
        res["path"] = Path(res["path"])
        self.pub.result = PublishResult(**res)
        if self.rank == 0:
            self.pub.result.seconds.update(self.clock.seconds)

    def _commit_folder(self, gathered: List[Dict[str, Any]]) -> Dict[str, Any]:
        causes = {f"rank {g['rank']}": g["error"] for g in gathered if g["error"]}
        recs = [FileRecord(**f) for g in gathered for f in g["files"]]
        seen: Dict[str, int] = {}
        for r in recs:
            if r.path in seen:
                causes[f"rank {r.rank}"] = f"{r.path} was also written by rank {seen[r.path]}"
            seen[r.path] = r.rank
        committed = False
        try:
            if causes:
                raise PublishError(self.name, causes)
            if not recs and not any(self._unregistered(seen)):
                raise PublishError(self.name, {"rank 0": "nothing was written into the unit"})
            problems = self._verify(self.tmp_path, recs)
            if problems:
                raise PublishError(self.name, {f"verify {i}": p for i, p in enumerate(problems)})
            for rel in self._unregistered(seen):  # e.g. torch.distributed.checkpoint's .metadata
                p = self.tmp_path / rel
                fd = os.open(p, os.O_RDONLY | _O_CLOEXEC)
                try:
                    with self.clock("fsync_seconds"):
                        os.fsync(fd)
                finally:
                    os.close(fd)
                r = hash_file(p, rel, self.chunk_bytes, rank=-1)
                _atomic_write(p.with_name(p.name + SIDECAR_SUFFIX), sidecar_text(r.sha256_hex, p.name).encode(),
                              self.clock)
                recs.append(r)
            manifest = self._manifest(recs)
            mbytes = manifest_bytes(manifest)
            _atomic_write(self.tmp_path / MANIFEST_NAME, mbytes, self.clock)
            for d in sorted({(self.tmp_path / r.path).parent for r in recs}, key=lambda x: -len(x.parts)):
                _fsync_dir(d, self.clock)
            _fsync_dir(self.tmp_path, self.clock)
            if os.path.lexists(self.final):
                raise FileExistsError(f"{self.final}: appeared while publishing; not replacing it")
            _rename(self.tmp_path, self.final)
            committed = True
            _fsync_dir(self.run_dir, self.clock)
            _atomic_write(self.final / COMPLETE_MARKER,
                          sidecar_text(hashlib.sha256(mbytes).hexdigest(), MANIFEST_NAME).encode(), self.clock)
            _fsync_dir(self.final, self.clock)
        except BaseException as e:  # noqa: BLE001 - every rank learns the cause from the broadcast
            if not committed:
                _remove_tree_quiet(self.tmp_path)
            if isinstance(e, (KeyboardInterrupt, Preempted)):
                raise
            return {"error": e.causes if isinstance(e, PublishError) else
                    {"rank 0 (commit)": f"{type(e).__name__}: {e}"}, "result": None}
        res = self._after_commit(recs)
        d = asdict(res)
        d["path"] = str(res.path)
        return {"error": {}, "result": d}

    def _unregistered(self, registered: Dict[str, int]) -> List[str]:
        out = []
        for dirpath, dirnames, filenames in os.walk(self.tmp_path):
            dirnames.sort()
            for fn in sorted(filenames):
                rel = (Path(dirpath) / fn).relative_to(self.tmp_path).as_posix()
                if rel in registered or fn.endswith(SIDECAR_SUFFIX) or fn.startswith(TMP_PREFIX) or \
                        rel in _RESERVED:
                    continue
                out.append(rel)
        return out

    # both ----------------------------------------------------------------
    def _after_commit(self, recs: List[FileRecord]) -> PublishResult:
        moved = False
        if self.update_latest:
            moved = update_latest(self.run_dir, self.name, self.step, symlink=self.latest_symlink, clock=self.clock)
        res = PublishResult(unit=self.name, path=self.final, step=self.step, files=recs,
                            size_bytes=sum(r.size_bytes for r in recs), latest_updated=moved,
                            seconds=dict(self.clock.seconds))
        if self.retention is not None:
            try:
                plan = prune(self.run_dir, **asdict(self.retention), _verified={self.name}, echo=None)
                res.pruned = [d.unit for d in plan.decisions if d.action == "delete"]
            except Exception as e:  # noqa: BLE001 - the publish stands; retention is retried next time
                log.warning("%s: published, but retention failed: %s: %s", self.name, type(e).__name__, e)
        if not self.folder:
            self.pub.result = res
        return res


def publish(run_dir: str | os.PathLike, step: int, *, name: Optional[str] = None, folder: Optional[bool] = None,
            config: Any = None, metrics: Optional[Dict[str, float]] = None, rank: Optional[int] = None,
            world_size: Optional[int] = None, group: Any = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
            update_latest: bool = True, latest_symlink: Optional[str] = None, verify: Optional[bool] = None,
            retention: Optional[Retention] = None):
    """Context manager that publishes one checkpoint unit of ``step`` into ``run_dir``.

    ``with publish(run_dir, step) as pub: pub.save(obj)`` — the unit becomes visible, with
    sidecars and a ``ckptaudit.manifest/1`` manifest, only when the block ends without an
    exception and everything verifies; on an exception the temporary files are removed
    and the exception propagates.  Protocol and guarantees: module docstring.

    ``folder``: False → one file ``ckpt_<step:06d>.pt``; True → a folder
    ``checkpoint-<step>/`` (default: True when ``world_size > 1``).  ``name`` overrides the
    unit's name.  ``config`` (the caller's config, JSON-able; anything else is stored as
    str) and ``metrics`` ({name: number}, for ``Retention(keep_best=…)``) go into the
    manifest.  ``rank``/``world_size``/``group``: default from an initialised
    torch.distributed process group, else 0/1; with ``world_size > 1`` every rank enters
    the block (the exit runs collectives on ``group``).  ``chunk_bytes``: bytes per chunk
    digest (64 MiB).  ``verify``: rank 0 re-reads every file and checks its chunk digests
    before the commit (on all cores); default (None): on when ``world_size > 1`` (rank 0 has
    not seen the other ranks' bytes, which may come over NFS), off in one process, where the
    chunk digests are already read back from the written file.  ``update_latest``: move
    ``run_dir/latest`` to this unit (only forwards); ``latest_symlink``: also swap a symlink
    of that name.  ``retention``: :func:`prune` after the commit.

    Raises ``ValueError`` for bad arguments, :class:`PublishError` when the unit exists or
    could not be published (``causes`` per rank), and re-raises the block's exception.  An
    ``OSError`` after the commit (fsync of the run folder, moving ``latest``) is raised as
    is: the unit is then published, its durability or ``latest`` not assured.  After the
    block, ``pub.result`` is a :class:`PublishResult`.
    """
    return _Publish(run_dir, step, name=name, folder=folder, config=config, metrics=metrics, rank=rank,
                    world_size=world_size, group=group, chunk_bytes=chunk_bytes, update_latest=update_latest,
                    latest_symlink=latest_symlink, verify=verify, retention=retention)


def save(obj: Any, run_dir: str | os.PathLike, step: int, **kwargs: Any) -> PublishResult:
    """Publish ``obj`` (``torch.save``-able) as the file unit ``run_dir/ckpt_<step:06d>.pt``.

    Shortcut for ``with publish(run_dir, step, **kwargs) as pub: pub.save(obj)``; returns
    the :class:`PublishResult`.  Same arguments and errors as :func:`publish`."""
    with publish(run_dir, step, **kwargs) as pub:
        pub.save(obj)
    return pub.result  # type: ignore[return-value]


def read_latest(run_dir: str | os.PathLike) -> Optional[str]:
    """The unit name in ``run_dir/latest`` (stripped), or None when there is none."""
    try:
        return (Path(run_dir) / LATEST_NAME).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def update_latest(run_dir: str | os.PathLike, unit: str, step: int, *, symlink: Optional[str] = None,
                  clock: Optional[_Clock] = None) -> bool:
    """Point ``run_dir/latest`` at ``unit`` (of ``step``) atomically, only forwards.

    Writes the name (no newline, as DeepSpeed does) to a temp file, fsyncs, ``os.replace``
    onto ``latest``, fsyncs the folder; never removes then creates.  Leaves ``latest``
    alone when it names an existing unit of a later step.  ``symlink``: also point a
    symbolic link of that name at ``unit`` (``os.symlink`` to a temp name, then
    ``os.replace``).  Returns True when ``latest`` was moved.  Raises ``OSError``."""
    from .inventory import step_from_name

    run_dir = Path(run_dir)
    clock = clock or _Clock()
    cur = read_latest(run_dir)
    if cur is not None and cur != unit and os.path.lexists(run_dir / cur):
        cur_step = step_from_name(cur)
        if cur_step is not None and cur_step > step:
            log.info("%s: latest stays at %s (step %s > %s)", run_dir, cur, cur_step, step)
            return False
    _atomic_write(run_dir / LATEST_NAME, unit.encode(), clock)
    if symlink:
        tmp = run_dir / tmp_name(symlink)
        os.symlink(unit, tmp)
        try:
            os.replace(tmp, run_dir / symlink)
        except BaseException:
            _unlink_quiet(tmp)
            raise
    _fsync_dir(run_dir, clock)
    return True


# --------------------------------------------------------------------------- retention
@dataclass
class PruneDecision:
    """What :func:`prune` decided for one unit: ``action`` is ``keep``, ``delete`` or
    ``sweep`` (a leftover of a dead writer); ``reason`` says why in words."""

    unit: str
    step: Optional[int]
    action: str
    reason: str


@dataclass
class PrunePlan:
    """``rollback``: the newest verified unit (never deleted), or None; ``dry_run``: nothing
    was deleted."""

    run_dir: Path
    rollback: Optional[str]
    decisions: List[PruneDecision]
    dry_run: bool

    @property
    def deleted(self) -> List[str]:
        return [d.unit for d in self.decisions if d.action in ("delete", "sweep")]


def verify_unit(run_dir: str | os.PathLike, unit: Dict[str, Any]) -> Tuple[bool, str]:
    """(True, "") when ``unit`` (an inventory unit dict) is complete and every file matches
    its manifest entry or sidecar; else (False, why).  Reads every byte of the unit
    (chunked files on all cores).  A file without any recorded digest cannot be verified."""
    from . import hashing

    if unit.get("in_progress"):
        return False, f"in progress ({unit['in_progress']})"
    if unit.get("missing_files"):
        return False, f"missing files {sorted(unit['missing_files'])}"
    if not unit.get("files"):
        return False, "no files"
    for row in hashing.hash_unit(Path(run_dir), unit):
        errs = [f for f in json.loads(row["findings_json"]) if f["severity"] == "error"]
        if errs:
            return False, f"{errs[0]['kind']}: {errs[0]['message']}"
        if row["verified"] is not True:
            return False, f"{row['file']} has no SHA-256 sidecar or manifest entry to verify it against"
    return True, ""


def _metric_of(run_dir: Path, unit: Dict[str, Any], metric: str) -> Optional[float]:
    """``metrics[metric]`` from the unit's manifest, or None."""
    if not unit.get("manifest"):
        return None
    try:
        doc = fs.loads_json((run_dir / unit["manifest"]).read_text())
        v = (doc.get("metrics") or {}).get(metric)
        return float(v) if isinstance(v, (int, float)) else None
    except (OSError, ValueError, AttributeError):
        return None


def _stale_leftovers(run_dir: Path) -> List[Tuple[str, str]]:
    """(name, why) of temp leftovers in ``run_dir`` whose writer on this host is gone."""
    host = _host_tag()
    out = []
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return out
    for n in names:
        m = _TMP_RE.match(n)
        if not m or m.group(1) != host:
            continue
        pid = int(m.group(2))
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            out.append((n, f"leftover of process {pid} on this host, which is gone"))
        except PermissionError:
            continue  # a live process of another user
    return out


def _orphan_integrity_files(run_dir: Path) -> Dict[str, Tuple[str, Tuple[int, int]]]:
    """{name: (why, (st_ino, st_mtime_ns))} of sidecars and manifests this module wrote for
    a file unit that is not there and is not being written.

    A file publish writes ``X.sha256`` and ``X.manifest.json`` before it renames its temp
    file to ``X`` (see :func:`publish`), and :func:`_delete_unit` removes them after the
    unit; a kill in between leaves them behind.  Only files in exactly our format are
    candidates (a single ``sha256sum`` line naming ``X``; a ``ckptaudit.manifest/1`` whose
    ``unit`` is ``X``), only when neither ``X`` nor any temp file of ``X`` (from any host)
    exists, and only for names with a step.  The stat key lets the caller skip a file that
    a new publish of ``X`` replaced in the meantime."""
    from .hashing import parse_sidecar
    from .inventory import step_from_name

    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return {}
    in_flight = {m.group(4) for n in names if (m := _TMP_RE.match(n))}
    present = set(names)
    out: Dict[str, Tuple[str, Tuple[int, int]]] = {}
    for n in names:
        if n.endswith(SIDECAR_SUFFIX):
            target, what = n[: -len(SIDECAR_SUFFIX)], "SHA-256 sidecar"
        elif n.endswith(".manifest.json"):
            target, what = n[: -len(".manifest.json")], "manifest"
        else:
            continue
        if not target or target in present or target in in_flight or step_from_name(target) is None:
            continue
        p = run_dir / n
        try:
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode) or st.st_size > (1 << 20):
                continue
            text = p.read_text(errors="replace")
        except OSError:
            continue
        if what == "manifest":
            try:
                doc = fs.loads_json(text)
            except ValueError:
                continue
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("unit") != target:
                continue
        else:
            entries, err = parse_sidecar(text)
            if err or list(entries) != [target]:
                continue
        out[n] = (f"{what} of {target}, which does not exist and is not being written (a save or delete "
                  "that was killed between the two)", (st.st_ino, st.st_mtime_ns))
    return out


def _delete_unit(run_dir: Path, unit: Dict[str, Any], clock: _Clock) -> None:
    """Delete a unit without ever leaving a torn one: rename it to a temp name (in progress
    for the audit), fsync the folder, then remove it and, for a file unit, its sidecars and
    manifest."""
    src = run_dir / unit["unit"]
    parent = src.parent
    tmp = parent / tmp_name(src.name)
    _rename(src, tmp)
    _fsync_dir(parent, clock)
    if unit["kind"] == "file":
        for extra in list(unit.get("sidecars", [])) + ([unit["manifest"]] if unit.get("manifest") else []):
            _unlink_quiet(run_dir / extra)
    _remove_tree_quiet(tmp)
    _fsync_dir(parent, clock)


def prune(run_dir: str | os.PathLike, *, keep_last: Optional[int] = None, keep_every: Optional[int] = None,
          keep_best: Optional[int] = None, metric: Optional[str] = None, mode: str = "min",
          sweep_stale: bool = False, dry_run: bool = False, echo: Optional[Callable[[str], None]] = print,
          _verified: Optional[set] = None) -> PrunePlan:
    """Delete old checkpoint units of ``run_dir`` by retention rules; return the plan.

    Kept: the ``keep_last`` newest complete units (by step), every unit whose step is a
    multiple of ``keep_every``, the ``keep_best`` units with the best ``metrics[metric]``
    in their manifest (``mode`` ``"min"`` or ``"max"``), the rollback point (the newest
    unit that verifies) and the unit ``latest`` names.  Deleted: only units that are
    complete, verified (:func:`verify_unit`) and of an older step than the rollback point;
    anything that does not verify, is in progress or has no step is kept and the plan
    says why.  ``sweep_stale``: also remove ``.ckptaudit-tmp-*`` leftovers whose writer
    process on this host is gone, and sidecars/manifests of file units that no longer
    exist and are not being written (:func:`_orphan_integrity_files`).  ``dry_run``: delete nothing, and ``echo`` each line
    of what would be deleted (``echo=None`` prints nothing).

    Raises ``ValueError`` without any keep rule or with a bad value, and
    ``FileNotFoundError`` for a missing ``run_dir``.
    """
    from .inventory import discover

    if keep_last is None and keep_every is None and keep_best is None:
        raise ValueError("prune needs at least one of keep_last, keep_every, keep_best")
    for k, v in (("keep_last", keep_last), ("keep_every", keep_every), ("keep_best", keep_best)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{k} must be an int >= 1, got {v!r}")
    if keep_best is not None and not metric:
        raise ValueError("keep_best needs metric= (a key of the metrics given to publish)")
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
    root = Path(run_dir)
    units, pointers, _ = discover(root)
    clock = _Clock()
    trusted = set(_verified or ())
    by_name = {u.unit: u.to_dict() for u in units}
    stepped = sorted((u for u in by_name.values() if u["step_from_name"] is not None and u["unit"] != "."),
                     key=lambda u: (u["step_from_name"], u["mtime_ns"]), reverse=True)
    decisions: List[PruneDecision] = []
    stale = dict(_stale_leftovers(root)) if sweep_stale else {}
    orphans = _orphan_integrity_files(root) if sweep_stale else {}
    keep: Dict[str, str] = {}
    verified: Dict[str, Tuple[bool, str]] = {}

    def check(u) -> Tuple[bool, str]:
        if u["unit"] not in verified:
            verified[u["unit"]] = (True, "") if u["unit"] in trusted and not u["in_progress"] else \
                verify_unit(root, u)
        return verified[u["unit"]]

    rollback = None
    for u in stepped:
        if u["in_progress"]:
            continue
        if check(u)[0]:
            rollback = u
            break
    complete = [u for u in stepped if not u["in_progress"] and not u.get("missing_files")]
    if rollback is not None:
        keep[rollback["unit"]] = "rollback point (newest verified unit)"
    for p in pointers:
        if p.resolved in by_name:
            keep.setdefault(p.resolved, f"named by {p.path}")
    if keep_last:
        for u in complete[:keep_last]:
            keep.setdefault(u["unit"], f"one of the {keep_last} newest (keep_last)")
    if keep_every:
        for u in complete:
            if u["step_from_name"] % keep_every == 0:
                keep.setdefault(u["unit"], f"step is a multiple of {keep_every} (keep_every)")
    if keep_best and metric:
        scored = [(v, u) for u in complete if (v := _metric_of(root, u, metric)) is not None]
        scored.sort(key=lambda t: t[0], reverse=(mode == "max"))
        for v, u in scored[:keep_best]:
            keep.setdefault(u["unit"], f"{metric}={v:g} is among the {keep_best} best (keep_best)")
    for u in stepped:
        name, step = u["unit"], u["step_from_name"]
        if name in stale:
            continue
        if name in keep:
            decisions.append(PruneDecision(name, step, "keep", keep[name]))
        elif u["in_progress"]:
            decisions.append(PruneDecision(name, step, "keep",
                                           f"in progress ({u['in_progress']}); not a unit to prune"))
        elif rollback is None:
            decisions.append(PruneDecision(name, step, "keep", "no unit verifies, so there is no rollback point to "
                                                               "protect; nothing is deleted"))
        elif step >= rollback["step_from_name"]:
            decisions.append(PruneDecision(name, step, "keep", f"not older than the rollback point {rollback['unit']}"))
        else:
            ok, why = check(u)
            if ok:
                decisions.append(PruneDecision(name, step, "delete", f"verified, older than the rollback point "
                                                                     f"{rollback['unit']}, kept by no rule"))
            else:
                decisions.append(PruneDecision(name, step, "keep", f"does not verify ({why}); left for the audit"))
    for u in by_name.values():
        if (u["step_from_name"] is None or u["unit"] == ".") and u["unit"] not in stale:
            decisions.append(PruneDecision(u["unit"], None, "keep", "no step in its name"))
    for n, why in stale.items():
        decisions.append(PruneDecision(n, None, "sweep", why))
    for n, (why, _) in orphans.items():
        decisions.append(PruneDecision(n, None, "sweep", why))
    plan = PrunePlan(root, rollback["unit"] if rollback else None, decisions, dry_run)
    for d in decisions:
        if d.action == "keep":
            continue
        if dry_run:
            if echo is not None:
                echo(f"would delete {d.unit}" + (f" (step {d.step})" if d.step is not None else "") + f": {d.reason}")
            continue
        if d.action == "delete":
            _delete_unit(root, by_name[d.unit], clock)
        elif d.unit in orphans:
            try:  # a publish of the same unit may have replaced it since the listing: leave that one
                st = os.lstat(root / d.unit)
                if (st.st_ino, st.st_mtime_ns) != orphans[d.unit][1]:
                    continue
            except OSError:
                continue
            _unlink_quiet(root / d.unit)
        else:
            _remove_tree_quiet(root / d.unit)
        log.info("%s: deleted %s (%s)", root, d.unit, d.reason)
    return plan


# --------------------------------------------------------------------------- seal
@dataclass
class SealOutcome:
    """What :func:`seal` did with one unit: ``action`` is ``sealed``, ``already sealed`` or
    ``refused``; ``written`` lists the paths it created (relative to the run folder)."""

    unit: str
    action: str
    reason: str
    written: List[str] = field(default_factory=list)


def seal(run_dir: str | os.PathLike, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, cfg: Optional[dict] = None,
         dry_run: bool = False) -> List[SealOutcome]:
    """Write sidecars and manifests for existing checkpoints of ``run_dir`` that pass the audit.

    Runs the whole audit in this process (:func:`ckptaudit.pipeline.audit_in_process`,
    ``cfg`` as its config).  A unit with any error finding is refused with the findings as
    the reason; a unit whose bytes changed since the audit hashed them is refused.  For the
    others: a ``<file>.sha256`` for every file that has none (existing sidecars are never
    rewritten), then the manifest: ``<file>.manifest.json`` for a file unit; for a folder
    unit ``COMPLETE`` first and ``manifest.json`` last, so a crash mid-seal never makes a
    good folder look in progress.  Index units get sidecars only (the inventory reads no
    manifest for them).  Data files are never opened for writing.  Raises
    ``FileNotFoundError``/``NotADirectoryError`` for a bad ``run_dir``.
    """
    from . import tables
    from .pipeline import audit_in_process

    root = Path(run_dir)
    out: List[SealOutcome] = []
    clock = _Clock()
    with tempfile.TemporaryDirectory(prefix="ckptaudit-seal-") as td:
        verdict = audit_in_process(root, cfg, out_dir=td)
        inv = json.loads((Path(td) / "work" / "inventory.json").read_text())
        audited: Dict[str, str] = {}
        for p in sorted((Path(td) / "tables" / "parts" / "hash").glob("*.parquet")):
            for r in tables.read_rows(p):
                audited[r["file"]] = r["sha256_hex"]
    units = {u["unit"]: u for u in inv["units"]}
    for vu in verdict["units"]:
        u = units.get(vu["unit"])
        if u is None:
            continue
        errs = [f for f in vu["findings"] if f["severity"] == "error"]
        if errs:
            why = "; ".join(f"{f['kind']}: {f['message']}" for f in errs[:3])
            more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
            out.append(SealOutcome(u["unit"], "refused", f"{len(errs)} error finding(s): {why}{more}"))
            continue
        folder = u["kind"] == "folder"
        base = root / u["unit"] if folder else (root / u["unit"]).parent
        if u["kind"] == "file" and u.get("manifest") or folder and u.get("manifest") and \
                (base / COMPLETE_MARKER).exists():
            out.append(SealOutcome(u["unit"], "already sealed", f"has {u['manifest']}"))
            continue
        try:
            recs = []
            for rel in u["files"]:
                r = hash_file(root / rel, Path(rel).relative_to(base.relative_to(root)).as_posix()
                              if base != root else rel, chunk_bytes)
                if audited.get(rel) and audited[rel] != r.sha256_hex:
                    raise ValueError(f"{rel} changed since the audit hashed it ({audited[rel][:12]}… → "
                                     f"{r.sha256_hex[:12]}…)")
                recs.append((rel, r))
        except (OSError, ValueError) as e:
            out.append(SealOutcome(u["unit"], "refused", f"{type(e).__name__}: {e}"))
            continue
        written: List[str] = []
        if dry_run:
            out.append(SealOutcome(u["unit"], "sealed", "dry run: would write sidecars and a manifest"))
            continue
        have = set(u.get("sidecars", []))
        for rel, r in recs:
            sc = rel + SIDECAR_SUFFIX
            if sc in have or rel + ".sha256sum" in have or (root / sc).exists():
                continue
            _atomic_write(root / sc, sidecar_text(r.sha256_hex, Path(rel).name).encode(), clock)
            written.append(sc)
        doc = {"schema": SCHEMA, "unit": u["unit"], "step": vu.get("step"), "files": [asdict(r) for _, r in recs],
               "versions": {"ckptaudit": __version__}, "world_size": None, "config": None, "metrics": None,
               "created_unix": max((os.stat(root / rel).st_mtime for rel, _ in recs), default=None),
               "sealed_unix": time.time(), "sealed_by": "ckptaudit seal"}
        for d in {(root / rel).parent for rel, _ in recs} | {root}:
            _fsync_dir(d, clock)
        if u["kind"] == "file":
            mp = root / (u["unit"] + ".manifest.json")
            _atomic_write(mp, manifest_bytes(doc), clock)
            written.append(mp.relative_to(root).as_posix())
        elif folder:
            mb = manifest_bytes(doc)
            _atomic_write(base / COMPLETE_MARKER, sidecar_text(hashlib.sha256(mb).hexdigest(),
                                                               MANIFEST_NAME).encode(), clock)
            _atomic_write(base / MANIFEST_NAME, mb, clock)
            written += [f"{u['unit']}/{COMPLETE_MARKER}", f"{u['unit']}/{MANIFEST_NAME}"]
            _fsync_dir(base, clock)
        _fsync_dir(base if folder else (root / u["unit"]).parent, clock)
        out.append(SealOutcome(u["unit"], "sealed", "passes the audit" + (" (index unit: sidecars only)"
                                                                          if u["kind"] == "index" else ""), written))
    return out


# --------------------------------------------------------------------------- preemption
_EXIT_CODE = _Publish.__exit__.__code__


class PreemptionGuard:
    """Turn preemption signals into a flag the training loop checks, with no torn unit.

    ``with PreemptionGuard() as guard:`` installs handlers for ``signals`` (SIGTERM: what
    Kubernetes and Slurm send first, SIGKILL following after the grace period,
    ``terminationGracePeriodSeconds`` 30 s by default and Slurm ``KillWait`` 30 s; SIGUSR1:
    what ``sbatch --signal=USR1@90`` sends ahead of the time limit).  A signal sets
    ``guard.requested`` (the signal number) and nothing else, so a save in flight finishes
    (``mode="finish"``).  With ``mode="abandon"`` a signal that arrives while a publish in
    this process is still inside the body of its ``with publish(…)`` block raises
    :class:`Preempted` there; the publish removes its temporary files and the exception
    propagates.  A signal that arrives once the body has ended (fsync, hashing, commit:
    finishing is quicker than undoing and leaves a usable unit) is only recorded.  The
    loop then saves or stops::

        with PreemptionGuard() as guard:
            for it in range(start, max_iters):
                train_step()
                if it % save_every == 0 or guard.requested:
                    save(state(), out_dir, it)
                if guard.requested:
                    break

    Handlers are installed on enter and the previous ones restored on exit.  Raises
    ``ValueError`` outside the main thread (Python runs signal handlers only there) or
    for a bad ``mode``.
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGUSR1), mode: str = "finish"):
        if mode not in ("finish", "abandon"):
            raise ValueError(f"mode must be 'finish' or 'abandon', got {mode!r}")
        self.signals, self.mode = tuple(signals), mode
        self.requested: Optional[int] = None
        self.requested_at: Optional[float] = None
        self._previous: Dict[int, Any] = {}

    @property
    def should_stop(self) -> bool:
        return self.requested is not None

    def _handler(self, signum, frame) -> None:
        if self.requested is None:
            self.requested, self.requested_at = signum, time.time()
        # Abandon only while the block body of a publish runs.  Once _Publish.__exit__ has
        # started, the save is finished instead: its cleanup and commit must not be cut short
        # (a Preempted there would leave the temporary file behind).  The frame test covers
        # the signal that is handled on entry to __exit__, before its first statement ran.
        abandon = (self.mode == "abandon" and bool(_PHASES) and _PHASES[-1] == "writing"
                   and (frame is None or frame.f_code is not _EXIT_CODE))
        log.warning("received %s: %s", signal.Signals(signum).name,
                    "abandoning the save in flight" if abandon else "will stop after the current step/save")
        if abandon:
            raise Preempted(signum)

    def __enter__(self) -> "PreemptionGuard":
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()
        return False


# --------------------------------------------------------------------------- command line
@click.command("seal")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--chunk-mib", default=DEFAULT_CHUNK_BYTES >> 20, show_default=True, type=click.IntRange(1),
              help="MiB per chunk digest in the manifests.")
@click.option("--dry-run", is_flag=True, help="Say what would be sealed; write nothing.")
def seal_command(run_dir, chunk_mib, dry_run):
    """Write SHA-256 sidecars and manifests for the checkpoints of RUN_DIR that pass the audit.

    Never touches data files.  Exit 0 when every unit is sealed (or already was), 1 when
    some unit was refused (the reason is printed), 3 when the audit itself failed."""
    try:
        outcomes = seal(run_dir, chunk_bytes=chunk_mib << 20, dry_run=dry_run)
    except Exception as e:  # noqa: BLE001 - an infrastructure failure is exit 3 with its cause
        click.echo(f"ckptaudit seal: error: {type(e).__name__}: {e}", err=True)
        sys.exit(3)
    for o in outcomes:
        click.echo(f"{o.action:<15} {o.unit}: {o.reason}")
        for w in o.written:
            click.echo(f"{'':<15}   wrote {w}")
    sys.exit(1 if any(o.action == "refused" for o in outcomes) else 0)


@click.command("prune")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--keep-last", type=click.IntRange(1), help="Keep the N newest complete units.")
@click.option("--keep-every", type=click.IntRange(1), help="Keep units whose step is a multiple of K.")
@click.option("--keep-best", type=click.IntRange(1), help="Keep the N units with the best --metric.")
@click.option("--metric", help="Manifest metrics key for --keep-best.")
@click.option("--mode", type=click.Choice(["min", "max"]), default="min", show_default=True)
@click.option("--sweep-stale", is_flag=True, help="Also remove temp leftovers of dead writers on this host, and "
              "sidecars/manifests left without their file unit by a killed save or delete.")
@click.option("--dry-run", is_flag=True, help="Print what would be deleted; delete nothing.")
def prune_command(run_dir, keep_last, keep_every, keep_best, metric, mode, sweep_stale, dry_run):
    """Delete old verified checkpoints of RUN_DIR; never the newest verified one.

    Exit 0 on success, 3 on bad arguments or an unreadable folder."""
    try:
        plan = prune(run_dir, keep_last=keep_last, keep_every=keep_every, keep_best=keep_best, metric=metric,
                     mode=mode, sweep_stale=sweep_stale, dry_run=dry_run, echo=None)
    except (ValueError, OSError) as e:
        click.echo(f"ckptaudit prune: error: {e}", err=True)
        sys.exit(3)
    click.echo(f"rollback point: {plan.rollback or 'none (no unit verifies)'}")
    for d in sorted(plan.decisions, key=lambda d: d.action != "keep"):  # keeps first, then deletions
        step = f" (step {d.step})" if d.step is not None else ""
        if d.action == "keep":
            click.echo(f"keep    {d.unit}{step}: {d.reason}")
        else:
            click.echo(f"{'would delete' if dry_run else 'deleted'} {d.unit}{step}: {d.reason}")
    sys.exit(0)


__all__ = ["publish", "save", "Publication", "PublishResult", "PublishError", "FileRecord", "HashingWriter",
           "Retention", "prune", "PrunePlan", "PruneDecision", "verify_unit", "seal", "SealOutcome",
           "PreemptionGuard", "Preempted", "update_latest", "read_latest", "hash_file", "tmp_name",
           "seal_command", "prune_command", "SCHEMA", "MANIFEST_NAME", "COMPLETE_MARKER", "LATEST_NAME",
           "DEFAULT_CHUNK_BYTES"]
