"""The audit's stages run in one process, in workflow order, without Snakemake.

Same stage functions as the rules call (:mod:`ckptaudit.stages`), for library
use (:func:`ckptaudit.safe_load_checkpoint` uses the file layer; tests audit
every case folder with it).  The command line and ``snakemake … audit`` run
the Snakemake workflow instead.

:func:`check_config` is the one config check of every entry point (the
command line, ``rules/common.smk`` under ``snakemake --config``, and
:func:`audit_in_process`): ``config/schema.yaml`` (types and bounds) plus
finiteness, which JSON Schema cannot say (NaN compares false with every bound).
This module imports nothing heavy at import time.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "config" / "schema.yaml"


def check_config(cfg: dict, schema_path: str | Path | None = None) -> None:
    """Raise ``ValueError`` naming the key and the bound when ``cfg`` breaks the schema.

    ``cfg`` may be partial (keys missing from it are not checked); every number in it
    must be finite (``.inf``/``.nan`` are refused anywhere, also under
    ``expected_model_args``) and within ``config/schema.yaml``'s bounds, e.g.
    ``load.timeout_seconds: nan is not finite`` or
    ``load.memory_limit_mib: 10000000000000.0 is greater than the maximum of 1048576``.
    Only the first problem in key order is raised (one line).
    """
    problems = config_problems(cfg, schema_path)
    if problems:
        raise ValueError(f"invalid config: {problems[0]}")


def config_problems(cfg: dict, schema_path: str | Path | None = None) -> List[str]:
    """Every ``"key.path: what is wrong"`` of ``cfg`` (empty when it is valid), sorted by key."""
    import jsonschema
    import yaml

    out = [f"{key}: {value!r} is not finite (NaN and infinities are refused)"
           for key, value in _non_finite(cfg, "")]
    if out:
        return out
    path = Path(schema_path) if schema_path else SCHEMA_PATH
    if not path.is_file():  # an install without the workflow files: finiteness is all we can check
        return []
    schema = yaml.safe_load(path.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for e in sorted(validator.iter_errors(cfg), key=lambda e: [str(p) for p in e.absolute_path]):
        key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        msg = " ".join(e.message.split())  # one line, whatever the offending value holds
        out.append(f"{key}: {msg[:300] + '…' if len(msg) > 300 else msg}")
    return out


def check_out_dir(run_dir: str | Path, out_dir: str | Path) -> None:
    """Raise ``ValueError`` when ``out_dir`` is the local run folder or inside it.

    The audit writes ``.snakemake/``, its tables and logs into ``out_dir``; inside the run
    folder that changes what is audited (and the next audit sees its own outputs).  Both
    paths are resolved (symlinks followed) first; ``s3://`` runs are not checked."""
    if "://" in str(run_dir):
        return
    rd, out = Path(run_dir).resolve(), Path(out_dir).resolve()
    if out == rd or rd in out.parents:
        raise ValueError(f"output folder {out} is inside the run folder {rd}; the audit would write .snakemake/ "
                         "and its tables into what it audits; choose an output folder outside the run")


def _non_finite(v, key: str) -> Iterator[Tuple[str, float]]:
    if isinstance(v, float) and not math.isfinite(v):
        yield key or "(top level)", v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _non_finite(x, f"{key}.{k}" if key else str(k))
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from _non_finite(x, f"{key}[{i}]")


def default_config() -> dict:
    """Stage config with the defaults of config/config.yaml (no file needed)."""
    return {
        "expected_model_args": {}, "model_factory": "", "reference": "",
        "target": {"world_size": None, "zero_stage": None, "tensor_parallel": None, "pipeline_parallel": None,
                   "torch_version": ""},
        "load": {"enabled": True, "timeout_seconds": 120, "memory_limit_mib": 8192},
        "security": {"allow_globals": []},
        "state": {"nan_scan": True, "chunk_mib": 16, "norm_jump_ratio": 10.0},
        "run_name": "",
        "s3": {"endpoint_url": "", "profile": "", "anon": False, "download_limit_mib": 4096},
    }


def audit_in_process(run_dir: str | Path, cfg: Optional[dict] = None, out_dir: Optional[str | Path] = None) -> dict:
    """Audit ``run_dir``; return the verdict dict (also written to ``out_dir``).

    Raises ``FileNotFoundError``/``NotADirectoryError`` for a missing run folder and
    ``ValueError`` (naming the key and the bound, :func:`check_config`) for a config
    outside ``config/schema.yaml``.
    """
    import json

    from . import fs, report, stages

    c = default_config()
    for k, v in (cfg or {}).items():
        c[k] = {**c[k], **v} if isinstance(v, dict) and isinstance(c.get(k), dict) else v
    check_config(c)
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
        (work / "config.json").write_text(json.dumps(c))
        from . import target

        target.write(c, str(work / "target.json"))
        paths = {s: [] for s in report.STAGES}
        for part in sorted(inv["parts"]):
            p = {s: str(parts_dir / s / f"{part}.parquet") for s in report.STAGES}
            stages.stage_hash(inv, part, p["hash"])
            stages.stage_scan(inv, part, c, p["scan"], p["tensors"], p["imports"])
            stages.stage_load(inv, part, c, p["scan"], p["hash"], p["load"])
            stages.stage_configdiff(inv, part, c, p["scan"], p["configdiff"])
            stages.stage_structure(inv, part, c, p["scan"], p["tensors"], p["structure"],
                                   str(work / "target.json"))
            stages.stage_state(inv, part, c, p["scan"], p["tensors"], p["state"])
            for s in report.STAGES:
                paths[s].append(p[s])
        return report.run_report(str(work / "inventory.json"), paths, c, str(out))
    finally:
        if tmp is not None:
            tmp.cleanup()
