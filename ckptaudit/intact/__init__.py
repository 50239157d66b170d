"""Which tensors of a checkpoint unit are proven intact: the proofs behind ``ckptaudit salvage`` and the
verdict's salvage offer.

:func:`unit_tensors` names every tensor of a file or folder unit without unpickling anything (a torch zip's
data.pkl and a DCP ``.metadata`` by the static walk, a safetensors header as JSON) and gives each a status:
``intact`` when records made at save time check its bytes and the bytes that name it (the zip record's CRC-32,
a ckptaudit manifest's chunk digests, a whole-file SHA-256 of a manifest entry, ``.sha256`` sidecar or
``integrity.json``: :func:`file_proof`), ``lost`` when its bytes are missing or they or its identity are
proven changed, ``unproven`` when they are there and nothing checks them, ``suspect`` when, unchecked, they
hold an all-zero page (:mod:`.proof`).  One
module per format (:mod:`.torch_zip`, :mod:`.safetensors_file`, :mod:`.dcp`); the files a folder's layout
expects and lacks come from the audit's own scan (:mod:`.missing`).  Reads only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..formats.sniff import sniff
from ..formats.manifest_entries import load_manifest
from . import dcp, safetensors_file, torch_zip
from .missing import missing_files
from .proof import (FILLED, INTACT, LOST, PROOFS, SAFETENSORS_DTYPE, SUSPECT, UNPROVEN, TensorBytes, counts,
                    file_proof, integrity_digests, is_optimizer_state, regular_file)

__all__ = ["unit_tensors", "unit_files", "file_proof", "TensorBytes", "counts", "INTACT", "LOST", "UNPROVEN", "SUSPECT",
           "FILLED", "PROOFS", "SAFETENSORS_DTYPE", "is_optimizer_state", "first_component", "regular_file"]

#: names inside a unit that are not data: sidecars, manifests, markers, text
_NOT_DATA = (".sha256", ".sha256sum", ".manifest.json", ".json", ".txt", ".md", ".yaml", ".yml")


def unit_files(unit: Path, skipped: Optional[List[Tuple[str, str]]] = None
               ) -> Tuple[List[Tuple[str, Path]], Dict[str, dict]]:
    """``([(name in the unit, path)], {name: manifest entry})`` of a file or folder unit's data files.  Inside a
    folder, a symbolic link or anything that is no regular file is never opened (a link may lead out of the
    run: the trust boundary the audit keeps, :mod:`ckptaudit.confine`); each is appended to ``skipped`` as
    ``(name, why)``.  Folders are walked without following links."""
    if unit.is_file():
        return [(unit.name, unit)], load_manifest(unit.with_name(unit.name + ".manifest.json"))
    out = []
    for dirpath, dirnames, names in os.walk(unit):
        dirnames.sort()
        for n in sorted(names):
            p = Path(dirpath) / n
            if n.endswith(_NOT_DATA) or n in ("COMPLETE", "latest") or n.startswith(".ckptaudit-tmp-"):
                continue
            rel = p.relative_to(unit).as_posix()
            if not regular_file(p):
                if skipped is not None:
                    skipped.append((rel, "a symbolic link or no regular file: never opened (it may lead out of "
                                         "the run)"))
                continue
            out.append((rel, p))
    return out, load_manifest(unit / "manifest.json")


def unit_tensors(unit: str | os.PathLike, run_dir: Optional[str | os.PathLike] = None
                 ) -> Tuple[List[TensorBytes], List[dict]]:
    """``(tensors, files)``: every tensor the data files of ``unit`` name, with its status and proof, and
    per file ``{"file", "kind", "problem", "counts"}`` (files the manifest lists, or the unit's layout expects,
    that are gone included).  ``run_dir``: the run folder (default: the unit's parent), whose inventory tells
    the layout of a folder unit.  Raises ``FileNotFoundError`` when ``unit`` does not exist."""
    from ..config import defaults

    root = Path(unit)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such file or folder")
    cfg = defaults()
    out: List[TensorBytes] = []
    rows: List[dict] = []
    gone: List[Tuple[str, str]] = []
    if root.is_dir():
        gone = missing_files(Path(run_dir) if run_dir else root.parent, root, cfg)
    if root.is_dir() and dcp.is_dcp(root):
        ts, problem, n_items = dcp.tensors(root, cfg)
        rows.append({"file": dcp.FILE, "kind": "dcp", "problem": problem, "counts": counts(ts),
                     "non_tensor_items": n_items, "weights_prefix": first_component(ts)})
        rows += [{"file": f, "kind": "missing", "problem": why, "counts": counts([])} for f, why in gone]
        return ts, rows
    skipped: List[Tuple[str, str]] = []
    files, manifest = unit_files(root, skipped)
    rows += [{"file": f, "kind": "not read", "problem": why, "counts": counts([])} for f, why in skipped]
    sealed = integrity_digests(root) if root.is_dir() else {}
    for name, path in files:
        kind = sniff(path).kind
        proof = file_proof(path, manifest.get(name), sealed.get(name))
        prefix, step = "", None
        if kind == "torch_zip":
            ts, problem, prefix, step = torch_zip.tensors(str(path), name, proof)
        elif kind == "safetensors" or path.suffix == ".safetensors":
            ts, problem = safetensors_file.tensors(str(path), name, proof)
        else:
            rows.append({"file": name, "kind": kind, "problem": f"not tensor data salvage reads ({kind})",
                         "counts": counts([])})
            continue
        out.extend(ts)
        rows.append({"file": name, "kind": kind, "problem": problem, "counts": counts(ts), "weights_prefix": prefix,
                     "step": step})
    present = {n for n, _ in files} | {n for n, _ in skipped}
    for name, e in sorted(manifest.items()):
        if name not in present and not (root if root.is_dir() else root.parent).joinpath(name).exists():
            rows.append({"file": name, "kind": "missing", "counts": counts([]),
                         "problem": f"listed in the manifest ({e.get('size_bytes')} bytes) but not in the unit: "
                                    "every tensor it held is lost"})
            present.add(name)
    rows += [{"file": f, "kind": "missing", "problem": why, "counts": counts([])} for f, why in gone
             if f not in present]
    return out, rows


def first_component(tensors: List[TensorBytes]) -> str:
    """The first dotted component under which most non-optimizer tensor bytes lie (DCP's ``model`` of
    ``model.fc.weight``: its fqns are the saved dict's keys joined), or "" when the names have none."""
    by: Dict[str, int] = {}
    for t in tensors:
        head, sep, _ = t.name.partition(".")
        if sep and not is_optimizer_state(t.name):
            by[head] = by.get(head, 0) + t.nbytes
    return max(by, key=by.get) if by else ""
