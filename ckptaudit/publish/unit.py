"""One publish: ``with publish(run_dir, step) as pub`` and ``save(obj, run_dir, step)``.

The steps, in order (``docs/publish-protocol.md`` has the why of each): ``__enter__``
(rank 0 creates the temp unit and broadcasts its name) → the block writes through
:class:`Publication` → ``__exit__`` closes and fsyncs every writer, then commits
(:mod:`.commit`: verify, sidecars, manifest, rename, marker, ``latest``, retention).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ..formats.chunk_digest import WRITTEN, chunk_digests
from . import background as _background
from .clock import Clock
from .collectives import Comm
from .commit import PublishResult, Commit
from .files import remove_tree_quiet
from .manifest import ROLES, FileRecord, fsync_and_hash, jsonable, environment_versions, object_role
from .names import DEFAULT_CHUNK_BYTES, SCHEMA, TMP_PREFIX, Preempted, PublishError, check_name, tmp_name
from .phases import EXIT_CODES, PHASES
from .retention import Retention, sweep_dead_writers
from .writer import HashingWriter, cpu_storage_ranges


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

    def save(self, obj: Any, name: Optional[str] = None, *, role: Optional[str] = None,
             **torch_save_kwargs: Any) -> FileRecord:
        """``torch.save(obj, …)`` into ``name`` through a hashing writer; returns its record.

        The manifest records the file's ``role`` (what the audit weighs a damaged file by, and
        where it finds a folder unit's weights whatever the file is called): the one given
        (one of :data:`~.manifest.ROLES`), else read from ``obj``'s structure
        (:func:`~.manifest.object_role`: a state_dict is ``weights``, an optimizer state_dict
        ``optimizer``, a dict of several components ``mixed``).

        A failed write (disk full ``ENOSPC``, quota ``EDQUOT``, ``RLIMIT_FSIZE`` ``EFBIG``)
        and a :class:`Preempted` or ``KeyboardInterrupt`` raised mid-save are re-raised as
        themselves, not as the ``RuntimeError`` torch's zip writer raises over them when its
        ``__exit__`` tries to finish the archive (``unexpected pos … vs …``)."""
        import torch

        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
        with self.open(name) as w:
            w.role = role or object_role(obj)
            w.hold(cpu_storage_ranges(obj))  # obj's tensors stay as they are until this call returns
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


class _Publish(Commit):
    """One publish in flight: its arguments, its temp unit and writers, and the steps of
    ``with publish(...)``: enter (create the temp unit), the block's writes, exit (close,
    then the commit steps of :class:`~.commit.Commit`)."""

    def __init__(self, run_dir, step, *, name, folder, config, metrics, rank, world_size, group, chunk_bytes,
                 update_latest, latest_symlink, verify, retention, replace=False, sweep_stale=True,
                 supersede=True):
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
        if replace and folder:
            raise ValueError("replace=True publishes file units: a folder cannot be swapped in one rename")
        self.replace, self.sweep_stale, self.supersede = replace, sweep_stale, supersede
        self.run_dir = Path(run_dir)
        self.step, self.folder, self.rank, self.world_size = step, folder, rank, world_size
        self.name = name or (f"checkpoint-{step}" if folder else f"ckpt_{step:06d}.pt")
        if "/" in self.name or self.name in (".", "..") or self.name.startswith(TMP_PREFIX):
            raise ValueError(f"unit name {self.name!r} must be a plain name inside run_dir")
        self.final = self.run_dir / self.name
        self.config, self.metrics = config, metrics
        self.chunk_bytes, self.verify = chunk_bytes, (world_size > 1 if verify is None else verify)
        self.update_latest, self.latest_symlink, self.retention = update_latest, latest_symlink, retention
        self.comm = Comm(rank, world_size, group)
        self.clock = Clock()
        self.writers: List[HashingWriter] = []
        self.path_names: List[str] = []
        self.tmp_path = Path()
        self.pub = Publication(self)
        self.t_enter = 0.0
        # save(background=True) sets in_background and gives the commit a phase list of its
        # own: PreemptionGuard's handler reads PHASES to abandon the body of a publish on the
        # main thread, never a thread's commit
        self.in_background = False
        self.phases: List[str] = PHASES

    # ----------------------------------------------------------------- enter
    def __enter__(self) -> Publication:
        if not self.in_background:
            _background.wait_background()  # a second save waits for the first (and raises its error)
        self.t_enter = time.perf_counter()
        err = ""
        if self.rank == 0:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                if self.sweep_stale:
                    sweep_dead_writers(self.run_dir)
                if os.path.lexists(self.final) and not self.replace:
                    if not self.supersede:
                        raise FileExistsError(f"{self.final}: a unit with this name already exists; publish "
                                              "never replaces a unit (delete or prune it first)")
                    from .supersede import supersede

                    supersede(self.run_dir, self.name)  # the run resumed from an earlier step: keep it aside
                self.tmp_path = self.run_dir / tmp_name(self.name)
                if self.folder:
                    os.mkdir(self.tmp_path)
            except OSError as e:
                err = f"{type(e).__name__}: {e}"
        tmp, err = self.comm.broadcast((str(self.tmp_path), err))
        if err:
            raise PublishError(self.name, {"rank 0 (start)": err})
        self.tmp_path = Path(tmp)
        try:
            self.phases.append("writing")
            return self.pub
        except BaseException:  # a Preempted between the push and the block: __exit__ will not run
            if self.phases:
                self.phases.pop()
            if self.rank == 0 and self.folder:
                remove_tree_quiet(self.tmp_path)
            raise

    def open(self, name: Optional[str]) -> HashingWriter:
        if self.folder:
            if name is None:
                raise ValueError("a folder unit needs a file name: pub.save(obj, 'model.pt')")
            check_name(name, "file name")
            target = self.tmp_path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            rel = name
        else:
            if name not in (None, self.name):
                raise ValueError(f"a file unit holds one file, {self.name!r}; got {name!r} (use folder=True)")
            if self.writers:
                raise ValueError(f"{self.name}: a file unit is written once")
            target, rel = self.tmp_path, self.name
        w = HashingWriter(target, rel, self.chunk_bytes, self.clock, self.rank)
        self.writers.append(w)
        return w

    def path(self, name: str) -> Path:
        if not self.folder:
            raise ValueError("pub.path() is for folder units; a file unit is written with pub.save or pub.open")
        check_name(name, "file name")
        p = self.tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        self.path_names.append(name)
        return p

    # ----------------------------------------------------------------- exit
    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.phases:  # from here on a preemption signal is only recorded (PreemptionGuard._handler)
            self.phases[-1] = "closing"
        t_exit = time.perf_counter()
        self.clock.seconds["write_seconds"] = t_exit - self.t_enter
        try:
            if self.folder:
                self._exit_folder(exc)
            else:
                self._exit_file(exc)
        finally:
            if self.phases:
                self.phases.pop()
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
            recs.append(fsync_and_hash(self.tmp_path / name, name, self.chunk_bytes, self.rank, self.clock))
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
                    got = chunk_digests(p, r.chunk_bytes, WRITTEN)
                    bad = [i for i, (a, b) in enumerate(zip(got, r.chunk_blake3_hex)) if a != b]
                    if bad or len(got) != len(r.chunk_blake3_hex):
                        problems.append(f"rank {r.rank}'s file {r.path}: chunk(s) {bad} of {r.chunk_bytes} bytes "
                                        "differ from what was written")
        return problems

    def _manifest(self, recs: Sequence[FileRecord]) -> Dict[str, Any]:
        return {"schema": SCHEMA, "unit": self.name, "step": self.step,
                "files": [asdict(r) for r in sorted(recs, key=lambda r: r.path)],
                "versions": environment_versions(), "world_size": self.world_size,
                "config": jsonable(self.config) if self.config is not None else None,
                "metrics": jsonable(self.metrics) if self.metrics is not None else None,
                "created_unix": time.time()}


EXIT_CODES.append(_Publish.__exit__.__code__)  # for PreemptionGuard: a signal on entry to __exit__


def publish(run_dir: str | os.PathLike, step: int, *, name: Optional[str] = None, folder: Optional[bool] = None,
            config: Any = None, metrics: Optional[Dict[str, float]] = None, rank: Optional[int] = None,
            world_size: Optional[int] = None, group: Any = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
            update_latest: bool = True, latest_symlink: Optional[str] = None, verify: Optional[bool] = None,
            retention: Optional[Retention] = None, replace: bool = False, sweep_stale: bool = True,
            supersede: bool = True):
    """Context manager that publishes one checkpoint unit of ``step`` into ``run_dir``.

    ``with publish(run_dir, step) as pub: pub.save(obj)`` — the unit becomes visible, with
    sidecars and a ``ckptaudit.manifest/2`` manifest, only when the block ends without an
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
    not seen the other ranks' bytes, which may come over NFS), off in one process, where
    every digest was computed from the very bytes handed to ``os.write``.  ``update_latest``: move
    ``run_dir/latest`` to this unit (only forwards); ``latest_symlink``: also swap a symlink
    of that name.  ``retention``: :func:`prune` after the commit.  ``replace``: a file unit may replace one of
    the same name (a framework's ``last.ckpt``, saved again at every save): its sidecar and manifest are
    removed first, the new file renamed over it, its sidecar and manifest written after, so that a crash
    at any point leaves the old or the new bytes, never beside the other's digest.  ``sweep_stale``: first
    remove the temp files and folders in ``run_dir`` of earlier publishes on this host whose process is gone
    (a save killed mid-way; never another host's, never a live process's), so that kills do not pile them up.
    ``supersede``: a unit already of this name (not ``replace``) is moved with its digests into
    ``run_dir/.ckptaudit-superseded/`` first (:func:`ckptaudit.publish.supersede.supersede`: a run resumed from
    an earlier step meets its old units again); False: :class:`PublishError` instead.

    Raises ``ValueError`` for bad arguments, :class:`PublishError` when the unit exists (``supersede=False``)
    or could not be published (``causes`` per rank), and re-raises the block's exception.  An
    ``OSError`` after the commit (fsync of the run folder, moving ``latest``) is raised as
    is: the unit is then published, its durability or ``latest`` not assured.  After the
    block, ``pub.result`` is a :class:`PublishResult`.  Entering the block first waits for
    this process's background publish (:func:`save` with ``background=True``) and raises
    its error if it failed unreported.
    """
    return _Publish(run_dir, step, name=name, folder=folder, config=config, metrics=metrics, rank=rank,
                    world_size=world_size, group=group, chunk_bytes=chunk_bytes, update_latest=update_latest,
                    latest_symlink=latest_symlink, verify=verify, retention=retention, replace=replace,
                    sweep_stale=sweep_stale, supersede=supersede)


def save(obj: Any, run_dir: str | os.PathLike, step: int, *, background: bool = False,
         **kwargs: Any) -> Union[PublishResult, "_background.PendingPublish"]:
    """Publish ``obj`` (``torch.save``-able) as the file unit ``run_dir/ckpt_<step:06d>.pt``.

    Shortcut for ``with publish(run_dir, step, **kwargs) as pub: pub.save(obj)``; returns
    the :class:`PublishResult`.  Same arguments and errors as :func:`publish`.

    ``background=True``: wait for the previous background publish (raising its error if it
    failed unreported), copy ``obj``'s tensors into CPU memory
    (:func:`~.staging.stage`; memory: one copy of the state's tensor bytes, kept for the
    next save, freed by :func:`~.background.release_staging_memory`), and return a
    :class:`~.background.PendingPublish` while a thread runs the same publish on the copy;
    training may change ``obj`` as soon as this returns.  A crash or kill at any point of the
    background commit leaves what the blocking publish leaves at that point: no unit that
    the audit or the reader accepts unless it is complete.  ``pending.wait()`` returns the
    :class:`PublishResult` or raises the commit's error; the next ``save``/``publish``,
    :func:`~.background.wait_background` and leaving a :class:`PreemptionGuard` wait for the
    commit.  File units only (``folder=False``); ``ValueError`` otherwise, and for bad
    arguments, before anything is copied."""
    if not background:
        with publish(run_dir, step, **kwargs) as pub:
            pub.save(obj)
        return pub.result  # type: ignore[return-value]
    p = publish(run_dir, step, **kwargs)
    if p.folder:
        raise ValueError("background=True publishes file units (one process); a folder unit is written by "
                         "every rank inside `with publish(...)`")
    p.in_background, p.phases = True, []

    def commit(staged: Any) -> PublishResult:
        with p as pub:
            pub.save(staged)
        return pub.result  # type: ignore[return-value]

    return _background.start(p.name, obj, commit)
