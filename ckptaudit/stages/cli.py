"""The rules' CLI and the stage functions it runs: ``python -m ckptaudit.stages STAGE …``.

Each stage is a plain function over files, so it is testable without
Snakemake; the rules in ``rules/*.smk`` only wire paths.  Per-unit stages take
a *part* (a group of units, see :func:`ckptaudit.discovery.assign_parts`) and
write one Parquet table for it; the report stage concatenates the parts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

from . import STAGES, TABLES, liveness  # noqa: F401 - STAGES, TABLES re-exported
from ..fs import read_depth
from .inventory.parts import part_units, read_inventory  # noqa: F401 - part_units re-exported
from .scan import iter_scans, object_store_findings, scan_units  # noqa: F401 - re-exported
from .target import load_reference  # noqa: F401 - re-exported
from .work_paths import bytes_path, work_file  # noqa: F401 - re-exported
from .work_paths import write_bytes as _write_bytes



def _inventory(path: str) -> dict:
    return read_inventory(path)


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
    from .. import tables

    doc = inventory.run_inventory(run_dir, units_per_job, part_bytes)
    inventory.write_inventory(doc, out_parquet, out_json)
    tables.write("pointers", [{**p, "ok": None, "finding_kind": "", "findings_json": "[]"} for p in doc["pointers"]],
                 out_pointers)
    return doc


#: The kinds of the hash stage's facts each stage asks of them (:func:`ckptaudit.onepass.facts.load`; others: all).
SCAN_FACT_KINDS = ("crc", "nul_run", "nul_scan", "nul_scan_run", "bytes")
STATE_FACT_KINDS = ("values", "bytes")


def _load_facts(out: str, part: str, facts_path: Optional[str], run_dir,
                depth: read_depth.ReadDepth = read_depth.FULL, kinds=None):
    """The hash stage's facts of ``part`` (table ``bytefacts``) as a :class:`ckptaudit.onepass.facts.ByteFacts`
    (empty when the hash stage wrote none), carrying ``depth``'s ``tensor_bytes`` to the file checks; ``kinds``:
    those kept (default: all)."""
    from ..onepass import facts

    p = Path(facts_path) if facts_path else work_file(out, "bytefacts", part, "parquet")
    return facts.load(p if p.is_file() else [], run_dir, depth.tensor_bytes, kinds)  # read a batch at a time


def stage_hash(inv: dict, part: str, out: str, out_facts: Optional[str] = None,
               depth: read_depth.ReadDepth = read_depth.FULL, stop=None,
               verify_plan: Optional[str] = None) -> List[dict]:
    """Hash every file of ``part`` in one pass per file, up to :data:`ckptaudit.stages.hash.PASSES_AT_ONCE` units
    at once.  A part packs several units, and SHA-256, CRC32 and numpy release the GIL, so one job uses every
    core the rule's ``threads`` reserve; with more units than cores the kernel time-slices the passes, so
    three 1 GiB files on two cores finish together instead of two, then one (SHA-256 is serial per file).
    ``PASSES_AT_ONCE`` bounds the passes in flight, so memory does not grow with the part.  Rows keep the
    part's unit order.  Also writes the pass's facts (table ``bytefacts``, at ``out_facts`` or
    :func:`work_file`) and the bytes read (:func:`bytes_path`).  ``depth``: which SHA-256s are computed
    (:class:`ckptaudit.fs.read_depth.ReadDepth`); ``stop``: an event that, set, stops the passes at their next
    buffer (the reader abandoning a pass it started ahead).  ``verify_plan`` (``work/verify_plan.json`` of a
    ``verify_budget`` audit): the units it leaves out are not read, their previous rows are kept
    (:class:`ckptaudit.verification.budget.JobSplit`); every unit's rows go to the ledger (``work/verified/<part>.json``).  Each file's digest is compared with the one
    its unit's last verification recorded (:meth:`ckptaudit.verification.budget.JobSplit.done`: the part's ledger
    rows, else the report's table of the previous audit into the same output folder)."""
    from concurrent.futures import ThreadPoolExecutor

    import functools

    from .. import fs, layouts, tables
    from . import hash as hashing
    from ..verification import reverify, budget as verify_budget, ledger as verify_ledger
    from ..verification.reverify import now_utc

    before = fs.stage_bytes()  # no kept bytes are served here: this stage reads the objects themselves
    run_dir = fs.path(inv["run_dir"])
    units = part_units(inv, part)
    fragment = work_file(out, verify_ledger.FRAGMENTS, part, "json")  # this part's additions to the ledger
    split = verify_budget.JobSplit(inv, units, verify_plan, fragment)

    facts_out = out_facts or work_file(out, "bytefacts", part, "parquet")
    facts_writer = tables.BatchWriter("bytefacts", facts_out)  # each file's facts written as its pass ends
    # the digests of the units this part's ledger does not know (the first audit since, or a unit packed into
    # another part since) from the report's whole hash table; the others' from their ledger rows (JobSplit.done)
    unknown = [f for u in units if split.previous_rows(u["unit"]) is None for f in u["files"]]
    recorded = reverify.previous_digests(_ledger(out), unknown) if unknown else {}

    def one(u: dict):
        if (kept := split.carried(u["unit"])) is not None:  # outside this audit's verify budget: not read
            return kept
        facts: list = []
        planned = functools.partial(layouts.reads_records, u)  # files a later stage reads by record
        rows = liveness.guard("hash", u, lambda: hashing.hash_unit(run_dir, u, facts, planned, depth, stop),
                              lambda f: [_hash_error_row(u, f)])
        done_at = now_utc()  # when these bytes were last verified (the report's "last hashed")
        for r in rows:
            if r.get("digest_hex"):
                r["hashed_at_utc"] = done_at
        split.done(u["unit"], rows, done_at, recorded)  # bit rot against the unit's last verification
        for t in facts:
            facts_writer.write(t)
        return rows

    workers = max(1, min(hashing.PASSES_AT_ONCE, len(units)))
    with facts_writer:  # the facts file whole, or none (and no temp file) when a pass raises
        if workers > 1:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                done = list(pool.map(one, units))
        else:
            done = [one(u) for u in units]
    rows = [r for unit_rows in done for r in unit_rows]
    tables.write("hash", rows, out)
    split.write(fragment)
    _write_bytes(out, "hash", part, before)
    return rows


