"""Seal: write sidecars and manifests for existing checkpoints that pass the audit, never touching data.

A ``torch_dist`` iteration folder (:func:`ckptaudit.formats.integrity_json.iteration_folder`) also gets Megatron-Core's
``integrity.json`` (its exact bytes, written atomically: :func:`ckptaudit.formats.integrity_json.write_folder`), so
that stock Megatron-Core with ``--verify-integrity`` accepts a checkpoint sealed after the fact; one that is there
and disagrees with the bytes is evidence and is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .._version import __version__
from ..formats import integrity_json
from .clock import Clock
from .files import durable_write, fsync_dir
from .manifest import hash_file, manifest_bytes, sidecar_text
from .names import COMPLETE_MARKER, DEFAULT_CHUNK_BYTES, MANIFEST_NAME, RESERVED, SCHEMA, SIDECAR_SUFFIX, TMP_PREFIX


@dataclass
class SealOutcome:
    """What :func:`seal` did with one unit: ``action`` is ``sealed``, ``already sealed`` or
    ``refused``; ``written`` lists the paths it created (relative to the run folder)."""

    unit: str
    action: str
    reason: str
    written: List[str] = field(default_factory=list)


def seal(run_dir: str | os.PathLike, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, cfg: Optional[dict] = None,
         dry_run: bool = False) -> List[SealOutcome]:
    """Write sidecars and manifests for existing checkpoints of ``run_dir`` that pass the audit.

    Runs the whole audit in this process (:func:`ckptaudit.pipeline.audit_in_process`,
    ``cfg`` as its config).  A unit with any error finding is refused with the findings as
    the reason; a unit whose bytes changed since the audit hashed them is refused.  For the
    others: a ``<file>.sha256`` for every file that has none (existing sidecars are never
    rewritten), then the manifest: ``<file>.manifest.json`` for a file unit; for a folder
    unit ``COMPLETE`` first and ``manifest.json`` last, so a crash mid-seal never makes a
    good folder look in progress.  Index units get sidecars only (the inventory reads no
    manifest for them).  A ``torch_dist`` iteration folder without ``integrity.json`` gets one first (listing its
    files as Megatron's save would: before any sidecar; then covered by the sidecars and manifest like any file),
    also when it was sealed before; its action then says so.  Data files are never opened for writing.  Raises
    ``FileNotFoundError``/``NotADirectoryError`` for a bad ``run_dir``.
    """
    root = Path(run_dir)
    out: List[SealOutcome] = []
    clock = Clock()
    verdict, inv, audited = _audit(root, cfg)
    units = {u["unit"]: u for u in inv["units"]}
    for vu in verdict["units"]:
        u = units.get(vu["unit"])
        if u is None:
            continue
        folder = u["kind"] == "folder"
        base = root / u["unit"] if folder else (root / u["unit"]).parent
        refused = _not_to_seal(vu, u, base)
        integrity = folder and integrity_json.iteration_folder(base) and not (base / integrity_json.NAME).exists()
        if refused is not None and not (refused.action == "already sealed" and integrity):
            out.append(refused)
            continue
        try:
            recs = _records(root, u, base, audited, chunk_bytes)
        except (OSError, ValueError) as e:
            out.append(SealOutcome(u["unit"], "refused", f"{type(e).__name__}: {e}"))
            continue
        if dry_run:
            out.append(SealOutcome(u["unit"], "sealed", "dry run: would write " + (
                f"{integrity_json.NAME}" if refused else "sidecars and a manifest" + (
                    f" (and {integrity_json.NAME} first)" if integrity else ""))))
            continue
        try:
            written = _write_integrity(root, u, base, recs, chunk_bytes, clock) if integrity else []
        except (OSError, integrity_json.IntegrityConflict) as e:
            out.append(SealOutcome(u["unit"], "refused", f"{type(e).__name__}: {e}"))
            continue
        if refused is not None:  # sealed before: the manifest stays as it was
            out.append(SealOutcome(u["unit"], "sealed", f"{refused.reason}; wrote {integrity_json.NAME}", written))
            continue
        written += _write_seal(root, u, vu.get("step"), base, recs, clock)
        out.append(SealOutcome(u["unit"], "sealed", "passes the audit" + (" (index unit: sidecars only)"
                                                                          if u["kind"] == "index" else ""), written))
    return out


def seal_folder(run_dir: str | os.PathLike, unit: str, step: Optional[int], *,
                chunk_bytes: int = DEFAULT_CHUNK_BYTES, sealed_by: str = "ckptaudit.publish.seal_folder") -> List[str]:
    """Seal one folder unit ``run_dir/unit`` that its writer has just finished, without an audit: a ``.sha256``
    sidecar for each file that has none, then ``COMPLETE`` and last ``manifest.json`` (the order of
    :func:`seal`), each written atomically and fsynced.  For a framework's own saves that the caller knows are
    complete (the HF Trainer's ``on_save``, after ``trainer_state.json``): from then on the audit and the reader
    check every file's bytes against these digests.  A ``torch_dist`` iteration folder without ``integrity.json``
    gets one first, as :func:`seal` writes it.  One read of every file of the unit (SHA-256 of the whole
    file and BLAKE3 of each ``chunk_bytes`` chunk).  Returns what was written, relative to ``run_dir``; ``[]``
    when the unit already has a manifest.  Raises ``FileNotFoundError`` when the folder is gone (rotated away
    meanwhile), ``OSError`` for one that cannot be read or written,
    :class:`~ckptaudit.formats.integrity_json.IntegrityConflict` for an ``integrity.json`` that appeared meanwhile
    and disagrees."""
    root = Path(run_dir)
    base = root / unit
    if not base.is_dir():
        raise FileNotFoundError(f"{base}: no such checkpoint folder")
    if (base / MANIFEST_NAME).exists():
        return []
    files, sidecars = [], []
    for dirpath, dirnames, names in os.walk(base):
        dirnames.sort()
        for n in sorted(names):
            rel = (Path(dirpath) / n).relative_to(root).as_posix()
            if n.endswith(SIDECAR_SUFFIX) or n.endswith(".sha256sum"):
                sidecars.append(rel)
            elif n not in RESERVED and not n.startswith(TMP_PREFIX) and (Path(dirpath) / n).is_file():
                files.append(rel)
    u = {"unit": unit, "kind": "folder", "files": files, "sidecars": sidecars}
    recs = _records(root, u, base, {}, chunk_bytes)
    clock = Clock()
    written = _write_integrity(root, u, base, recs, chunk_bytes, clock) if (
        integrity_json.iteration_folder(base) and not (base / integrity_json.NAME).exists()) else []
    return written + _write_seal(root, u, step, base, recs, clock, sealed_by)


def _audit(root: Path, cfg: Optional[dict]) -> Tuple[dict, dict, Dict[str, str]]:
    """(the verdict, the inventory, {file: SHA-256 the audit computed}) of an audit of ``root`` in this process,
    which computes the SHA-256 of every file (:data:`ckptaudit.fs.read_depth.SEAL`: the sidecars
    written here record it, and a file whose bytes changed since is refused)."""
    from .. import tables
    from ..fs.read_depth import SEAL
    from ..pipeline import audit_in_process

    with tempfile.TemporaryDirectory(prefix="ckptaudit-seal-") as td:
        verdict = audit_in_process(root, cfg, out_dir=td, depth=SEAL)
        inv = json.loads((Path(td) / "work" / "inventory.json").read_text())
        audited: Dict[str, str] = {}
        for p in sorted((Path(td) / "tables" / "parts" / "hash").glob("*.parquet")):
            for r in tables.read_rows(p):
                audited[r["file"]] = r["sha256_hex"]
    return verdict, inv, audited


def _not_to_seal(vu: dict, u: dict, base: Path) -> Optional[SealOutcome]:
    """Why verdict unit ``vu`` (inventory unit ``u``) is not sealed: an error finding, or a manifest already there.
    An ``integrity.json`` that disagrees with the bytes or is unusable says it is left as it is."""
    errs = [f for f in vu["findings"] if f["severity"] == "error"]
    if errs:
        why = "; ".join(f"{f['kind']}: {f['message']}" for f in errs[:3])
        more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
        kept = "" if not any(f["kind"].startswith("integrity_") for f in errs) else (
            f". Its {integrity_json.NAME} is not overwritten: it records what the save wrote and is the evidence that "
            "the bytes changed (or, unusable, that the save did not finish it); roll back, or restore the files")
        return SealOutcome(u["unit"], "refused", f"{len(errs)} error finding(s): {why}{more}".rstrip(".") + kept)
    folder = u["kind"] == "folder"
    if u["kind"] == "file" and u.get("manifest") or folder and u.get("manifest") and (base / COMPLETE_MARKER).exists():
        return SealOutcome(u["unit"], "already sealed", f"has {u['manifest']}")
    return None


def _records(root: Path, u: dict, base: Path, audited: Dict[str, str], chunk_bytes: int) -> list:
    """``[(file, FileRecord)]`` of the unit's files hashed again; raises ``ValueError`` for a file whose bytes
    changed since the audit hashed them, ``OSError`` for one that cannot be read."""
    recs = []
    for rel in u["files"]:
        r = hash_file(root / rel, Path(rel).relative_to(base.relative_to(root)).as_posix() if base != root else rel,
                      chunk_bytes)
        if audited.get(rel) and audited[rel] != r.sha256_hex:
            raise ValueError(f"{rel} changed since the audit hashed it ({audited[rel][:12]}… → {r.sha256_hex[:12]}…)")
        recs.append((rel, r))
    return recs


def _write_integrity(root: Path, u: dict, base: Path, recs: list, chunk_bytes: int, clock: Clock) -> List[str]:
    """Write ``integrity.json`` into folder unit ``base`` from ``recs`` (its files, just hashed) and add its own
    record to ``recs`` (so its sidecar and manifest entry follow); returns what was written, run-relative.
    Raises :class:`~ckptaudit.formats.integrity_json.IntegrityConflict` when one appeared meanwhile and disagrees,
    ``OSError``."""
    top = {Path(rel).name: r.sha256_hex for rel, r in recs if (root / rel).parent == base}
    if integrity_json.write_folder(base, known=top, clock=clock) != "written":
        return []
    rel = (base / integrity_json.NAME).relative_to(root).as_posix()
    recs.append((rel, hash_file(root / rel, integrity_json.NAME, chunk_bytes)))
    return [rel]


def _write_seal(root: Path, u: dict, step, base: Path, recs: list, clock: Clock,
                sealed_by: str = "ckptaudit seal") -> List[str]:
    """Write the unit's missing sidecars, then its manifest (a folder: ``COMPLETE`` first, ``manifest.json``
    last), each atomically with its directory fsync; returns what was written, run-relative."""
    folder = u["kind"] == "folder"
    written: List[str] = []
    have = set(u.get("sidecars", []))
    for rel, r in recs:
        sc = rel + SIDECAR_SUFFIX
        if sc in have or rel + ".sha256sum" in have or (root / sc).exists():
            continue
        durable_write(root / sc, sidecar_text(r.sha256_hex, Path(rel).name).encode(), clock)
        written.append(sc)
    doc = {"schema": SCHEMA, "unit": u["unit"], "step": step, "files": [asdict(r) for _, r in recs],
           "versions": {"ckptaudit": __version__}, "world_size": None, "config": None, "metrics": None,
           "created_unix": max((os.stat(root / rel).st_mtime for rel, _ in recs), default=None),
           "sealed_unix": time.time(), "sealed_by": sealed_by}
    for d in {(root / rel).parent for rel, _ in recs} | {root}:
        fsync_dir(d, clock)
    if u["kind"] == "file":
        mp = root / (u["unit"] + ".manifest.json")
        durable_write(mp, manifest_bytes(doc), clock)
        written.append(mp.relative_to(root).as_posix())
    elif folder:
        mb = manifest_bytes(doc)
        durable_write(base / COMPLETE_MARKER, sidecar_text(hashlib.sha256(mb).hexdigest(), MANIFEST_NAME).encode(),
                      clock)
        durable_write(base / MANIFEST_NAME, mb, clock)
        written += [f"{u['unit']}/{COMPLETE_MARKER}", f"{u['unit']}/{MANIFEST_NAME}"]
        fsync_dir(base, clock)
    fsync_dir(base if folder else (root / u["unit"]).parent, clock)
    return written
