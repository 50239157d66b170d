"""Producers as data: one module per framework holds what its save writes and what its resume reads.

Each module of this package (:mod:`.hf_trainer`, :mod:`.accelerate`, :mod:`.lightning`, :mod:`.deepspeed`,
:mod:`.torchtitan`, :mod:`.dcp`, :mod:`.megatron`, :mod:`.nanogpt`, :mod:`.torch_tutorial`, :mod:`.nemo`,
:mod:`.composer`, :mod:`.nvrx`, :mod:`.nemo_automodel`, :mod:`.training_hub`, :mod:`.timm`,
:mod:`.ultralytics`) defines one :class:`~.contract.Producer`: its :class:`~.contract.Contract` per version range (which files form a
unit, the role of each, how the resume loads it, where the step lives, what it always or never saves),
the base-name patterns of its files' roles, how its resume unpickles each role, its resume call and the
unit its default resume takes.  Its module docstring cites the framework source each fact was read from.

Two ways in, for two kinds of question:

* :func:`for_layout` — by a unit's inventory layout (structural: the file names the layout adapter
  recognised), for roles, resume loads and resume calls; the verdict is the same with the contracts off.
* :func:`identify` — by a unit's files and tree, the contract that names the producer and sharpens
  wording; structural recognition (:mod:`ckptaudit.recognise`) is the fallback for every producer without
  an entry and must reach the same verdict on its own.  ``CKPTAUDIT_PRODUCER_CONTRACTS=0`` switches the
  contracts off (the tests run every framework fixture both ways).
"""

from __future__ import annotations

import fnmatch
import os
import re
from types import MappingProxyType
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import (accelerate, composer, dcp, deepspeed, hf_trainer, lightning, megatron, nanogpt, nemo, nemo_automodel,
               nvrx, timm, torch_tutorial, torchtitan, training_hub, ultralytics)
from .contract import UNSAFE, WO, Contract, FileRole, PointerFile, Producer, ResumeLoad, UnfinishedMarker

__all__ = ["Contract", "FileRole", "PointerFile", "Producer", "ResumeLoad", "PRODUCERS", "CONTRACTS", "WO", "UNSAFE",
           "POINTER_FILES", "VERSION_KEYS", "VERSION_DISTS", "PIP_NAMES",
           "enabled", "identify", "pointer_file", "reader_layouts", "STEP_FILES", "NOT_STATE_FILES", "by_key",
           "LOSS_LOGS", "CLAIM_FILES", "role_of", "metadata_files", "for_layout", "for_unit", "with_entry",
           "UnfinishedMarker", "unfinished_marker", "in_progress_name", "incomplete_saves", "spoiled_saves",
           "zip_layout", "name_step", "resume_step"]

#: Every producer, in the order a unit's contract is looked for.
PRODUCERS: Tuple[Producer, ...] = (hf_trainer.PRODUCER, accelerate.PRODUCER, lightning.PRODUCER,
                                   deepspeed.PRODUCER, torchtitan.PRODUCER, dcp.PRODUCER, nanogpt.PRODUCER,
                                   torch_tutorial.PRODUCER, megatron.PRODUCER, megatron.CORE_PRODUCER, nemo.PRODUCER,
                                   composer.PRODUCER, nvrx.PRODUCER, nemo_automodel.PRODUCER, training_hub.PRODUCER,
                                   timm.PRODUCER, ultralytics.PRODUCER)
#: Every contract, in that order.
CONTRACTS: Tuple[Contract, ...] = tuple(c for p in PRODUCERS for c in p.contracts)
#: The producers' folder adapters (``"module:ATTR"`` in :mod:`ckptaudit.layouts`), in claim order.
FOLDER_ADAPTERS: Tuple[str, ...] = tuple(spec for _, spec in sorted(a for p in PRODUCERS for a in p.folder_adapters))
#: The producers' index-file adapters (``"module:ATTR"`` in :mod:`ckptaudit.layouts`).
INDEX_ADAPTERS: Tuple[str, ...] = tuple(s for p in PRODUCERS for s in p.index_adapters)
#: Pointer files the producers write beside their units, by base name.
POINTER_FILES: Mapping[str, PointerFile] = MappingProxyType({f.name: f for p in PRODUCERS for f in p.pointers})
#: Keys at a checkpoint's root that record a framework's version: key -> package.
VERSION_KEYS: Mapping[str, str] = MappingProxyType({k: v for p in PRODUCERS for k, v in p.version_keys.items()})
#: A version key's package name -> the distribution whose installed version compares with it.
VERSION_DISTS: Mapping[str, str] = MappingProxyType({k: v for p in PRODUCERS for k, v in p.version_dists.items()})
#: Modules the producers' pickles import -> the pip package that installs them.
PIP_NAMES: Mapping[str, str] = MappingProxyType({m: n for p in PRODUCERS for m, n in p.pip_names.items()})


