"""Folder units written by ``ckptaudit.publish(folder=True)``: the manifest says what each file is.

A publish folder (``checkpoint-<step>/`` by default, or any ``name=``) holds the writer's files,
their ``.sha256`` sidecars, ``manifest.json`` (``ckptaudit.manifest/2`` or ``/1``, whose first bytes name the
schema) and the ``COMPLETE`` marker (docs/publish-protocol.md).  Each manifest entry may declare the
file's ``role`` (``weights``, ``optimizer``, ``mixed``…, written by ``Publication.save``), so the
weights are found in ``model.pt`` as in ``pytorch_model.bin``.  A file the manifest gives no role
(``pub.open``, ``pub.path``, a manifest of an older version) is given one by its structure, from the
scan tree (:mod:`ckptaudit.recognise`), never by its name.

A folder that also holds a framework's own layout (a Trainer's ``trainer_state.json``, DCP
``.metadata``, DeepSpeed ``*_model_states.pt``, Megatron ``mp_rank_*``, accelerate
``random_states_*.pkl``) is left to that framework's adapter, which knows how its resume reads it.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path
from typing import Any, Dict

from .. import confine, fs, producers
from .adapter import folder_names
from .base import UnitScan, scan_file

#: names that make a publish folder a framework's own layout (its adapter claims it)
FRAMEWORK_NAMES = producers.CLAIM_FILES
#: files read by people, not by a resume (kept out of the scan, like a Trainer's README)
TEXT_SUFFIXES = (".json", ".txt", ".md", ".yaml", ".yml")
_KINDS_ROLE = {"weights": "weights", "optimizer": "optimizer", "zero": "optimizer", "scheduler": "scheduler",
               "scaler": "scaler", "rng": "rng"}


def is_ours(manifest: Path) -> bool:
    """True when ``manifest`` is a ckptaudit manifest (its schema is in the first 64 bytes).  One that resolves
    outside its folder (:func:`ckptaudit.confine.resolved_outside`) or is not a regular file (a FIFO, a device)
    is never opened: the inventory names it (``path_outside_run``, ``not_a_regular_file``)."""
    if confine.resolved_outside(manifest.parent, manifest.name):
        return False
    try:
        if not fs.is_remote(manifest) and not stat.S_ISREG(os.stat(manifest).st_mode):
            return False
        with fs.open_binary(manifest) as fh:
            return b'"ckptaudit.manifest/' in fh.read(64)
    except OSError:
        return False


def content_role(node: Any) -> str:
    """A file's role from its scan tree: the one kind of component it holds, else ``mixed``."""
    from .. import recognise as R

    if node is None:
        return "mixed"
    kinds = {n.kind for n in R.find({"f": node}).nodes}
    roles = {_KINDS_ROLE.get(k, "mixed") for k in kinds}
    return roles.pop() if len(roles) == 1 else "mixed"


def declared_roles(run_dir: Path, unit: dict, kept=None) -> Dict[str, str]:
    """{run-relative file: role} as the unit's manifest declares them ({} without a manifest; ``kept``: bytes of
    remote objects already read, :class:`ckptaudit.fs.kept.KeptBytes`, answered from memory)."""
    from ..formats.manifest_entries import load_manifest

    if not unit.get("manifest"):
        return {}
    base = (Path(unit["manifest"]).parent).as_posix()
    out = {}
    for inner, entry in load_manifest(run_dir / unit["manifest"], kept).items():
        role = entry.get("role") if isinstance(entry, dict) else None
        if isinstance(role, str) and role:
            out[f"{base}/{inner}" if base not in ("", ".") else inner] = role
    return out


class Published:
    name = "ckptaudit-publish"

    def claim_dir(self, path: Path) -> bool:
        names = folder_names(path) or []
        if "manifest.json" not in names:
            return False
        if any(fnmatch.fnmatch(n, p) for n in names for p in FRAMEWORK_NAMES):
            return False
        return is_ours(path / "manifest.json")

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        declared = declared_roles(run_dir, unit, None if byte_facts is None else byte_facts.kept)
        hints: Dict[str, str] = {}
        prefix = unit["unit"].rstrip("/") + "/"
        for f in unit["files"]:
            inner = f[len(prefix):] if f.startswith(prefix) else f
            if inner.endswith(TEXT_SUFFIXES):
                hints[f] = declared.get(f) or "metadata"
                continue
            scan_file(run_dir, f, unit["unit"], scan, cfg, tree_key=inner, byte_facts=byte_facts)
            hints[f] = declared.get(f) or content_role(scan.tree.get(inner))
        scan.facts["role_hints"] = hints
        scan.facts["weights_files"] = sorted(f[len(prefix):] for f, r in hints.items() if r == "weights")
        return scan


ADAPTER = Published()