def _ledger(out: str) -> Path:
    """The previous audit's hash table (``<out>/tables/hash.parquet``, the report's) for a part table ``out``
    (``<out>/tables/parts/hash/<part>.parquet``); beside ``out`` otherwise."""
    o = Path(out)
    if o.parent.parent.name == "parts" and o.parent.parent.parent.name == "tables":
        return o.parents[2] / "hash.parquet"
    return o.with_name(f"{o.stem}.previous.parquet")


def _error_row(u: dict, f) -> dict:
    """A stage row that carries only an ``audit_error`` finding (see :mod:`ckptaudit.stages.liveness`)."""
    return {"unit": u["unit"], "findings_json": json.dumps([f.to_dict()])}


def _hash_error_row(u: dict, f) -> dict:
    return {"unit": u["unit"], "file": "", "findings_json": json.dumps([f.to_dict()])}


def _with_object_store(inv: dict, units: List[dict]) -> List[dict]:
    """Units with the inventory's object-store facts (``inv["object_store"][unit]``) attached."""
    osd = inv.get("object_store") or {}
    return [{**u, "object_store": osd[u["unit"]]} if u["unit"] in osd else u for u in units]


def stage_scan(inv: dict, part: str, cfg: dict, out: str, out_tensors: str, out_imports: str,
               facts_path: Optional[str] = None, depth: read_depth.ReadDepth = read_depth.FULL) -> List[dict]:
    """The file and security layers of ``part``; the CRC32 of zip records comes from the hash stage's facts
    (``facts_path``, else the ``bytefacts`` table at :func:`work_file`) where it has them.  At a ``depth``
    without ``tensor_bytes`` (:data:`ckptaudit.fs.read_depth.METADATA_ONLY`) no check streams tensor data."""
    from .. import fs, tables

    before = fs.stage_bytes()
    run_dir = _run_dir(inv, cfg)
    facts = _load_facts(out, part, facts_path, run_dir, depth, kinds=SCAN_FACT_KINDS)
    scans, imports = [], []
    # a unit's tensors as columns, written as scanned; remote reads served from the pass's kept bytes
    with fs.kept.serving(facts.kept), tables.BatchWriter("tensors", out_tensors) as tensors:
        for row, tens, imps in iter_scans(run_dir, _with_object_store(inv, part_units(inv, part)), cfg, facts):
            scans.append(row)
            tensors.write(tens)
            imports.extend(imps)
            del tens
    tables.write("scan", scans, out)
    tables.write("imports", imports, out_imports)
    _write_bytes(out, "scan", part, before)
    return scans


#: The columns of the ``tensors`` table the structure and state layers read (a dict per tensor each: no more).
STRUCTURE_TENSOR_COLUMNS = ["unit", "file", "name", "dtype", "shape", "storage_key", "storage_offset"]
STATE_TENSOR_COLUMNS = ["unit", "file", "name", "dtype", "data_offset", "nbytes"]