def for_layout(layout: str) -> Optional[Producer]:
    """The producer whose units come as inventory ``layout`` (None for plain layouts: ``torch-zip``, …)."""
    return next((p for p in PRODUCERS if layout in p.layouts), None)


def by_key(key: str) -> Optional[Producer]:
    """The producer named ``key`` (``"hf-trainer"``, ``"deepspeed"``…), or None."""
    return next((p for p in PRODUCERS if p.key == key), None)


def for_unit(unit: dict) -> Optional[Producer]:
    """The producer whose resume reads ``unit`` (a verdict's unit row: ``unit``, ``layout``): the producer that
    claims it (a DCP folder named ``step-<N>`` is torchtitan's, a plain ``.ckpt`` file Lightning's), else by
    its layout; None for a plain file."""
    claimed = next((q for q in PRODUCERS if q.claims is not None and q.claims(unit)), None)
    return claimed or for_layout(unit.get("layout") or "")


def with_entry() -> Tuple[Producer, ...]:
    """The producers with a configured resume entry (a unit their resume loads by name)."""
    return tuple(p for p in PRODUCERS if p.entry is not None)


def reader_layouts(kind: str) -> Tuple[str, ...]:
    """The producers' layouts whose units of ``kind`` (``file``, ``folder``) ``safe_load_checkpoint`` loads."""
    return tuple(layout for p in PRODUCERS if kind in p.reader_kinds for layout in p.layouts)


#: Base-name patterns that make a folder a producer's own layout (any producer).
CLAIM_FILES: Tuple[str, ...] = tuple(n for p in PRODUCERS for n in p.claim_files)
#: ``(file name, key)`` of the loss logs the producers' trainers keep in their units.
LOSS_LOGS: Tuple[Tuple[str, str], ...] = tuple(p.loss_log for p in PRODUCERS if p.loss_log is not None)
def _step_files() -> Tuple[Tuple[str, str], ...]:
    """``(file name, dotted path)`` of each contract's step kept in a named file of a folder unit
    (``trainer_state.json``, ``global_step``), from the contracts' ``step_at``."""
    out = []
    for c in CONTRACTS:
        for at in c.step_at:
            name, _, path = at.partition(":")
            if path and not any(ch in name for ch in "*?["):
                out.append((name, path))
    return tuple(out)


#: ``(file name, dotted path)`` of each contract's step kept in a named file of a folder unit.
STEP_FILES: Tuple[Tuple[str, str], ...] = _step_files()
#: Files of the producers' units that are not training state: base name -> why the reader leaves them.
NOT_STATE_FILES: Mapping[str, str] = MappingProxyType({n: w for p in PRODUCERS for n, w in p.not_state.items()})


def pointer_file(pointer: dict) -> Optional[PointerFile]:
    """The producer's pointer file a pointer row (``path``, ``kind``) is, or None: same base name, and the
    inventory read it as that file (its ``kind`` unchanged: not a link, not refused)."""
    f = POINTER_FILES.get(str(pointer.get("path") or "").rsplit("/", 1)[-1])
    return f if f is not None and pointer.get("kind") == f.kind else None


def unfinished_marker(unit: str, present) -> Optional[Tuple[str, str]]:
    """``(marker, why)`` when a producer's unfinished marker of ``unit`` (run-relative) is in ``present`` (a set of
    run-relative paths of the run's files), else None: the unit is a save (or deletion) in progress that the
    producer's own resume skips (NeMo's ``-unfinished`` file, :mod:`.nemo`; NeMo Automodel's ``.incomplete`` inside
    the checkpoint folder, :mod:`.nemo_automodel`; training_hub's ``.incomplete-checkpoint-<step>`` beside it,
    :mod:`.training_hub`)."""
    for p in PRODUCERS:
        for m in p.unfinished_markers:
            for path in m.paths(unit):
                if path in present:
                    return path, m.why.format(marker=_base(path), marker_path=path)
    return None


#: ``(pattern, why)`` of the names the producers save under until a save is complete (``in_progress_names``)
_IN_PROGRESS = tuple((re.compile(pat), why) for p in PRODUCERS for pat, why in p.in_progress_names)
#: the producers' step patterns of their units' names (``name_step``), each with what its resume adds to it
_NAME_STEPS = tuple((re.compile(p.name_step), p.name_step_offset) for p in PRODUCERS if p.name_step)
#: ``(full-match pattern of a zip file's base name, folder name or "", layout)`` of the producers' own file units
#: (``unit_names``, ``unit_folder``)
_UNIT_NAMES = tuple((re.compile(p.unit_names), p.unit_folder, p.layouts[0]) for p in PRODUCERS
                    if p.unit_names and p.layouts)


