"""Writer side: publish checkpoints that are fully visible or not at all.

    from ckptaudit.publish import save, publish, Retention
    save(ckpt, "out/", step=iter_num, metrics={"val_loss": loss}, retention=Retention(keep_last=3))
    with publish("out/", step, folder=True) as pub:         # one folder unit, from every rank
        pub.save(model_shard, f"model_rank{rank:05d}.pt")

A unit is written under a ``.ckptaudit-tmp-…`` name (in progress for the audit), hashed while
written, fsynced, given sidecars and a ``ckptaudit.manifest/2`` manifest, then renamed into place
(a folder then gets its ``COMPLETE`` marker).  ``latest`` only moves forwards; :func:`prune`
deletes only verified units older than the rollback point; :func:`seal` adds sidecars to an
existing run; :class:`PreemptionGuard` turns SIGTERM into a flag.  ``save(..., background=True)``
stages the state to CPU memory and commits on a thread (:mod:`.background`).  The protocol step by step,
what a crash at each step leaves and why each fsync: ``docs/publish-protocol.md``.  Imports
nothing heavy: torch on save, click only for the commands.
"""

from .background import PendingPublish, release_staging_memory, wait_background
from .commit import PublishResult
from .latest import read_latest, update_latest
from .manifest import FileRecord, hash_file
from .names import (COMPLETE_MARKER, DEFAULT_CHUNK_BYTES, LATEST_NAME, MANIFEST_NAME, SCHEMA, SIDECAR_SUFFIX, TMP_PREFIX,
                    Preempted, PublishError, tmp_name)
from .preemption import PreemptionGuard
from .retention import PruneDecision, PrunePlan, Retention, prune, verify_unit
from .seal import SealOutcome, seal, seal_folder
from .unit import Publication, publish, save
from .writer import HashingWriter

__all__ = ["publish", "save", "Publication", "PendingPublish", "wait_background", "release_staging_memory", "PublishResult", "PublishError", "FileRecord", "HashingWriter",
           "Retention", "prune", "PrunePlan", "PruneDecision", "verify_unit", "seal", "seal_folder", "SealOutcome",
           "PreemptionGuard", "Preempted", "update_latest", "read_latest", "hash_file", "tmp_name",
           "seal_command", "prune_command", "SCHEMA", "MANIFEST_NAME", "COMPLETE_MARKER", "LATEST_NAME",
           "DEFAULT_CHUNK_BYTES", "SIDECAR_SUFFIX", "TMP_PREFIX"]


def __getattr__(name):  # the click commands load click only when the CLI asks for them
    if name in ("seal_command", "prune_command"):
        from . import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
