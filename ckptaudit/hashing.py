"""Streamed SHA-256 of every file, checked against sidecars and manifests.

Hashing uses :func:`hashlib.file_digest` (CPython's own streaming loop, a
fixed 256 KiB buffer), so memory is constant whatever the file size.

Sidecars are in ``sha256sum`` format: one line ``<64 hex digits><space><space
or *><file name>`` (GNU coreutils manual, "md5sum invocation").  Manifests are
``ckptaudit.manifest/1`` JSON documents written by :mod:`ckptaudit.publish`::

    {"schema": "ckptaudit.manifest/1",
     "files": [{"path": "ckpt_000500.pt", "size_bytes": 372216,
                "sha256_hex": "…", "chunk_bytes": 67108864, "chunk_sha256_hex": ["…"]}], …}
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import findings as F

_LINE = re.compile(r"^\\?([0-9a-fA-F]{64}) [ *](.+)$")


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, streamed (constant memory).  Raises ``OSError``."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def parse_sidecar(text: str) -> Tuple[Dict[str, str], Optional[str]]:
    """Parse sha256sum output: ({file name: hex}, error or None)."""
    out: Dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.match(line.rstrip("\r"))
        if not m:
            bare = line.strip()
            if re.fullmatch(r"[0-9a-fA-F]{64}", bare):  # hash only, no name: accepted
                out[""] = bare.lower()
                continue
            return out, f"line {i} is not '<64 hex>  <name>': {line[:80]!r}"
        out[m.group(2)] = m.group(1).lower()
    if not out:
        return out, "empty sidecar"
    return out, None


def load_manifest(path: Path) -> Dict[str, dict]:
    """{relative path inside the manifest's folder: entry} of a ckptaudit manifest; {} when unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("ckptaudit.manifest/"):
        return {}
    return {str(e.get("path")): e for e in doc.get("files", []) if isinstance(e, dict)}


def hash_unit(run_dir: Path, unit: dict) -> List[dict]:
    """Hash every file of ``unit``; return rows of the ``hash`` table.

    A unit whose files have neither sidecar nor manifest entry gets one
    ``sidecar_missing`` info finding (on its first row).
    """
    sidecar_map: Dict[str, Tuple[str, str]] = {}  # file rel -> (hex, source)
    row_findings: Dict[str, List[F.Finding]] = {}
    for sc in unit.get("sidecars", []):
        sp = run_dir / sc
        try:
            text = sp.read_text(errors="replace")
        except OSError as e:
            row_findings.setdefault("", []).append(F.make("sidecar_malformed", path=sc, sidecar=sc, why=str(e)))
            continue
        entries, err = parse_sidecar(text)
        target = sc[: -len(".sha256sum")] if sc.endswith(".sha256sum") else sc[: -len(".sha256")]
        if err:
            row_findings.setdefault(target, []).append(F.make("sidecar_malformed", path=target, sidecar=sc, why=err))
            continue
        base = Path(target).name
        if base in entries or "" in entries:
            sidecar_map[target] = (entries.get(base, entries.get("")), f"sidecar {Path(sc).name}")
        else:
            named = next(iter(entries))
            row_findings.setdefault(target, []).append(
                F.make("sidecar_names_other_file", path=target, sidecar=sc, named=named))
            sidecar_map[target] = (entries[named], f"sidecar {Path(sc).name}")
    manifest_entries: Dict[str, dict] = {}
    if unit.get("manifest"):
        mp = run_dir / unit["manifest"]
        base = Path(unit["manifest"]).parent
        for rel, e in load_manifest(mp).items():
            key = str((base / rel).as_posix()) if str(base) != "." else rel
            manifest_entries[key] = e
    rows = []
    covered = 0
    for rel in unit["files"]:
        p = run_dir / rel
        t0 = time.perf_counter()
        fl = list(row_findings.get(rel, []))
        try:
            size = p.stat().st_size
            digest = sha256_file(p)
        except OSError as e:
            rows.append({"unit": unit["unit"], "file": rel, "size_bytes": None, "sha256_hex": "", "hash_seconds": 0.0,
                         "expected_sha256_hex": "", "expected_source": "", "verified": None,
                         "findings_json": json.dumps([F.make("load_failed", path=rel,
                                                             why=f"cannot read: {e.strerror}").to_dict()])})
            continue
        dt = time.perf_counter() - t0
        expected, source = "", ""
        verified = None
        me = manifest_entries.get(rel)
        if me is not None:
            expected, source = str(me.get("sha256_hex", "")).lower(), "manifest"
            if isinstance(me.get("size_bytes"), int) and me["size_bytes"] != size:
                fl.append(F.make("size_mismatch_vs_manifest", path=rel, actual=size, expected=me["size_bytes"],
                                 source="manifest"))
        elif rel in sidecar_map:
            expected, source = sidecar_map[rel]
        if expected:
            covered += 1
            verified = expected == digest
            if not verified:
                fl.append(F.make("checksum_mismatch", path=rel, actual=digest, expected=expected, source=source))
        rows.append({"unit": unit["unit"], "file": rel, "size_bytes": size, "sha256_hex": digest,
                     "hash_seconds": dt, "expected_sha256_hex": expected, "expected_source": source,
                     "verified": verified, "findings_json": json.dumps([f.to_dict() for f in fl])})
    if rows and covered == 0:
        extra = json.loads(rows[0]["findings_json"])
        extra.append(F.make("sidecar_missing", path=unit["unit"]).to_dict())
        rows[0]["findings_json"] = json.dumps(extra)
    return rows
