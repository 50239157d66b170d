"""The rules' CLI: ``python -m ckptaudit.stages STAGE …``, the boundary where tables are read and written.

Each per-part stage is a function over values, ``run(ctx, part, rows)`` of its module
(:mod:`ckptaudit.stages.context`).  A ``stage_*`` function here builds the context from a job's arguments,
reads the earlier stages' tables of its *part* (a group of units, see
:func:`ckptaudit.stages.inventory.parts.assign_parts`), calls the stage's ``run`` and writes its Parquet
table(s) and the bytes it read; the report stage concatenates the parts.  The rules in ``rules/*.smk``
only wire paths.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, List, Optional

from . import STAGES, TABLES, liveness  # noqa: F401 - STAGES, TABLES re-exported
from ..fs import read_depth
from .inventory.part_docs import read_part_inventory
from .inventory.parts import part_units, read_inventory  # noqa: F401 - part_units re-exported
from .scan import iter_scans, object_store_findings, scan_units  # noqa: F401 - re-exported
from .context import Part, StageContext
from .rows import EarlierRows, HashRows, ScanRow, ScanRows, records
from .target import load_reference  # noqa: F401 - re-exported
from .work_paths import bytes_path, work_dir, work_file  # noqa: F401 - re-exported
from .work_paths import write_bytes as _write_bytes


def _config(path: str | None) -> dict:
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


def _run_dir(inv: dict, cfg: dict):
    """The run folder as a path (``RPath`` for ``s3://…``), after applying the config's ``s3:`` block."""
    from .. import fs

    if fs.is_remote(inv["run_dir"]) and cfg.get("s3"):
        fs.configure(cfg["s3"])
    return fs.path(inv["run_dir"])


def stage_inventory(run_dir: str, units_per_job, out_parquet: str, out_json: str, out_pointers: str,
                    part_bytes: Optional[int] = None) -> dict:
    """The inventory stage; ``part_bytes`` bounds an "auto" part's bytes (a cluster), None packs by count
    (one machine; :func:`ckptaudit.stages.inventory.parts.assign_parts`)."""
    from . import inventory
    from .inventory import part_docs
    from .. import tables

    doc = inventory.run_inventory(run_dir, units_per_job, part_bytes)
    inventory.write_inventory(doc, out_parquet, out_json)
    part_docs.write_part_docs(doc, out_json)  # after inventory.json: each part's document records its identity
    tables.write("pointers", [{**p, "ok": None, "finding_kind": "", "findings_json": "[]"} for p in doc["pointers"]],
                 out_pointers)
    return doc


def _context(inv: dict, cfg: dict, out: Optional[str] = None, depth: read_depth.ReadDepth = read_depth.FULL,
             target_path: Optional[str] = None, verify_plan: Optional[str] = None) -> StageContext:
    """The stage context of a rule's job: the run folder (after the config's ``s3:`` block), the inventory, the
    config, ``depth``, the target read from ``target_path`` (``work/target.json``; None: built from the config
    where needed) and the work folder of the stage table ``out``."""
    target = None
    if target_path:
        with open(target_path) as f:
            target = json.load(f)
    return StageContext(_run_dir(inv, cfg), inv, cfg, depth, target, work_dir(out) if out else None, verify_plan)


def _part(inv: dict, part: str) -> Part:
    return Part(part, tuple(part_units(inv, part)))


def _hash_rows(out: str, part: str, facts_path: Optional[str]) -> HashRows:
    """The hash stage's facts of ``part`` (table ``bytefacts`` at ``facts_path``, else :func:`work_file` beside the
    stage table ``out``; none when the hash stage wrote none), as the file: read a batch at a time by the stage."""
    p = Path(facts_path) if facts_path else work_file(out, "bytefacts", part, "parquet")
    return HashRows((), facts_file=str(p) if p.is_file() else None)


def _scan_rows(scan_path: str, tensors_path: Optional[str] = None, columns=None) -> ScanRows:
    """The scan stage's rows of a part from its tables (``tensors_path`` None: no tensors read)."""
    from .. import tables

    tens = tables.read_table(tensors_path, columns) if tensors_path else tables.SCHEMAS["tensors"].empty_table()
    return ScanRows(tuple(ScanRow.of(r) for r in tables.read_rows(scan_path)), tens, ())


def _write_rows(table: str, got, out: str) -> List[dict]:
    """A per-part stage's typed rows (``got.rows``) written as its table ``table`` at ``out``; the records."""
    from .. import tables

    written = records(got.rows)
    tables.write(table, written, out)
    return written


def stage_hash(inv: dict, part: str, out: str, out_facts: Optional[str] = None,
               depth: read_depth.ReadDepth = read_depth.FULL, stop=None,
               verify_plan: Optional[str] = None) -> List[dict]:
    """The hash stage of ``part`` (:func:`ckptaudit.stages.hash.run`), written as table ``hash`` at ``out``, its
    facts as table ``bytefacts`` (at ``out_facts`` or :func:`work_file`) and the bytes read (:func:`bytes_path`)."""
    from .. import fs, tables
    from . import hash as hashing

    before = fs.stage_bytes()  # no kept bytes are served here: this stage reads the objects themselves
    # each unit's facts written as its passes end: the file whole, or none (and no temp file) when a pass raises
    with tables.BatchWriter("bytefacts", out_facts or work_file(out, "bytefacts", part, "parquet")) as facts:
        got = hashing.run(_context(inv, {}, out, depth, verify_plan=verify_plan), _part(inv, part), EarlierRows(),
                          stop=stop, facts_to=facts.write)
    written = _write_rows("hash", got, out)
    _write_bytes(out, "hash", part, before)
    return written


def write_facts(got: HashRows, path: str | Path) -> None:
    """The hash stage's facts of a part as table ``bytefacts`` at ``path`` (the file whole, or none)."""
    from .. import tables

    with tables.BatchWriter("bytefacts", path) as facts:
        for t in got.facts:
            facts.write(t)


def stage_scan(inv: dict, part: str, cfg: dict, out: str, out_tensors: str, out_imports: str,
               facts_path: Optional[str] = None, depth: read_depth.ReadDepth = read_depth.FULL) -> List[dict]:
    """The scan stage of ``part`` (:func:`ckptaudit.stages.scan.run`) over the hash stage's facts (``facts_path``,
    else the ``bytefacts`` table at :func:`work_file`), written as tables ``scan``, ``tensors`` and ``imports``."""
    from .. import fs
    from . import scan

    before = fs.stage_bytes()
    got = scan.run(_context(inv, cfg, out, depth), _part(inv, part), EarlierRows(_hash_rows(out, part, facts_path)))
    write_scan(got, out, out_tensors, out_imports)
    _write_bytes(out, "scan", part, before)
    return [s.row for s in got.scans]


def write_scan(got: ScanRows, out: str | Path, out_tensors: str | Path, out_imports: str | Path) -> None:
    """The scan stage's rows as tables ``scan``, ``tensors`` and ``imports``."""
    from .. import tables

    tables.write("scan", [dict(s.row) for s in got.scans], out)
    with tables.BatchWriter("tensors", out_tensors) as w:
        w.write(got.tensors)
    tables.write("imports", records(got.imports), out_imports)


def stage_load(inv: dict, part: str, cfg: dict, scan_path: str, out: str,
               facts_path: Optional[str] = None, loader: Optional[Callable] = None) -> List[dict]:
    """The load stage of ``part`` (:func:`ckptaudit.stages.load.run`) over its scan table, written as table
    ``load``.  Its bytes file has ``loadtest_bytes``: what the load children themselves read, and ``served_files``:
    files the load server loaded."""
    from .. import fs
    from . import load
    from .load import server as load_server

    before = fs.stage_bytes()
    ctx = _context(inv, cfg, out)
    earlier = EarlierRows(_hash_rows(out, part, facts_path) if fs.is_remote(ctx.run_dir) else None, _scan_rows(scan_path))
    got = load.run(ctx, _part(inv, part), earlier, loader=loader)
    written = _write_rows("load", got, out)
    _write_bytes(out, "load", part, before, loadtest_bytes=got.loadtest_bytes,
                 served_files=loader.files_served if isinstance(loader, load_server.ServerLoads) else 0)
    return written


def stage_structure(inv: dict, part: str, cfg: dict, scan_path: str, tensors_path: str, out: str,
                    target_path: str | None = None) -> List[dict]:
    """The structure stage of ``part`` (:func:`ckptaudit.stages.structure.run`) against ``target_path``
    (``work/target.json``; None: built from ``cfg``), written as table ``structure``."""
    from . import structure

    got = structure.run(_context(inv, cfg, out, target_path=target_path), _part(inv, part),
                        EarlierRows(scan=_scan_rows(scan_path, tensors_path, structure.TENSOR_COLUMNS)))
    return _write_rows("structure", got, out)


def stage_configdiff(inv: dict, part: str, cfg: dict, scan_path: str, out: str) -> List[dict]:
    """The configdiff stage of ``part`` (:func:`ckptaudit.stages.configdiff.run`), written as table ``configdiff``."""
    from . import configdiff

    got = configdiff.run(_context(inv, cfg, out), _part(inv, part), EarlierRows(scan=_scan_rows(scan_path)))
    return _write_rows("configdiff", got, out)


def stage_state(inv: dict, part: str, cfg: dict, scan_path: str, tensors_path: str, out: str,
                facts_path: Optional[str] = None) -> List[dict]:
    """The state stage of ``part`` (:func:`ckptaudit.stages.state.run`); tensor value statistics come from the
    hash stage's facts where it has them; written as table ``state``."""
    from .. import fs
    from . import state

    before = fs.stage_bytes()
    got = state.run(_context(inv, cfg, out), _part(inv, part),
                    EarlierRows(_hash_rows(out, part, facts_path),
                                _scan_rows(scan_path, tensors_path, state.TENSOR_COLUMNS)))
    written = _write_rows("state", got, out)
    _write_bytes(out, "state", part, before)
    return written


#: each rule's arguments: (flag, required, help); the positional sub-command is the rule's name
_ARGS = {
    "inventory": [("--run-dir", True, "run folder or s3://bucket/prefix"), ("--units-per-job", False, "auto or N"),
                  ("--part-bytes", False, "auto parts' byte bound (a cluster), or none (one machine; default)"),
                  ("--out", True, "inventory.parquet"), ("--out-json", True, "inventory.json"),
                  ("--out-pointers", True, "pointers.parquet")],
    "hash": [("--inventory", True, "inventory.json"), ("--part", True, "part id (p0000…)"),
             ("--out", True, "hash table"), ("--out-facts", False, "bytefacts table (else beside the hash table)"),
             ("--verify-plan", False, "verify_plan.json of a verify_budget audit (else every unit is read)")],
    "scan": [("--inventory", True, "inventory.json"), ("--part", True, "part id"), ("--config", True, "config.json"),
             ("--out", True, "scan table"), ("--out-tensors", True, "tensors table"),
             ("--out-imports", True, "imports table"), ("--facts", False, "bytefacts table of the hash stage")],
    "load": [("--inventory", True, "inventory.json"), ("--part", True, "part id"), ("--config", True, "config.json"),
             ("--scan", True, "scan table"), ("--out", True, "load table"),
             ("--facts", False, "bytefacts table of the hash stage"),
             ("--load-server", False, "load_server.json of the audit's load server (ckptaudit/stages/load/server.py)")],
    "structure": [("--inventory", True, "inventory.json"), ("--part", True, "part id"),
                  ("--config", True, "config.json"), ("--scan", True, "scan table"),
                  ("--tensors", True, "tensors table"), ("--target", False, "target.json (else built from config)"),
                  ("--out", True, "structure table")],
    "configdiff": [("--inventory", True, "inventory.json"), ("--part", True, "part id"),
                   ("--config", True, "config.json"), ("--scan", True, "scan table"), ("--out", True, "configdiff table")],
    "state": [("--inventory", True, "inventory.json"), ("--part", True, "part id"), ("--config", True, "config.json"),
              ("--scan", True, "scan table"), ("--tensors", True, "tensors table"), ("--out", True, "state table"),
              ("--facts", False, "bytefacts table of the hash stage")],
}


def parser() -> argparse.ArgumentParser:
    """``python -m ckptaudit.stages RULE --flag …``: one sub-command per rule, each with its required arguments
    (a missing ``--part`` is a usage error naming it, not a failure deep inside the stage)."""
    ap = argparse.ArgumentParser(prog="python -m ckptaudit.stages", description="One stage of the audit workflow.")
    sub = ap.add_subparsers(dest="stage", required=True, metavar="RULE")
    sub.add_parser("target", help="the target rule (python -m ckptaudit.stages target --help)", add_help=False)
    sub.add_parser("report", help="the report rule (python -m ckptaudit.stages report --help)", add_help=False)
    for rule, args in _ARGS.items():
        sp = sub.add_parser(rule, help=f"the {rule} rule")
        for flag, required, help_ in args:
            sp.add_argument(flag, required=required, help=help_, **({"default": "auto"} if flag == "--units-per-job" else {}))
    return ap


def main(argv=None) -> int:
    import os

    # One BLAS thread: the value statistics' float32 dot products run on the pass's own consumer threads, and
    # OpenBLAS's pool on top of them spent a third more CPU for the same wall (1 GiB: 0.52 → 0.30 CPU-s).
    # Read when numpy is first imported, which no stage has done yet; a value the user set is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from .jobs.process import fewer_collections, job_memory_pool, without_pandas

    without_pandas()
    job_memory_pool()
    argv = sys.argv[1:] if argv is None else list(argv)
    fewer_collections()
    if argv[:1] == ["target"]:  # the target and report rules parse their own arguments
        from .target import main as target_main

        return target_main(argv[1:])
    if argv[:1] == ["report"]:
        from .report import main as report_main

        return report_main(argv[1:])
    a = parser().parse_args(argv)
    if a.stage == "inventory":
        from .inventory.run_folder import require_units  # an empty or checkpoint-less folder: exit 3, naming what was ignored

        part_bytes = None if a.part_bytes in (None, "none") else int(a.part_bytes)
        require_units(stage_inventory(a.run_dir, a.units_per_job, a.out, a.out_json, a.out_pointers, part_bytes))
        return 0
    inv = read_part_inventory(a.inventory, a.part)  # the part's own units, not the whole run's
    if a.stage == "hash":
        stage_hash(inv, a.part, a.out, a.out_facts, verify_plan=a.verify_plan)
        return 0
    cfg = _config(a.config)
    if a.stage == "scan":
        stage_scan(inv, a.part, cfg, a.out, a.out_tensors, a.out_imports, a.facts)
    elif a.stage == "load":
        from .load.server import loader

        stage_load(inv, a.part, cfg, a.scan, a.out, a.facts, loader(a.load_server))
    elif a.stage == "structure":
        stage_structure(inv, a.part, cfg, a.scan, a.tensors, a.out, a.target)
    elif a.stage == "configdiff":
        stage_configdiff(inv, a.part, cfg, a.scan, a.out)
    else:
        stage_state(inv, a.part, cfg, a.scan, a.tensors, a.out, a.facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
