"""The audit's stages run in one process, in workflow order, without Snakemake.

Same stage functions as the rules call (:mod:`ckptaudit.stages`), for library
use (:func:`ckptaudit.safe_load_checkpoint` uses the file layer; tests audit
every case folder with it).  The command line and ``snakemake … audit`` run
the Snakemake workflow instead.

:func:`check_config` (the one config check of every entry point) lives in
:mod:`ckptaudit.config` and is re-exported here.  This module imports nothing heavy at import time.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

from .config import SCHEMA_PATH, non_finite, check_config, config_problems  # noqa: F401 - re-exported
from .stages.inventory.run_folder import check_one_run, check_run_dir  # noqa: F401 - check_run_dir re-exported


def check_out_dir(run_dir: str | Path, out_dir: str | Path, state_dir: Optional[str | Path] = None) -> None:
    """Raise ``ValueError`` when ``out_dir`` is the local run folder or inside it.

    The audit writes its tables, logs and report into ``out_dir``, and Snakemake its ``.snakemake/`` into
    ``state_dir`` (``ckptaudit audit``: ``out_dir`` itself, the default; plain ``snakemake``: its working
    directory); inside the run folder that changes what is audited (and the next audit sees its own
    outputs).  The message names only what would really land in the run.  Both paths are resolved
    (symlinks followed) first; ``s3://`` runs are not checked."""
    if "://" in str(run_dir):
        return
    rd, out = Path(run_dir).resolve(), Path(out_dir).resolve()
    if out == rd or rd in out.parents:
        state = Path(state_dir).resolve() if state_dir is not None else out
        what = ".snakemake/ and its tables" if state == rd or rd in state.parents else "its tables, logs and report"
        raise ValueError(f"output folder {out} is inside the run folder {rd}; the audit would write {what} "
                         "into what it audits; choose an output folder outside the run")


#: the keys of the config that the stages read (the rest are the workflow's: run_dir, out_dir, demo, drill, …)
STAGE_KEYS = ("expected_model_args", "model_factory", "reference", "target", "load", "security", "state",
              "run_name", "s3")


def default_config() -> dict:
    """Stage config with the defaults of config/config.yaml (:func:`ckptaudit.config.defaults`, the one source)."""
    from .config import defaults

    d = defaults()
    return {k: d[k] for k in STAGE_KEYS}


def merged_config(cfg: Optional[dict]) -> dict:
    """The stage config: ``cfg`` (keys of ``config/config.yaml``; a dict value merges into the default's)
    over :func:`default_config`, checked by :func:`check_config` (``ValueError`` naming the key and bound)."""
    c = default_config()
    for k, v in (cfg or {}).items():
        c[k] = {**c[k], **v} if isinstance(v, dict) and isinstance(c.get(k), dict) else v
    check_config(c)
    return c


def audit_in_process(run_dir: str | Path, cfg: Optional[dict] = None, out_dir: Optional[str | Path] = None,
                     depth=None) -> dict:
    """Audit ``run_dir``; return the verdict dict (also written to ``out_dir``).  ``depth``: the file layer's
    :class:`ckptaudit.fs.read_depth.ReadDepth` (default ``FULL``; ``ckptaudit seal`` passes ``SEAL``).

    One :class:`ckptaudit.stages.context.StageContext` is built after the inventory; each part's stages run in
    :data:`ckptaudit.stages.STAGES` order, each handing its rows to the next in memory.  The tables are written
    once, under ``out_dir/tables/``, for the report, and never read back.

    Raises ``FileNotFoundError``/``NotADirectoryError`` for a missing run folder and
    ``ValueError`` (naming the key and the bound, :func:`check_config`) for a config
    outside ``config/schema.yaml``, and for a folder holding several runs
    (:func:`ckptaudit.stages.inventory.run_folder.check_one_run`).
    """
    import json

    from . import fs, tables
    from .stages import cli as stages
    from .stages import configdiff, hash as hashing, load, report, scan, state, structure, target
    from .stages.context import Part, StageContext
    from .stages.rows import EarlierRows, records
    from .fs import read_depth
    from .stages.work_paths import write_bytes_at

    c = merged_config(cfg)
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ckptaudit-")
        out_dir = tmp.name
    out = Path(out_dir)
    work = out / "work"
    tdir = out / "tables"
    if fs.is_remote(run_dir):
        fs.configure(c.get("s3"))
    try:
        inv = stages.stage_inventory(str(run_dir), "auto", str(tdir / "inventory.parquet"),
                                     str(work / "inventory.json"), str(work / "pointers.parquet"))
        check_one_run(inv)
        (work / "config.json").write_text(json.dumps(c))
        built = target.write(c, str(work / "target.json"))  # the target rule's document (work/target.json)
        ctx = StageContext(fs.path(inv["run_dir"]), inv, c, depth or read_depth.FULL, built, work)
        rows = {t: [] for t in report.STAGES if t not in report.ROW_PER_TENSOR}  # each table's rows, in stage order
        imports: list = []
        with tables.BatchWriter("tensors", tdir / "tensors.parquet") as tensors:
            for name in sorted(inv["parts"]):
                part = Part(name, tuple(stages.part_units(inv, name)))
                before = fs.stage_bytes()
                h = hashing.run(ctx, part, EarlierRows())
                stages.write_facts(h, work / "bytefacts" / f"{name}.parquet")
                write_bytes_at(work, "hash", name, before)
                before = fs.stage_bytes()
                s = scan.run(ctx, part, EarlierRows(hash=h))
                write_bytes_at(work, "scan", name, before)
                before = fs.stage_bytes()
                ld = load.run(ctx, part, EarlierRows(hash=h, scan=s))
                write_bytes_at(work, "load", name, before, loadtest_bytes=ld.loadtest_bytes, served_files=0)
                st = structure.run(ctx, part, EarlierRows(scan=s))
                cd = configdiff.run(ctx, part, EarlierRows(scan=s))
                before = fs.stage_bytes()
                sr = state.run(ctx, part, EarlierRows(hash=h, scan=s))
                write_bytes_at(work, "state", name, before)
                for t, got in (("hash", records(h.rows)), ("scan", [dict(x.row) for x in s.scans]),
                               ("load", records(ld.rows)), ("structure", records(st.rows)),
                               ("configdiff", records(cd.rows)), ("state", records(sr.rows))):
                    rows[t].extend(got)
                tensors.write(s.tensors)
                imports.extend(records(s.imports))
                del h, s
        tables.write("imports", imports, tdir / "imports.parquet")
        all_tables = {}
        for t, got in rows.items():  # each table as its Parquet file holds it, every column of its schema
            written = tables.table(t, got)
            tables.write_table(t, written, tdir / f"{t}.parquet")
            all_tables[t] = tables.rows_of(written)
        return report.write_report(ctx, all_tables, str(out))
    finally:
        if tmp is not None:
            tmp.cleanup()