def in_progress_name(name: str) -> Optional[str]:
    """Why a base name is a producer's save in progress (NVRx's ``*.dirty.pt``, :mod:`.nvrx`), or None."""
    return next((why for pat, why in _IN_PROGRESS if pat.search(name)), None)


def name_step(name: str) -> Optional[int]:
    """The step a producer's own naming puts in a base name (Composer's ``ba30``, :mod:`.composer`; timm's
    ``checkpoint-4.pth.tar``, resumed at epoch 5, :mod:`.timm`), or None."""
    return next((int(m.group(1)) + off for pat, off in _NAME_STEPS if (m := pat.search(name))), None)


def zip_layout(name: str, folder: str = "") -> Optional[str]:
    """The layout of a zip file unit named ``name`` (a base name) in a folder named ``folder`` when a producer
    names its units so: by its ``unit_names`` (inside its ``unit_folder`` where it has one: ultralytics'
    ``weights/last.pt``) or ``unit_suffix`` (Lightning's ``.ckpt``); None for a plain ``torch-zip``."""
    low = name.lower()
    return next((lay for pat, where, lay in _UNIT_NAMES if pat.fullmatch(name) and where in ("", folder)), None) or \
        next((p.layouts[0] for p in PRODUCERS if p.unit_suffix and p.layouts and low.endswith(p.unit_suffix)), None)


def resume_step(layout: str, tree: Optional[dict]) -> Optional[Tuple[int, str]]:
    """``(step, where)``: the step the resume of a ``layout`` unit continues at, by its producer's ``resume_step``
    read from the first file of ``tree`` (``{file key: pruned object}``) that says it; None when no producer of
    that layout has one or no file says it.  By layout: the same with the contracts off."""
    p = for_layout(layout)
    if p is None or p.resume_step is None or not tree:
        return None
    for fkey, sub in tree.items():
        got = p.resume_step(sub)
        if got is not None:
            return got[0], f"{fkey}:{got[1]}"
    return None


def incomplete_saves(units: Sequence[str]) -> Dict[str, str]:
    """``{unit: why}``: of a run's units (run-relative paths), those of a save that another of its ranks has not
    finished, so that the producer's resume never takes it (NVRx's ``find_latest``, :mod:`.nvrx`)."""
    out: Dict[str, str] = {}
    for p in PRODUCERS:
        if p.incomplete_saves is not None:
            out.update(p.incomplete_saves(units))
    return out


def spoiled_saves(usable: Dict[str, str]) -> Dict[str, str]:
    """``{unit: why}``: of a run's units (``{run-relative path: usable_for}``, as the verdict judged each alone),
    the usable ones whose save another file of that the producer's resume loads with them is not usable (NVRx:
    one rank's file of an iteration is damaged, :mod:`.nvrx`)."""
    out: Dict[str, str] = {}
    for p in PRODUCERS:
        if p.spoiled_saves is not None:
            out.update(p.spoiled_saves(usable))
    return out


def enabled() -> bool:
    """False when ``CKPTAUDIT_PRODUCER_CONTRACTS`` is ``0``/``false``/``off`` (read at each call)."""
    return os.environ.get("CKPTAUDIT_PRODUCER_CONTRACTS", "1").strip().lower() not in ("0", "false", "off", "no")


def _base(f: str) -> str:
    return f.rsplit("/", 1)[-1]


def identify(layout: str, files: Sequence[str], tree: Optional[dict] = None) -> Optional[Contract]:
    """The contract of the producer that wrote a unit, or None (also when contracts are off).

    ``files`` are the unit's files (run-relative); ``tree`` its scan tree ({file key: pruned object}).
    """
    if not enabled():
        return None
    bases = [_base(f) for f in files]
    for c in CONTRACTS:
        if layout not in c.layouts:
            continue
        if c.match_files and any(fnmatch.fnmatch(b, p) for p in c.match_files for b in bases):
            return c
        if c.match_keys and tree:
            for sub in tree.values():
                if isinstance(sub, dict) and all(k in sub for k in c.match_keys):
                    return c
    return None


def role_of(contract: Optional[Contract], file: str) -> Optional[FileRole]:
    """The role a unit's file plays under ``contract`` (None when unknown)."""
    if contract is None:
        return None
    b = _base(file)
    for r in contract.files:
        if fnmatch.fnmatch(b, r.pattern):
            return r
    return None


def metadata_files(contract: Optional[Contract], files: Sequence[str]) -> List[str]:
    """The unit's files that the producer's resume never reads."""
    return [f for f in files if (r := role_of(contract, f)) is not None and r.loaded_by == "never"]
