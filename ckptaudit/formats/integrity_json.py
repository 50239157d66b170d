"""Megatron-Core's checkpoint integrity manifest ``integrity.json``: parsed, checked against the bytes, written.

Source: NVIDIA/Megatron-LM commit 970c2540 "checkpoint integrity verification (#4305)", 2026-04-27, first released
in ``core_v0.17.1``, the format unchanged through ``core_v0.19.0`` (megatron-core 0.16.1, the newest installable
here, predates it).  Read in ``megatron/core/dist_checkpointing/validation.py`` at Megatron-LM d98e8a64
(2026-08-22): ``INTEGRITY_FNAME``, ``_HASH_ALGORITHM`` and the 1 MiB ``_READ_CHUNK_SIZE`` (lines 40-42),
``_compute_file_hash`` (498), ``save_integrity_manifest`` (512-533), ``_verify_integrity_manifest_impl`` (536-587),
``verify_integrity_manifest`` (590-611); ``serialization.py`` ``load`` (120-122: verification before any tensor is
read) and ``save`` (446-456: rank 0 writes it after the metadata, then a barrier).

The format (what this module relies on, fact by fact):

* **where**: ``integrity.json`` directly inside the folder given to ``dist_checkpointing.save``, i.e. a
  ``torch_dist`` iteration folder ``<save>/iter_{iteration:07d}/`` or ``<save>/release/`` (beside DCP's
  ``.metadata`` and ``__<rank>_<n>.distcp``), with the tracker ``latest_checkpointed_iteration.txt`` one level up;
* **what**: a JSON object ``{"algorithm": "sha256", "files": {bare name: 64 lowercase hex}}`` of every regular
  file at the folder's top level when rank 0 finalises the save, itself excepted, dot-files included, not
  recursive; no sizes, times or signature;
* **bytes**: ``json.dump(payload, f, indent=2)``: two-space indent, ``ensure_ascii``, *no* ``sort_keys`` and *no*
  trailing newline; the files are inserted in ``sorted(Path.iterdir(), key=str)`` order, which within one folder is
  code-point order of the names, the order ``sort_keys=True`` gives (so :func:`render`'s bytes equal
  ``json.dumps(payload, indent=2, sort_keys=True)``);
* **written**: a plain open-and-write (no temp, no fsync, no rename): a crash leaves it torn or empty;
* **verified** (``load(..., verify_integrity=True)``, ``--verify-integrity``): rank 0 re-hashes every listed file
  in 1 MiB reads; a missing or unreadable listed file, or a digest that differs, raises ``CheckpointingException``
  naming each; a missing ``"algorithm"`` means sha256, any other value raises; the document is read with
  ``json.load`` (a torn or empty file raises ``json.JSONDecodeError``, a missing ``"files"`` ``KeyError``, on rank
  0 only: the other ranks wait in the broadcast); files on disk that are not listed are ignored; there is no
  fallback to an older checkpoint.

:func:`parse` says, per document, whether that verification would raise on the document itself;
:func:`read_unit` applies it to an audited folder unit (the hash stage checks each listed digest in its one pass
over the bytes, :mod:`ckptaudit.stages.hash`); :func:`write_folder` writes the format for ``ckptaudit seal`` and the
publisher, byte for byte as Megatron writes it, but atomically, and never over a manifest that disagrees.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import findings as F
from .. import fs
from .._io import TMP_PREFIX, fsync_dir, tmp_name, unlink_quiet, write_all

__all__ = ["NAME", "ALGORITHM", "Parsed", "UnitManifest", "IntegrityConflict", "parse", "render", "applies",
           "read_unit", "iteration_folder", "folder_digests", "write_folder", "verify_folder", "mismatch", "missing",
           "is_data"]

#: The manifest's file name (``INTEGRITY_FNAME``, validation.py line 40).
NAME = "integrity.json"
#: The one algorithm (``_HASH_ALGORITHM``, line 41); a document without the key means this one (line 558).
ALGORITHM = "sha256"
#: Folders Megatron writes it into (``megatron/training/checkpointing.py`` ``get_checkpoint_name``):
#: ``iter_{iteration:07d}`` (also under ``non_persistent/``) and ``release``.
ITERATION_FOLDER = re.compile(r"^(iter_\d{7}|release)$")
#: The tracker Megatron writes one level above the iteration folders, after them (``checkpointing.py``).
TRACKER = "latest_checkpointed_iteration.txt"
_HEX = re.compile(r"[0-9a-f]{64}")
#: Bytes hashed per read (Megatron's ``_READ_CHUNK_SIZE``).
_READ_BYTES = 1 << 20
#: Names of unlisted data files one finding spells out.
_NAMED = 5


def is_data(name: str) -> bool:
    """Whether a top-level name is a DCP data file of a ``torch_dist`` folder (``.metadata``, ``*.distcp``)."""
    return name == ".metadata" or name.endswith(".distcp")


@dataclass
class Parsed:
    """One document read as Megatron's verification reads it: ``digests`` {listed bare name: lowercase hex} of the
    well-formed entries; ``problems``: why the verification raises on the document itself (empty: it does not);
    ``raises``: what it raises then."""

    digests: Dict[str, str] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)
    raises: str = ""
    #: every name ``"files"`` lists, well-formed or not
    listed: List[str] = field(default_factory=list)


def parse(raw: bytes) -> Parsed:
    """``raw`` (the file's bytes) as :class:`Parsed`.  Never raises.

    Problems, each of which makes Megatron's load raise before any tensor is read: empty or not JSON (a save killed
    while rank 0 wrote it: ``json.JSONDecodeError``), not an object, no ``"files"`` (``KeyError``), ``"files"`` not
    an object, an ``"algorithm"`` other than ``"sha256"`` (``CheckpointingException``), an entry whose value is not
    64 lowercase hex digits (Megatron compares it as a string with ``hexdigest()``: a mismatch, so it raises), an
    entry that is not a bare file name (the format lists the folder's top level only)."""
    if not raw.strip():
        what = "empty (0 bytes)" if not raw else f"only whitespace ({len(raw)} bytes)"
        return Parsed(problems=[f"it is {what}: a save stopped while rank 0 wrote it"], raises="json.JSONDecodeError")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return Parsed(problems=[f"it is not UTF-8 text (byte {e.start})"], raises="UnicodeDecodeError")
    except json.JSONDecodeError as e:
        return Parsed(problems=[f"it is not JSON ({e.msg} at byte {e.pos} of {len(raw)}): written only in part"],
                      raises="json.JSONDecodeError")
    if not isinstance(doc, dict):
        return Parsed(problems=[f"its top level is a JSON {type(doc).__name__}, not an object"],
                      raises="AttributeError")
    out = Parsed()
    algorithm = doc.get("algorithm", ALGORITHM)
    if algorithm != ALGORITHM:
        out.problems.append(f"its algorithm is {algorithm!r}, not {ALGORITHM!r}")
        out.raises = "CheckpointingException (unsupported hash algorithm)"
    files = doc.get("files")
    if not isinstance(files, dict):
        out.problems.append("it has no \"files\" object" if "files" not in doc else
                            f"its \"files\" is JSON {json.dumps(files)[:12]}, not an object")
        out.raises = out.raises or ("KeyError: 'files'" if "files" not in doc else "AttributeError")
        return out
    out.listed = list(files)
    for name, hex_ in files.items():
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            out.problems.append(f"entry {name!r} is not a bare file name of the folder")
        elif not isinstance(hex_, str) or not _HEX.fullmatch(hex_):
            out.problems.append(f"entry {name!r}: {str(hex_)[:24]!r} is not 64 lowercase hex digits")
        else:
            out.digests[name] = hex_
    if out.problems and not out.raises:
        out.raises = "CheckpointingException (hash mismatch, or file missing)"
    return out


def render(digests: Dict[str, str]) -> bytes:
    """The bytes Megatron's ``save_integrity_manifest`` writes for ``digests`` {bare name: lowercase hex}: the
    entries in code-point order of the names, ``json.dumps(..., indent=2)``, ASCII, no trailing newline (module
    docstring, "bytes")."""
    return json.dumps({"algorithm": ALGORITHM, "files": {n: digests[n] for n in sorted(digests)}}, indent=2).encode()


# ------------------------------------------------------------------ the audit: a folder unit's manifest
def applies(unit: dict) -> str:
    """The run-relative path of ``unit``'s ``integrity.json`` when it is a folder unit of a DCP folder (a top-level
    ``.metadata`` or ``*.distcp``, where Megatron writes one) holding one at its top level, else ""."""
    if unit.get("kind") != "folder":
        return ""
    pre = "" if unit["unit"] == "." else unit["unit"] + "/"
    top = [f[len(pre):] for f in unit["files"] if f.startswith(pre) and "/" not in f[len(pre):]]
    return pre + NAME if NAME in top and any(is_data(n) for n in top) else ""


@dataclass
class UnitManifest:
    """A folder unit's ``integrity.json`` for the hash stage.  ``rel``: its run-relative path; ``size_bytes`` and
    ``sha256_hex`` of its own bytes; ``expected`` {run-relative file: lowercase hex} of its well-formed entries;
    ``findings``: about the document (unusable); ``unlisted``: the run-relative data files (``.metadata``,
    ``*.distcp``) at the folder's top level that it does not list."""

    rel: str
    size_bytes: Optional[int] = None
    sha256_hex: str = ""
    expected: Dict[str, str] = field(default_factory=dict)
    findings: List[F.Finding] = field(default_factory=list)
    unlisted: List[str] = field(default_factory=list)

    def unlisted_finding(self) -> Optional[F.Finding]:
        """``integrity_unlisted`` (info) naming the unlisted data files, or None when every one is listed."""
        if not self.unlisted or self.findings:
            return None
        names = ", ".join(self.unlisted[:_NAMED]) + (f" and {len(self.unlisted) - _NAMED} more"
                                                     if len(self.unlisted) > _NAMED else "")
        return F.make("integrity_unlisted", path=self.unlisted[0], manifest=self.rel, n_files=len(self.unlisted),
                      files=names)


    def add_rows(self, run_dir: Path, unit: dict, rows: List[dict]) -> None:
        """Append to ``rows`` (the ``hash`` table's rows of ``unit``) a row for each listed file that is no data
        file of the unit: one the folder holds but the unit does not count (a sidecar, ``manifest.json``), hashed
        here and checked; one it lacks or that cannot be read, with ``integrity_file_missing`` (added to the row of
        the same file when the unit's ckptaudit manifest lists it too).  A listed file the inventory refused to
        read (a link, a FIFO: ``unit["irregular"]``) has its own finding already."""
        by_file = {r["file"]: r for r in rows}
        present = set(unit["files"]) | set(unit.get("irregular") or {})
        remote = fs.is_remote(run_dir)
        known = set(unit.get("sidecars") or ()) | {unit.get("manifest") or "", self.rel[: -len(NAME)] + "COMPLETE"}
        for rel, want in sorted(self.expected.items()):
            if rel in present or remote and rel in known:  # an object store's sidecars: not hashed here
                continue
            row = {"unit": unit["unit"], "file": rel, "size_bytes": None, "sha256_hex": "", "hash_seconds": 0.0,
                   "expected_sha256_hex": want, "expected_source": NAME, "verified": False}
            p, why = run_dir / rel, "is not in the folder: it was deleted, or the folder was copied only in part"
            if not remote and _regular(p):
                try:
                    got, size = _sha256(p), os.lstat(p).st_size
                except OSError as e:
                    why = f"cannot be read ({e.strerror or e})"
                else:
                    fl = [] if got == want else [mismatch(rel, got, want, self.rel).to_dict()]
                    rows.append({**row, "size_bytes": size, "sha256_hex": got, "verified": got == want,
                                 "findings_json": json.dumps(fl)})
                    continue
            f = missing(rel, want, self.rel, why).to_dict()
            if rel in by_file:
                by_file[rel]["findings_json"] = json.dumps(json.loads(by_file[rel]["findings_json"]) + [f])
            else:
                rows.append({**row, "findings_json": json.dumps([f])})


def read_unit(run_dir: Path, unit: dict) -> Optional[UnitManifest]:
    """The ``integrity.json`` of folder ``unit`` (:func:`applies`), read once (at most
    :data:`ckptaudit.fs.SMALL_FILE_BYTES`), or None when the unit has none.  A manifest that cannot be read or that
    Megatron's verification raises on gets an ``integrity_manifest_unusable`` finding (with the re-seal as its
    repair); its well-formed entries still count."""
    rel = applies(unit)
    if not rel:
        return None
    out = UnitManifest(rel)
    try:
        raw = fs.read_bounded(run_dir / rel, fs.SMALL_FILE_BYTES)
    except OSError as e:
        p = Parsed(problems=[f"it cannot be read ({e.strerror or e})"], raises="OSError")
    else:
        out.size_bytes, out.sha256_hex = len(raw), hashlib.sha256(raw).hexdigest()
        p = parse(raw)
    pre = rel[: -len(NAME)]
    out.expected = {pre + n: h for n, h in p.digests.items()}
    if p.problems:
        why = "; ".join(p.problems[:3]) + (f" (and {len(p.problems) - 3} more)" if len(p.problems) > 3 else "")
        run = str(run_dir)
        out.findings.append(F.make("integrity_manifest_unusable", path=rel, why=why, raises=p.raises,
                                   aside_quoted=shlex.quote(os.path.join(run, rel + ".unusable")),
                                   manifest_quoted=shlex.quote(os.path.join(run, rel)),
                                   run_quoted=shlex.quote(run)))
    listed = set(p.listed)
    out.unlisted = sorted(f for f in unit["files"] if f.startswith(pre) and "/" not in f[len(pre):]
                          and is_data(f[len(pre):]) and f[len(pre):] not in listed)
    return out


def mismatch(rel: str, actual: str, expected: str, manifest: str) -> F.Finding:
    """``integrity_mismatch``: ``rel``'s SHA-256 ``actual`` is not the ``expected`` one ``manifest`` lists."""
    return F.make("integrity_mismatch", path=rel, actual=actual, expected=expected, manifest=manifest)


def missing(rel: str, expected: str, manifest: str, why: str) -> F.Finding:
    """``integrity_file_missing``: ``manifest`` lists ``rel`` (SHA-256 ``expected``) and ``why`` it cannot be
    checked (the folder lacks it, it cannot be read)."""
    return F.make("integrity_file_missing", path=rel, expected=expected, manifest=manifest, why=why)


# ------------------------------------------------------------------ salvage: a folder checked file by file
def verify_folder(folder: Path) -> Tuple[Dict[str, Optional[bool]], str]:
    """``({listed name: True (verifies), False (differs), None (missing, unreadable or no regular file)}, problem)``
    for the ``integrity.json`` of DCP folder ``folder``, each listed file hashed once; ``({}, "")`` when it has
    none, ``({...}, why)`` when Megatron's verification would raise on the document itself (its well-formed
    entries are still checked).  For :mod:`ckptaudit.intact.dcp`; links are never followed."""
    path = folder / NAME
    if not _regular(path):
        return {}, ""
    try:
        p = parse(fs.read_bounded(path, fs.SMALL_FILE_BYTES))
    except OSError as e:
        return {}, f"{NAME} cannot be read ({e.strerror or e})"
    out: Dict[str, Optional[bool]] = {}
    for name, want in p.digests.items():
        f = folder / name
        try:
            out[name] = _sha256(f) == want if _regular(f) else None
        except OSError:
            out[name] = None
    return out, "; ".join(p.problems)


# ------------------------------------------------------------------ writing: seal and publish
class IntegrityConflict(ValueError):
    """An ``integrity.json`` is already there and disagrees with the bytes (or cannot be read as the format): it
    records what the save wrote and is evidence that the files changed, so it is never overwritten."""


def iteration_folder(folder: Path, name: Optional[str] = None, run_dir: Optional[Path] = None) -> bool:
    """Whether ``folder`` is a ``torch_dist`` iteration folder Megatron would write ``integrity.json`` into: DCP's
    ``.metadata`` and at least one ``*.distcp`` at its top level, and named ``iter_NNNNNNN`` or ``release``
    (``name``: its final name, when ``folder`` is a temp folder) or inside a run with the tracker
    ``latest_checkpointed_iteration.txt`` (``run_dir``: that run, default ``folder``'s parent)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    if ".metadata" not in names or not any(n.endswith(".distcp") for n in names):
        return False
    return bool(ITERATION_FOLDER.match(name or folder.name)) or _regular((run_dir or folder.parent) / TRACKER)


def folder_digests(folder: Path, known: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """{bare name: SHA-256 hex} of every regular file at ``folder``'s top level but ``integrity.json`` and
    ckptaudit's own temp files (the set Megatron lists: module docstring, "what"; a symbolic link is left out,
    never followed: the audit does not follow links either, and Megatron ignores what is not listed).  ``known``:
    digests the caller computed from the same bytes (a publish's or a seal's records), not read again.  Raises
    ``OSError``."""
    out: Dict[str, str] = {}
    for n in sorted(os.listdir(folder)):
        if n == NAME or n.startswith(TMP_PREFIX) or not _regular(folder / n):
            continue
        out[n] = (known or {}).get(n) or _sha256(folder / n)
    return out


def write_folder(folder: Path, known: Optional[Dict[str, str]] = None, clock=None) -> str:
    """Write ``folder/integrity.json`` for its top-level files (:func:`folder_digests`), in Megatron's exact bytes
    (:func:`render`), atomically: a temp file beside it, fsynced, then hard-linked to the name (a link never
    replaces a file that appeared meanwhile; a file system without hard links gets ``os.rename`` after a check),
    then the folder fsynced.  Megatron writes it in place; the bytes are the same.  Returns ``"written"``, or
    ``"agrees"`` when one is already there and every digest it lists matches the bytes (it is left alone).
    Raises :class:`IntegrityConflict` when one is there that disagrees or is unusable, ``OSError``."""
    final = folder / NAME
    if os.path.lexists(final):
        _check_existing(folder, known)
        return "agrees"
    data = render(folder_digests(folder, known))
    tmp = folder / tmp_name(NAME)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, final)
        except FileExistsError:
            _check_existing(folder, known)
            return "agrees"
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            if os.path.lexists(final):
                _check_existing(folder, known)
                return "agrees"
            os.rename(tmp, final)
    finally:
        unlink_quiet(tmp)
    fsync_dir(folder, clock)
    return "written"


def _check_existing(folder: Path, known: Optional[Dict[str, str]]) -> None:
    """Raise :class:`IntegrityConflict` unless ``folder``'s ``integrity.json`` is the format and each digest it lists
    matches the file's bytes (``known`` digests first, else the file hashed)."""
    path = folder / NAME
    if not _regular(path):
        raise IntegrityConflict(f"{path}: there, but not a regular file; not replaced")
    p = parse(fs.read_bounded(path, fs.SMALL_FILE_BYTES))
    if p.problems:
        raise IntegrityConflict(f"{path}: already there and unusable ({'; '.join(p.problems[:3])}); not overwritten "
                                "(move it aside once the bytes are proven intact, then seal again)")
    bad = []
    for name, want in sorted(p.digests.items()):
        f = folder / name
        got = (known or {}).get(name) or (_sha256(f) if _regular(f) else "")
        if got != want:
            bad.append(f"{name}: {'missing' if not got else got[:16] + '…'} where it records {want[:16]}…")
    if bad:
        raise IntegrityConflict(f"{path}: already there and records other bytes than the folder holds "
                                f"({'; '.join(bad[:3])}{' …' if len(bad) > 3 else ''}); it is evidence that the files "
                                "changed after the save, so it is not overwritten")


def _regular(p: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def _sha256(p: Path) -> str:
    """SHA-256 hex of local file ``p``, read in Megatron's 1 MiB reads."""
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(_READ_BYTES), b""):
            h.update(block)
    return h.hexdigest()
