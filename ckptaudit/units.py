"""The unit model: a checkpoint unit, a pointer, and what a unit's name says (its step, a save in progress).

A *unit* is what a training job would resume from (one file, a folder, or an index
with its shards); :mod:`ckptaudit.discovery` finds them and the layout adapters
(:mod:`ckptaudit.layouts`) claim them.  Kept apart from both so that neither
imports the other for these types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional

from . import producers
from ._io import dead_writer

# Names that are in-progress leftovers of a save, never a rollback point.
# Sources: HF Trainer writes tmp-checkpoint-N then renames (transformers PR 28364);
# Orbax uses *.orbax-checkpoint-tmp-*; many writers use *.tmp / *.partial.
IN_PROGRESS_PATTERNS = [
    (re.compile(r"^tmp-checkpoint-\d+$"), "HF Trainer temp folder (renamed to checkpoint-N when complete)"),
    (re.compile(r"\.tmp(\.\w+)?$|\.tmp\d*$"), "temporary name (*.tmp)"),
    (re.compile(r"\.partial$"), "partial download/copy (*.partial)"),
    # a folder's own name ending in -unfinished: no producer found that names one so (NeMo's "-unfinished" is an
    # empty marker FILE beside the checkpoint: ckptaudit.producers.nemo, applied by the inventory); kept so such a
    # folder is never a rollback point
    (re.compile(r"-unfinished$"), "folder marked unfinished"),
    # a producer's own names of a save under way come first (ckptaudit.producers.in_progress_name: NVRx's
    # iter_<N>_<rank>_local.dirty.pt, with its source); a bare ".dirty" had no source and is no longer one
    (re.compile(r"\.orbax-checkpoint-tmp"), "Orbax temporary folder"),
    (re.compile(r"^\.ckptaudit-tmp-"), "ckptaudit.publish temporary file or folder"),
]

#: Names beside a checkpoint that describe it, never units: ``sha256sum`` sidecars and manifests.
SIDECAR_SUFFIXES = (".sha256", ".sha256sum")
MANIFEST_NAMES = ("manifest.json", "ckptaudit.manifest.json")

_STEP_PATTERNS = [
    re.compile(r"(?:^|[^a-z])step[=_-]?(\d+)", re.I),
    re.compile(r"global_step(\d+)", re.I),
    re.compile(r"iter[_-]?(\d+)", re.I),
    re.compile(r"checkpoint-(\d+)", re.I),
    re.compile(r"(?:ckpt|model|checkpoint|state)[_-](\d+)", re.I),
]
_SHARD_NAME = re.compile(r"-\d{5}-of-\d{5}")


def step_from_name(name: str) -> Optional[int]:
    """Step parsed from a unit name (``ckpt_000500.pt`` → 500), or None.

    Shard counters (``model-00001-of-00002``) and epochs are not steps.
    """
    base = _SHARD_NAME.sub("", name)
    own = producers.name_step(base)  # a producer's own naming (Composer's ep3-ba30-rank0.pt: batch 30)
    if own is not None:
        return own
    for pat in _STEP_PATTERNS:
        m = pat.search(base)
        if m:
            return int(m.group(1))
    m = re.fullmatch(r"[^\d]*?(\d+)(?:\.\w+)?", base)
    if m and not re.search(r"epoch", base, re.I):
        return int(m.group(1))
    return None


def names_a_save(name: str) -> bool:
    """Whether ``name`` says it is a save by a step pattern (``checkpoint-500``, ``global_step300``,
    ``step-6``, ``iter_0000300``, ``ckpt_10``), not only by holding digits (``run_0001``)."""
    base = _SHARD_NAME.sub("", name)
    return producers.name_step(base) is not None or any(pat.search(base) for pat in _STEP_PATTERNS)


#: the in-progress reason of a ckptaudit.publish temp whose writer is gone (the summary collapses these)
DEAD_WRITER_WORDS = "leftover of a ckptaudit.publish save whose process is gone"


def in_progress_reason(name: str) -> Optional[str]:
    pid = dead_writer(name)
    if pid is not None:
        return (f"{DEAD_WRITER_WORDS} (pid {pid} on this host); the next publish into this folder, or "
                "`ckptaudit prune RUN --sweep-stale`, removes it")
    own = producers.in_progress_name(name)
    if own is not None:
        return own
    for pat, why in IN_PROGRESS_PATTERNS:
        if pat.search(name):
            return why
    return None


@dataclass
class Unit:
    """One checkpoint unit.  ``files`` are paths relative to the run folder."""

    unit: str  # path relative to run_dir ("ckpt_000500.pt", "global_step6", ".")
    layout: str
    kind: str  # "file" | "folder" | "index"
    files: List[str]
    size_bytes: int
    mtime_ns: int
    step_from_name: Optional[int]
    in_progress: str = ""  # reason, when the name marks a save in progress
    sidecars: List[str] = field(default_factory=list)
    manifest: str = ""
    missing_files: List[str] = field(default_factory=list)  # files the layout expects but cannot find
    part: str = ""
    snapshot: Dict[str, list] = field(default_factory=dict)  # file -> [size, mtime_ns, inode or ETag] at inventory
    irregular: Dict[str, str] = field(default_factory=dict)  # file -> why it is never opened (FIFO, device, …)

    def to_dict(self) -> Dict:
        """The unit as plain data: its lists and dicts copied one level deep (``dataclasses.asdict`` deep-copies
        every file name and snapshot value, ~0.3 ms per unit of 1,000 files)."""
        return {f.name: _copied(getattr(self, f.name)) for f in fields(self)}


def _copied(v):
    return list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v


@dataclass
class Pointer:
    """A file or symlink that names a unit (``latest``, tracker, ``last.ckpt``)."""

    path: str
    kind: str  # which pointer convention
    target: str  # what it names, as written
    resolved: str  # unit it resolves to, relative to run_dir ("" when none)
    exists: bool
    is_symlink: bool
