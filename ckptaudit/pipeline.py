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
    """Audit ``run_dir``; return the verdict dict (also written to ``out_dir``).  ``depth``: the hash stage's
    :class:`ckptaudit.fs.read_depth.ReadDepth` (default ``FULL``; ``ckptaudit seal`` passes ``SEAL``).

    Raises ``FileNotFoundError``/``NotADirectoryError`` for a missing run folder and
    ``ValueError`` (naming the key and the bound, :func:`check_config`) for a config
    outside ``config/schema.yaml``, and for a folder holding several runs
    (:func:`ckptaudit.stages.inventory.run_folder.check_one_run`).
    """
    import json

    from . import fs
    from .stages import cli as stages
    from .stages import report

    c = merged_config(cfg)
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ckptaudit-")
        out_dir = tmp.name
    out = Path(out_dir)
    work = out / "work"
    parts_dir = out / "tables" / "parts"
    if fs.is_remote(run_dir):
        fs.configure(c.get("s3"))
    try:
        inv = stages.stage_inventory(str(run_dir), "auto", str(out / "tables" / "inventory.parquet"),
                                     str(work / "inventory.json"), str(work / "pointers.parquet"))
        check_one_run(inv)
        (work / "config.json").write_text(json.dumps(c))
        from .stages import target

        target.write(c, str(work / "target.json"))
        tables = [t for ts in stages.TABLES.values() for t in ts]  # in stage order (stages.STAGES)
        paths = {t: [] for t in tables}
        for part in sorted(inv["parts"]):
            p = {t: str(parts_dir / t / f"{part}.parquet") for t in tables}
            stages.stage_hash(inv, part, p["hash"], **({} if depth is None else {"depth": depth}))
            stages.stage_scan(inv, part, c, p["scan"], p["tensors"], p["imports"])
            stages.stage_load(inv, part, c, p["scan"], p["load"])
            stages.stage_structure(inv, part, c, p["scan"], p["tensors"], p["structure"],
                                   str(work / "target.json"))
            stages.stage_configdiff(inv, part, c, p["scan"], p["configdiff"])
            stages.stage_state(inv, part, c, p["scan"], p["tensors"], p["state"])
            for s in tables:
                paths[s].append(p[s])
        return report.run_report(str(work / "inventory.json"), paths, c, str(out))
    finally:
        if tmp is not None:
            tmp.cleanup()
