"""Plain functions behind the Snakefile's input functions (testable without
Snakemake).  Imports nothing heavy."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, List, Optional

from .. import fs
from ..stages import job_args
from .._io import atomic_write
from ..stages.inventory.parts import listing_fingerprint, part_units, read_inventory, read_inventory_cached  # noqa: F401

STAGE_KEYS = ("expected_model_args", "model_factory", "reference", "target", "load", "security", "state",
              "run_name", "s3")


def configure_storage(config: dict) -> None:
    """Apply the config's ``s3:`` block (endpoint, profile, anon; never keys) to this process
    and, through ``CKPTAUDIT_S3_*`` environment variables, to the jobs it starts."""
    fs.configure(config.get("s3"))


def rule_python(deployment_settings: Any, executable: Optional[str] = None) -> str:
    """The interpreter every rule's shell command runs (``PYTHON`` in rules/common.smk).

    ``deployment_settings`` is Snakemake's ``workflow.deployment_settings`` (None when Snakemake gives
    none).  When Snakemake deploys conda envs (``--use-conda``, i.e. ``--software-deployment-method
    conda``), each job runs inside the rule's ``conda:`` env (rules/envs/ckptaudit.yaml, which installs this
    checkout), so it is that env's ``python``; otherwise it is ``executable`` (default: the interpreter
    Snakemake runs in, which has ckptaudit installed)."""
    methods = getattr(deployment_settings, "deployment_method", None) or ()
    if any(getattr(m, "name", str(m)).lower() == "conda" for m in methods):  # DeploymentMethod.CONDA
        return "python"
    return executable or sys.executable


def run_name(run_dir: str) -> str:
    """A run's name in the report: the run folder's base name."""
    name = Path(str(run_dir).rstrip("/")).name
    return name or "run"


def report_folder(run_dir: str, configured_name: str = "") -> str:
    """The folder under ``reports/`` of a run's audit when no ``out_dir`` is given: the configured
    ``run_name`` as it is, else the run folder's base name and 8 hex digits of the SHA-256 of its absolute
    path (an ``s3://`` URL as written), so that ``A/run`` and ``B/run``, or a local run and an S3 one of the
    same name, never share a report (``demo_run-1f0c9a2e``)."""
    if configured_name:
        return configured_name
    where = str(run_dir).rstrip("/") if fs.is_remote(run_dir) else str(Path(run_dir).resolve())
    return f"{run_name(run_dir)}-{hashlib.sha256(where.encode()).hexdigest()[:8]}"


def stage_config(config: dict, run_dir: str, name: str) -> dict:
    """The part of the audit config the stages read (written to work/config.json)."""
    out = {k: config.get(k) for k in STAGE_KEYS}
    out["run_dir"] = run_dir
    if fs.is_remote(run_dir):  # endpoint/profile for this process and the jobs it starts (no keys)
        fs.configure(config.get("s3"))
    out["run_name"] = name
    return out


def part_files(inv: dict, part: str) -> List[str]:
    """The run's files that a part's jobs read (Snakemake inputs: a changed file
    re-runs its part).  None for an ``s3://`` run: objects are not local files, so
    :func:`part_signature` carries their sizes and ETags instead."""
    root = inv["run_dir"]
    if fs.is_remote(root):
        return []
    out: List[str] = []
    for u in part_units(inv, part):
        out.extend(os.path.join(root, f) for f in u["files"])
        out.extend(os.path.join(root, f) for f in u.get("sidecars", []))
        if u.get("manifest"):
            out.append(os.path.join(root, u["manifest"]))
    return out


def part_signature(inv: dict, part: str, reverify: Optional[str] = None) -> str:
    """What a part holds, as a Snakemake param (a change re-runs only this part).

    Per unit: its name, files, sizes and newest mtime (from the inventory); for ``s3://`` runs also each
    object's size and ETag.  ``reverify`` (this audit's id, :func:`ckptaudit.verification.reverify.audit_id`; the default
    ``reuse: false``) is part of it, so every audit re-runs every part.  ``reverify`` None (``reuse: true``):
    instead each local file's, sidecar's and manifest's stat key (size, mtime, ctime, inode, device;
    :func:`ckptaudit.verification.reverify.stat_key`), so a file rewritten with its size and mtime put back is redone.
    The part jobs do not list the run's files as inputs: Snakemake would ``stat`` every one of them in every
    scheduling round (docs/benchmarks-history.md, "1,000 small units"), while the inventory already recorded
    them.
    """
    from ..verification.reverify import stat_key

    osd = inv.get("object_store") or {}
    root = inv["run_dir"]
    rows: List[Any] = [["audit", reverify]] if reverify else []
    for u in part_units(inv, part):
        extra = []
        if not reverify and not fs.is_remote(root):
            for f in list(u["files"]) + list(u.get("sidecars", [])) + ([u["manifest"]] if u.get("manifest") else []):
                extra.append([f, stat_key(os.path.join(root, f))])
        rows.append([u["unit"], u["files"], u.get("size_bytes"), u.get("mtime_ns"), extra]
                    + ([osd[u["unit"]]] if u["unit"] in osd else []))
    return json.dumps(rows, sort_keys=True)


def write_config(doc_json: str, out: str) -> None:
    """Write the stage config ``doc_json`` (JSON text) to ``out``, indented and key-sorted, atomically."""
    doc = json.loads(doc_json)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(doc, indent=1, sort_keys=True).encode())


def parser() -> argparse.ArgumentParser:
    """``python -m ckptaudit.workflow.support write-config JSON OUT`` (the config rule): both arguments required."""
    return job_args.parser("python -m ckptaudit.workflow.support", "The workflow's helpers that run as a job.", {
        "write-config": ("write work/config.json (the part of the config the stages read)",
                         [("JSON", "the stage config as JSON text"), ("OUT", "where config.json goes")]),
    })


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    write_config(a.json, a.out)  # the only command
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
