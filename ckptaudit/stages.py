"""Entry points of the workflow's rules: ``python -m ckptaudit.stages STAGE …``.

Each stage is a plain function over files, so it is testable without
Snakemake; the rules in ``rules/*.smk`` only wire paths.  Per-unit stages take
a *part* (a group of units, see :func:`ckptaudit.inventory.assign_parts`) and
write one Parquet table for it; the report stage concatenates the parts.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Dict, List

from . import liveness
from .parts import part_units, read_inventory  # noqa: F401 - part_units re-exported
from .layouts.scan import object_store_findings, scan_units  # noqa: F401 - re-exported
from .target import load_reference  # noqa: F401 - re-exported


def _inventory(path: str) -> dict:
    return read_inventory(path)


def _config(path: str | None) -> dict:
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


def _run_dir(inv: dict, cfg: dict):
    """The run folder as a path (``RPath`` for ``s3://…``), after applying the config's ``s3:`` block."""
    from . import fs

    if fs.is_remote(inv["run_dir"]) and cfg.get("s3"):
        fs.configure(cfg["s3"])
    return fs.path(inv["run_dir"])


def stage_inventory(run_dir: str, units_per_job, out_parquet: str, out_json: str, out_pointers: str) -> dict:
    from . import inventory, tables

    doc = inventory.run_inventory(run_dir, units_per_job)
    inventory.write_inventory(doc, out_parquet, out_json)
    tables.write("pointers", [{**p, "ok": None, "finding_kind": "", "findings_json": "[]"} for p in doc["pointers"]],
                 out_pointers)
    return doc


def stage_hash(inv: dict, part: str, out: str) -> List[dict]:
    from . import hashing, tables

    from . import fs

    run_dir = fs.path(inv["run_dir"])
    rows: List[dict] = []
    for u in part_units(inv, part):
        rows.extend(liveness.guard("hash", u, lambda: hashing.hash_unit(run_dir, u), lambda f: [_hash_error_row(u, f)]))
    tables.write("hash", rows, out)
    return rows


def _error_row(u: dict, f) -> dict:
    """A stage row that carries only an ``audit_error`` finding (see :mod:`ckptaudit.liveness`)."""
    return {"unit": u["unit"], "findings_json": json.dumps([f.to_dict()])}


def _hash_error_row(u: dict, f) -> dict:
    return {"unit": u["unit"], "file": "", "findings_json": json.dumps([f.to_dict()])}


def _with_object_store(inv: dict, units: List[dict]) -> List[dict]:
    """Units with the inventory's object-store facts (``inv["object_store"][unit]``) attached."""
    osd = inv.get("object_store") or {}
    return [{**u, "object_store": osd[u["unit"]]} if u["unit"] in osd else u for u in units]


def stage_scan(inv: dict, part: str, cfg: dict, out: str, out_tensors: str, out_imports: str) -> List[dict]:
    from . import tables

    scans, tensors, imports = scan_units(_run_dir(inv, cfg), _with_object_store(inv, part_units(inv, part)), cfg)
    tables.write("scan", scans, out)
    tables.write("tensors", tensors, out_tensors)
    tables.write("imports", imports, out_imports)
    return scans


def _by_unit(rows: List[dict]) -> Dict[str, List[dict]]:
    out: Dict[str, List[dict]] = {}
    for r in rows:
        out.setdefault(r["unit"], []).append(r)
    return out


def stage_load(inv: dict, part: str, cfg: dict, scan_path: str, hash_path: str, out: str) -> List[dict]:
    from . import loadtest, tables

    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    hashes = _by_unit(tables.read_rows(hash_path))
    run_dir = _run_dir(inv, cfg)
    rows = []
    for u in part_units(inv, part):
        rows.extend(liveness.guard("load", u, lambda: loadtest.load_units(run_dir, [u], scans, hashes, cfg),
                                   lambda f: [{**loadtest.skip_row(u["unit"], "", "the load stage failed on this unit"),
                                               "findings_json": json.dumps([f.to_dict()])}]))
    tables.write("load", rows, out)
    return rows


def stage_structure(inv: dict, part: str, cfg: dict, scan_path: str, tensors_path: str, out: str,
                    target_path: str | None = None) -> List[dict]:
    from . import structure, tables, target

    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    tens = _by_unit(tables.read_rows(tensors_path))
    if target_path:
        with open(target_path) as f:
            reference = json.load(f).get("weights")
    else:
        reference = target.build(cfg).get("weights")
    return _per_scanned_unit("structure", inv, part, scans, out, lambda u: structure.analyse_unit(
        u, scans[u["unit"]], tens.get(u["unit"], []), cfg, reference))


def stage_configdiff(inv: dict, part: str, cfg: dict, scan_path: str, out: str) -> List[dict]:
    from . import configdiff, tables

    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    rows: List[dict] = []
    for u in part_units(inv, part):
        if u["unit"] in scans:
            rows.extend(liveness.guard("configdiff", u, lambda: configdiff.diff_unit(u, scans[u["unit"]], cfg),
                                       lambda f: [{**_error_row(u, f), "source": "", "key": ""}]))
    tables.write("configdiff", rows, out)
    return rows


def stage_state(inv: dict, part: str, cfg: dict, scan_path: str, tensors_path: str, out: str) -> List[dict]:
    from . import state, tables

    scans = {r["unit"]: r for r in tables.read_rows(scan_path)}
    tens = _by_unit(tables.read_rows(tensors_path))
    run_dir = _run_dir(inv, cfg)
    return _per_scanned_unit("state", inv, part, scans, out, lambda u: state.analyse_unit(
        u, scans[u["unit"]], tens.get(u["unit"], []), run_dir, cfg))


def _per_scanned_unit(stage: str, inv: dict, part: str, scans: Dict[str, dict], out: str,
                      analyse: Callable[[dict], dict]) -> List[dict]:
    """One row per unit of ``part`` that has a scan row: ``analyse(unit)``, or an ``audit_error`` row when it
    raises; written as table ``stage``."""
    from . import tables

    rows = [liveness.guard(stage, u, lambda: analyse(u), lambda f: _error_row(u, f))
            for u in part_units(inv, part) if u["unit"] in scans]
    tables.write(stage, rows, out)
    return rows


#: each rule's arguments: (flag, required, help); the positional sub-command is the rule's name
_ARGS = {
    "inventory": [("--run-dir", True, "run folder or s3://bucket/prefix"), ("--units-per-job", False, "auto or N"),
                  ("--out", True, "inventory.parquet"), ("--out-json", True, "inventory.json"),
                  ("--out-pointers", True, "pointers.parquet")],
    "hash": [("--inventory", True, "inventory.json"), ("--part", True, "part id (p0000…)"),
             ("--out", True, "hash table")],
    "scan": [("--inventory", True, "inventory.json"), ("--part", True, "part id"), ("--config", True, "config.json"),
             ("--out", True, "scan table"), ("--out-tensors", True, "tensors table"),
             ("--out-imports", True, "imports table")],
    "load": [("--inventory", True, "inventory.json"), ("--part", True, "part id"), ("--config", True, "config.json"),
             ("--scan", True, "scan table"), ("--hash", True, "hash table"), ("--out", True, "load table")],
    "structure": [("--inventory", True, "inventory.json"), ("--part", True, "part id"),
                  ("--config", True, "config.json"), ("--scan", True, "scan table"),
                  ("--tensors", True, "tensors table"), ("--target", False, "target.json (else built from config)"),
                  ("--out", True, "structure table")],
    "configdiff": [("--inventory", True, "inventory.json"), ("--part", True, "part id"),
                   ("--config", True, "config.json"), ("--scan", True, "scan table"), ("--out", True, "configdiff table")],
    "state": [("--inventory", True, "inventory.json"), ("--part", True, "part id"), ("--config", True, "config.json"),
              ("--scan", True, "scan table"), ("--tensors", True, "tensors table"), ("--out", True, "state table")],
}


def parser() -> argparse.ArgumentParser:
    """``python -m ckptaudit.stages RULE --flag …``: one sub-command per rule, each with its required arguments
    (a missing ``--part`` is a usage error naming it, not a failure deep inside the stage)."""
    ap = argparse.ArgumentParser(prog="python -m ckptaudit.stages", description="One stage of the audit workflow.")
    sub = ap.add_subparsers(dest="stage", required=True, metavar="RULE")
    for rule, args in _ARGS.items():
        sp = sub.add_parser(rule, help=f"the {rule} rule")
        for flag, required, help_ in args:
            sp.add_argument(flag, required=required, help=help_, **({"default": "auto"} if flag == "--units-per-job" else {}))
    return ap


def main(argv=None) -> int:
    from .tables import without_pandas

    without_pandas()
    a = parser().parse_args(argv)
    if a.stage == "inventory":
        from .run_folder import require_units  # an empty or checkpoint-less folder: exit 3, naming what was ignored

        require_units(stage_inventory(a.run_dir, a.units_per_job, a.out, a.out_json, a.out_pointers))
        return 0
    inv = _inventory(a.inventory)
    if a.stage == "hash":
        stage_hash(inv, a.part, a.out)
        return 0
    cfg = _config(a.config)
    if a.stage == "scan":
        stage_scan(inv, a.part, cfg, a.out, a.out_tensors, a.out_imports)
    elif a.stage == "load":
        stage_load(inv, a.part, cfg, a.scan, a.hash, a.out)
    elif a.stage == "structure":
        stage_structure(inv, a.part, cfg, a.scan, a.tensors, a.out, a.target)
    elif a.stage == "configdiff":
        stage_configdiff(inv, a.part, cfg, a.scan, a.out)
    else:
        stage_state(inv, a.part, cfg, a.scan, a.tensors, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
