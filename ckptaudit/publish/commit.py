"""The commit of a publish: verify, write sidecars and the manifest, rename into place, mark complete.

A mixin of :class:`~.unit._Publish` (its ``__exit__`` calls :meth:`Commit._exit_file` or
:meth:`Commit._exit_folder`), then ``latest`` and retention (:meth:`Commit._after_commit`).
Order of operations, and why each fsync: ``docs/publish-protocol.md``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..formats import integrity_json
from .files import durable_write, fsync_dir, remove_tree_quiet, rename_nfs_safe, unlink_quiet
from .latest import update_latest
from .manifest import FileRecord, fsync_and_hash, manifest_bytes, sidecar_text
from .names import COMPLETE_MARKER, MANIFEST_NAME, SIDECAR_SUFFIX, TMP_PREFIX, RESERVED, Preempted, PublishError
from .retention import prune

log = logging.getLogger("ckptaudit.publish")


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


def _gathered(gathered: List[Dict[str, Any]]) -> tuple:
    """``(causes, records, {path: rank})`` from every rank's report: each rank's error, and a file two ranks
    both wrote, as causes of a failed publish."""
    causes = {f"rank {g['rank']}": g["error"] for g in gathered if g["error"]}
    recs = [FileRecord(**f) for g in gathered for f in g["files"]]
    seen: Dict[str, int] = {}
    for r in recs:
        if r.path in seen:
            causes[f"rank {r.rank}"] = f"{r.path} was also written by rank {seen[r.path]}"
        seen[r.path] = r.rank
    return causes, recs, seen


class Commit:
    """The commit steps of :class:`~.unit._Publish` (attributes set there: ``name``,
    ``final``, ``run_dir``, ``tmp_path``, ``writers``, ``comm``, ``clock``, ``pub``, ``phases`` …)."""

    def _exit_file(self, exc) -> None:
        if exc is not None or not self.writers:
            self._abort_local()
            unlink_quiet(self.tmp_path)
            if exc is None:
                raise PublishError(self.name, {"rank 0": "nothing was written: call pub.save(obj) or pub.open()"})
            return
        sidecar = self.final.with_name(self.name + SIDECAR_SUFFIX)
        manifest = self.final.with_name(self.name + ".manifest.json")
        committed = False
        try:
            recs = self._close_local()
            self.phases[-1] = "commit"
            problems = self._verify(self.tmp_path, recs)
            if problems:
                raise PublishError(self.name, {f"verify {i}": p for i, p in enumerate(problems)})
            if os.path.lexists(self.final) and not self.replace:
                raise FileExistsError(f"{self.final}: appeared while publishing; not replacing it")
            if self.replace and os.path.lexists(self.final):  # never the new bytes beside the old digest
                unlink_quiet(sidecar)
                unlink_quiet(manifest)
                fsync_dir(self.run_dir, self.clock)
                rename_nfs_safe(self.tmp_path, self.final)
                committed = True
                fsync_dir(self.run_dir, self.clock)
            durable_write(sidecar, sidecar_text(recs[0].sha256_hex, self.name).encode(), self.clock)
            durable_write(manifest, manifest_bytes(self._manifest(recs)), self.clock)
            if not committed:
                rename_nfs_safe(self.tmp_path, self.final)
                committed = True
        except BaseException as e:
            self._abort_local()
            if not committed:
                unlink_quiet(self.tmp_path)
                if not os.path.lexists(self.final):
                    unlink_quiet(sidecar)
                    unlink_quiet(manifest)
            if isinstance(e, (PublishError, KeyboardInterrupt, Preempted)):
                raise
            raise PublishError(self.name, {"rank 0 (commit)": f"{type(e).__name__}: {e}"}) from e
        fsync_dir(self.run_dir, self.clock)  # after the commit: an OSError here is raised as is
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
                    durable_write(p.with_name(p.name + SIDECAR_SUFFIX),
                                  sidecar_text(r.sha256_hex, p.name).encode(), self.clock)
                local["files"] = [asdict(r) for r in recs]
            except BaseException as e:  # noqa: BLE001 - reported to rank 0, re-raised below
                self._abort_local()
                local["error"] = f"{type(e).__name__}: {e}"
                local_exc = e
        self.phases[-1] = "commit"
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
        causes, recs, seen = _gathered(gathered)
        committed = False
        try:
            if causes:
                raise PublishError(self.name, causes)
            mbytes = self._seal_tmp(recs, seen)
            if os.path.lexists(self.final):
                raise FileExistsError(f"{self.final}: appeared while publishing; not replacing it")
            rename_nfs_safe(self.tmp_path, self.final)
            committed = True
            fsync_dir(self.run_dir, self.clock)
            durable_write(self.final / COMPLETE_MARKER,
                          sidecar_text(hashlib.sha256(mbytes).hexdigest(), MANIFEST_NAME).encode(), self.clock)
            fsync_dir(self.final, self.clock)
        except BaseException as e:  # noqa: BLE001 - every rank learns the cause from the broadcast
            if not committed:
                remove_tree_quiet(self.tmp_path)
            if isinstance(e, (KeyboardInterrupt, Preempted)):
                raise
            return {"error": e.causes if isinstance(e, PublishError) else
                    {"rank 0 (commit)": f"{type(e).__name__}: {e}"}, "result": None}
        res = self._after_commit(recs)
        d = asdict(res)
        d["path"] = str(res.path)
        return {"error": {}, "result": d}

    def _seal_tmp(self, recs: List[FileRecord], seen: Dict[str, int]) -> bytes:
        """Before the rename: verify what the ranks wrote (``recs``), hash and sidecar the files no rank
        registered (``seen``: path -> rank), write Megatron-Core's ``integrity.json`` into a ``torch_dist``
        iteration folder (:func:`ckptaudit.formats.integrity_json.iteration_folder`: the unit's name or the run's
        tracker; from the records' digests, every top-level file but itself listed, the sidecars written so far
        included), write the manifest and fsync every folder of the temp unit.
        Returns the manifest's bytes; raises :class:`PublishError` when nothing was written or a file does
        not verify."""
        if not recs and not any(self._unregistered(seen)):
            raise PublishError(self.name, {"rank 0": "nothing was written into the unit"})
        problems = self._verify(self.tmp_path, recs)
        if problems:
            raise PublishError(self.name, {f"verify {i}": p for i, p in enumerate(problems)})
        for rel in self._unregistered(seen):  # e.g. torch.distributed.checkpoint's .metadata
            recs.append(self._hash_and_sidecar(rel))
        if integrity_json.iteration_folder(self.tmp_path, self.name, self.run_dir):  # Megatron-Core's manifest
            top = {r.path: r.sha256_hex for r in recs if "/" not in r.path}
            try:
                if integrity_json.write_folder(self.tmp_path, known=top, clock=self.clock) == "written":
                    recs.append(self._hash_and_sidecar(integrity_json.NAME))
            except integrity_json.IntegrityConflict as e:
                raise PublishError(self.name, {"rank 0 (integrity.json)": str(e)}) from e
        manifest = self._manifest(recs)
        mbytes = manifest_bytes(manifest)
        durable_write(self.tmp_path / MANIFEST_NAME, mbytes, self.clock)
        for d in sorted({(self.tmp_path / r.path).parent for r in recs}, key=lambda x: -len(x.parts)):
            fsync_dir(d, self.clock)
        fsync_dir(self.tmp_path, self.clock)
        return mbytes

    def _hash_and_sidecar(self, rel: str) -> FileRecord:
        """The record of a file of the temp unit no rank registered, fsynced and hashed, its sidecar written."""
        p = self.tmp_path / rel
        r = fsync_and_hash(p, rel, self.chunk_bytes, -1, self.clock)
        durable_write(p.with_name(p.name + SIDECAR_SUFFIX), sidecar_text(r.sha256_hex, p.name).encode(), self.clock)
        return r

    def _unregistered(self, registered: Dict[str, int]) -> List[str]:
        out = []
        for dirpath, dirnames, filenames in os.walk(self.tmp_path):
            dirnames.sort()
            for fn in sorted(filenames):
                rel = (Path(dirpath) / fn).relative_to(self.tmp_path).as_posix()
                if rel in registered or fn.endswith(SIDECAR_SUFFIX) or fn.startswith(TMP_PREFIX) or \
                        rel in RESERVED:
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
