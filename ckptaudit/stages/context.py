"""What every per-part stage is handed: one frozen :class:`StageContext` per audit, the part's units, and the rows
of the earlier stages it reads.

Each per-part stage (``hash``, ``scan``, ``load``, ``structure``, ``configdiff``, ``state``) is a module of
:mod:`ckptaudit.stages` with one entry point of one signature::

    run(ctx: StageContext, part: Part, rows: EarlierRows) -> <the stage's rows>

over values (the typed rows of :mod:`ckptaudit.stages.rows`): the rules' CLI (:mod:`ckptaudit.stages.cli`) builds
the context from its arguments, reads the earlier stages' tables into an ``EarlierRows`` and writes what ``run``
returns; the in-process audit
(:func:`ckptaudit.pipeline.audit_in_process`) builds the context once and hands each stage's rows to the next
in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from ..fs import read_depth


@dataclass(frozen=True)
class StageContext:
    """What the stages of one audit share.  ``run_dir``: the run folder (a ``Path``, or an ``RPath`` for
    ``s3://…``); ``inventory``: the inventory stage's document (:func:`ckptaudit.stages.inventory.run_inventory`:
    ``run_dir``, ``units``, ``parts``, ``object_store``, …); ``config``: the stage config (keys of
    ``config/config.yaml``, :func:`ckptaudit.pipeline.merged_config`); ``depth``: how deep the file layer reads;
    ``target``: the resuming job's structure (``work/target.json``, :mod:`ckptaudit.stages.target`; None: built
    from ``config`` where a stage needs it); ``work``: the folder of the stages' internal files (the hash
    stage's ledger fragments, ``verified/<part>.json``; None: none kept); ``verify_plan``: ``work/verify_plan.json``
    of a ``verify_budget`` audit (None: every unit is read).  The bytes of remote objects that the hash stage's
    pass kept for the later stages' reads are not here: they travel with the pass's facts
    (:meth:`ckptaudit.stages.rows.HashRows.byte_facts` → ``ByteFacts.kept``), handed down as the reads'
    ``kept=`` parameter."""

    run_dir: Any
    inventory: Mapping[str, Any]
    config: Mapping[str, Any]
    depth: read_depth.ReadDepth = read_depth.FULL
    target: Optional[Mapping[str, Any]] = None
    work: Optional[Path] = None
    verify_plan: Optional[str] = None


@dataclass(frozen=True)
class Part:
    """A part of the run's units (:func:`ckptaudit.stages.inventory.parts.assign_parts`): its id (``p0000`` …)
    and its units (inventory dicts, in the inventory's order)."""

    name: str
    units: Tuple[dict, ...]