def stage_load(inv: dict, part: str, cfg: dict, scan_path: str, out: str,
               facts_path: Optional[str] = None, loader: Optional[Callable] = None) -> List[dict]:
    """The load test of ``part``; a remote object's copy leaves out the tensor data the hash stage's facts name.
    ``loader`` loads the files (:func:`ckptaudit.stages.load.loadtest.load_units`; default: in this process): the rule's,
    :func:`ckptaudit.stages.load.server.loader` (the audit's load server, which has imported torch once), or the
    reader's, :class:`ckptaudit.stages.load.reader.ReaderLoads`.  Its bytes file has ``loadtest_bytes``: what the
    load children themselves read, and ``served_files``: files the load server loaded."""
    from .. import fs, tables
    from .load import server as load_server, loadtest

    before = fs.stage_bytes()
    children_before = loadtest.child_bytes_read()  # the counter is per thread: this stage's share only
    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    run_dir = _run_dir(inv, cfg)
    # the facts only plan a remote object's sparse copy (ckptaudit.stages.load.remote_copy)
    facts = _load_facts(out, part, facts_path, run_dir) if fs.is_remote(run_dir) else None
    units = part_units(inv, part)
    try:  # the part's units at once, so their small files share load children (ckptaudit.stages.load.child)
        with fs.kept.serving(facts.kept if facts is not None else None):
            rows = _in_unit_order(units, loadtest.load_units(run_dir, units, scans, cfg, loader, facts))
    except Exception:  # noqa: BLE001 - again unit by unit: the error becomes a finding on the unit that raised it
        rows = []
        for u in units:
            rows.extend(liveness.guard("load", u, lambda: loadtest.load_units(run_dir, [u], scans, cfg),
                                       lambda f: [{**loadtest.skip_row(u["unit"], "", "the load stage failed on this "
                                                                                      "unit"),
                                                   "findings_json": json.dumps([f.to_dict()])}]))
    tables.write("load", rows, out)
    _write_bytes(out, "load", part, before, loadtest_bytes=loadtest.child_bytes_read() - children_before,
                 served_files=loader.files_served if isinstance(loader, load_server.ServerLoads) else 0)
    return rows


def _in_unit_order(units: List[dict], rows: List[dict]) -> List[dict]:
    """``rows`` grouped by unit in the order of ``units`` (stable within a unit)."""
    order = {u["unit"]: i for i, u in enumerate(units)}
    return sorted(rows, key=lambda r: order.get(r["unit"], len(order)))


def stage_structure(inv: dict, part: str, cfg: dict, scan_path: str, tensors_path: str, out: str,
                    target_path: str | None = None) -> List[dict]:
    from . import structure, target
    from .. import tables

    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    tens = tables.UnitRows(tensors_path, columns=STRUCTURE_TENSOR_COLUMNS)  # a unit's rows as dicts while read
    if target_path:
        with open(target_path) as f:
            reference = json.load(f).get("weights")
    else:
        reference = target.build(cfg).get("weights")
    return _per_scanned_unit("structure", inv, part, scans, out, lambda u: structure.analyse_unit(
        u, scans[u["unit"]], tens.of(u["unit"]), cfg, reference))


def stage_configdiff(inv: dict, part: str, cfg: dict, scan_path: str, out: str) -> List[dict]:
    from . import configdiff
    from .. import tables

    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    rows: List[dict] = []
    for u in part_units(inv, part):
        if u["unit"] in scans:
            rows.extend(liveness.guard("configdiff", u, lambda: configdiff.diff_unit(u, scans[u["unit"]], cfg),
                                       lambda f: [{**_error_row(u, f), "source": "", "key": ""}]))
    tables.write("configdiff", rows, out)
    return rows


def stage_state(inv: dict, part: str, cfg: dict, scan_path: str, tensors_path: str, out: str,
                facts_path: Optional[str] = None) -> List[dict]:
    """The state layer of ``part``; tensor value statistics come from the hash stage's facts where it has them."""
    from .. import fs, tables
    from . import state

    before = fs.stage_bytes()
    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    tens = tables.UnitRows(tensors_path, columns=STATE_TENSOR_COLUMNS)  # a unit's rows as dicts while read
    run_dir = _run_dir(inv, cfg)
    facts = _load_facts(out, part, facts_path, run_dir, kinds=STATE_FACT_KINDS)
    with fs.kept.serving(facts.kept):
        rows = _per_scanned_unit("state", inv, part, scans, out, lambda u: state.analyse_unit(
            u, scans[u["unit"]], tens.rows(u["unit"]), run_dir, cfg, facts))
    _write_bytes(out, "state", part, before)
    return rows


def _per_scanned_unit(stage: str, inv: dict, part: str, scans: Dict[str, dict], out: str,
                      analyse: Callable[[dict], dict]) -> List[dict]:
    """One row per unit of ``part`` that has a scan row: ``analyse(unit)``, or an ``audit_error`` row when it
    raises; written as table ``stage``."""
    from .. import tables

    rows = [liveness.guard(stage, u, lambda: analyse(u), lambda f: _error_row(u, f))
            for u in part_units(inv, part) if u["unit"] in scans]
    tables.write(stage, rows, out)
    return rows


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
    from ..tables import job_memory_pool, without_pandas

    without_pandas()
    job_memory_pool()
    argv = sys.argv[1:] if argv is None else list(argv)
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
    inv = _inventory(a.inventory)
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
