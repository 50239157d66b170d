"""Streamed digest of every file, checked against sidecars and manifests: SHA-256 where one is recorded.

:func:`hash_unit` reads each file once through :mod:`ckptaudit.onepass` (two 8 MiB buffers,
files of a unit in parallel): the same pass computes the CRC32 of its zip records and the value
statistics of its tensors for the scan and state stages.  Which whole-file digest it computes follows what
the digest is for (:mod:`ckptaudit.formats.digest_purpose`): SHA-256 for a file a sidecar, a manifest entry or an
``integrity.json`` records one of, else the audit's own :data:`~ckptaudit.formats.digest_purpose.FAST_DIGEST` (BLAKE3),
kept for the next audit's comparison.  Each row names its digest's algorithm (``digest_algorithm``,
``digest_hex``); ``sha256_hex`` is only ever a SHA-256 ("" when none was computed).  :func:`sha256_file` (a re-hash of a file
whose chunk digests disagree, and the benchmarks) uses :func:`hashlib.file_digest`.

Sidecars are in ``sha256sum`` format: one line ``<64 hex digits><space><space
or *><file name>`` (GNU coreutils manual, "md5sum invocation").  Manifests are
``ckptaudit.manifest/2`` (or ``/1``) JSON documents written by :mod:`ckptaudit.publish`::

    {"schema": "ckptaudit.manifest/2",
     "files": [{"path": "ckpt_000500.pt", "size_bytes": 372216,
                "sha256_hex": "…", "chunk_bytes": 67108864, "chunk_blake3_hex": ["…"]}], …}

When a manifest entry carries chunk digests (one digest of each ``chunk_bytes``-sized slice of the
file, the last one shorter; BLAKE3 in ``/2``, SHA-256 in ``/1``: :mod:`ckptaudit.formats.chunk_digest`),
:func:`hash_unit` verifies the chunks in parallel on a thread pool (both hashes release the GIL
while hashing a large buffer, so one huge file is verified on all cores) instead of streaming the
whole file through one SHA-256, and a mismatch names the damaged byte range and the tensors stored
in it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from .. import confine
from .. import findings as F
from .. import fs
from . import progress as _progress
from .context import Part, StageContext
from .rows import EarlierRows, HashRow, HashRows
from ..formats.chunk_digest import SAID, damaged_ranges, entry_chunks
from ..formats.digest_purpose import FAST_DIGEST
from ..formats.manifest_entries import load_manifest  # noqa: F401 - re-exported
from ..formats.sidecar import parse_sidecar
from ..layouts.base import tensors_in_range
from ..onepass.at_once import FILES_AT_ONCE, PASS_SLOTS, PASSES_AT_ONCE, map_in_order, small_unit
from ..verification.reverify import mtime_ns_of


def sha256_file(path: str | Path, progress=None) -> str:
    """Hex SHA-256 of a file, streamed (constant memory).  Raises ``OSError``.

    An ``s3://`` object is streamed with ranged GETs of :data:`ckptaudit.fs.STREAM_BLOCK_BYTES`
    (the hash stage reads every byte once; the CRC check of the file layer reads zip members once more).
    ``progress`` (a :class:`ckptaudit.stages.progress.ProgressWriter`) is told every block read."""
    with fs.open_binary(path, block_size=fs.STREAM_BLOCK_BYTES) as fh:
        return hashlib.file_digest(_progress.CountingReader(fh, progress) if progress else fh, "sha256").hexdigest()


def _file_passes(run_dir: Path, unit: dict, manifest_entries: Dict[str, dict], sidecars, prog,
                 planned: Callable[[str], bool], depth, stop, templates=None) -> Dict[str, object]:
    """{file: its one pass (:class:`ckptaudit.onepass.filepass.FileFacts`) or the ``OSError`` that stopped it},
    files passed in parallel (at most ``FILES_AT_ONCE``; one after another in a small local unit).  A file whose
    manifest entry has usable chunk digests gets those instead of the whole-file SHA-256 (which they imply when all
    match); a file with a recorded
    digest (``sidecars``: the files a sidecar or an ``integrity.json`` gives one; a manifest entry) gets its
    SHA-256; any other the audit's own fast digest, or none at a ``depth`` without ``unchecked_digests``
    (:data:`ckptaudit.fs.read_depth.CHECKED_DIGESTS_ONLY`; :func:`ckptaudit.formats.digest_purpose.whole_file_digest`).
    A file for which ``planned`` is false gets no plan (no later stage asks for its record or value facts; a DCP
    folder's ``.metadata`` is walked once for the rest).  ``stop``: an event that, set, stops every pass;
    ``templates``: the job's data.pkl shapes (:class:`ckptaudit.onepass.pickle_templates.PickleTemplates`)."""
    from ..formats.digest_purpose import FAST_DIGEST, SHA256, whole_file_digest
    from ..onepass.consumers import Progress
    from ..onepass.filepass import pass_file
    from ..onepass.plan import Plan
    from ..onepass.plan_dcp import unit_places
    dcp = unit_places(run_dir / rel for rel in unit["files"] if planned(rel))

    def one(rel: str):
        p = run_dir / rel
        t0 = time.perf_counter()
        try:
            me = manifest_entries.get(rel)
            chunks = entry_chunks(me, p.stat().st_size)
            whole = None if chunks is not None else whole_file_digest(rel in sidecars or me is not None, depth)
            with PASS_SLOTS:
                ff = pass_file(p, whole_sha=whole == SHA256, fast_digest=whole == FAST_DIGEST, chunk_bytes=me["chunk_bytes"] if chunks else None,
                               chunk_algorithm=chunks[0] if chunks else "sha256",
                               progress=Progress(prog), plan=None if planned(rel) else Plan(), stop=stop,
                               dcp_places=dcp.get(fs.fspath(p)), templates=templates)
        except OSError as e:
            return e
        ff.seconds = time.perf_counter() - t0
        return ff

    files = list(unit["files"])
    return dict(zip(files, map_in_order(one, files, [not small_unit(unit, run_dir)] * len(files), FILES_AT_ONCE)))


def _manifest_entries(run_dir: Path, unit: dict, rows: List[dict]) -> Dict[str, dict]:
    """{run-relative file: entry} of ``unit``'s manifest.  A manifest that resolves outside the run, or is
    not a regular file (a FIFO, a device), is never read; an entry naming a path outside the run is left out.
    Each is a row of ``rows`` with its finding (``path_outside_run``, :func:`ckptaudit.confine.resolved_outside`;
    ``not_a_regular_file``)."""
    from ..discovery.irregular import irregular_reason
    from ..layouts import leftovers

    man = unit["manifest"]

    def row(f: F.Finding) -> None:
        rows.append({"unit": unit["unit"], "file": man, "size_bytes": None, "sha256_hex": "", "hash_seconds": 0.0,
                     "expected_sha256_hex": "", "expected_source": "", "verified": None,
                     "findings_json": json.dumps([f.to_dict()])})

    if out := confine.resolved_outside(run_dir, man):
        row(confine.path_outside_run(man, man, out, "it is a symbolic link, and a check of the unit would read it"))
        return {}
    why = None if fs.is_remote(run_dir) else irregular_reason(run_dir, run_dir / man)
    if why:
        row(leftovers.irregular(man, why))
        return {}
    base = Path(man).parent
    entries: Dict[str, dict] = {}
    for rel, e in load_manifest(run_dir / man).items():
        if out := confine.resolved_outside(run_dir, rel, str(base)):
            row(confine.path_outside_run(man, rel, out, "a check of the unit against its manifest would read it"))
            continue
        key = str((base / rel).as_posix()) if str(base) != "." else rel
        entries[key] = e
    return entries


def hash_unit(run_dir: Path, unit: dict, facts: Optional[list] = None,
              planned: Optional[Callable[[str], bool]] = None, depth=None, stop=None, templates=None) -> List[dict]:
    """Hash every file of ``unit``; return rows of the ``hash`` table.

    A unit whose files have neither sidecar nor manifest entry gets one
    ``sidecar_missing`` info finding (on its first row).  A file whose manifest
    entry has chunk digests is verified chunk by chunk in parallel; when every
    chunk matches, ``sha256_hex`` is the manifest's whole-file digest (implied
    by the chunks, not recomputed), otherwise the file is hashed whole and each
    damaged byte range gets a ``chunk_checksum_mismatch`` finding.  A file the
    manifest lists but the unit lacks gets a row with ``size_bytes`` None and a
    ``manifest_file_missing`` finding.

    Every file is read once (:mod:`ckptaudit.onepass`): the same pass computes the CRC32 of its zip
    records and the value statistics of its tensors, appended to ``facts`` (one ``pyarrow`` table of rows of
    the internal ``bytefacts`` table per file, :func:`ckptaudit.onepass.facts.table_of`) when given, for the
    scan and state stages; ``planned(file)`` false (the layout never reads that file by record:
    :func:`ckptaudit.layouts.reads_records`) skips them for that file.  ``depth``, ``stop``: :func:`_file_passes`'.
    ``templates``: the job's data.pkl shapes walked so far, shared by its units (:func:`_file_passes`).

    A DCP folder's ``integrity.json`` (Megatron-Core's manifest, :mod:`ckptaudit.formats.integrity_json`) is read
    first, not passed: each file it lists is checked against it in the same pass (``integrity_mismatch``), the
    listed files that are no data file of the unit are added (:meth:`~ckptaudit.formats.integrity_json.UnitManifest.
    add_rows`); its own row comes only with a finding or a sidecar or manifest entry that checks it.
    """
    from ..formats import integrity_json

    row_findings: Dict[str, List[F.Finding]] = {}
    sidecar_map, unreadable = _sidecar_digests(run_dir, unit, row_findings)
    manifest_entries: Dict[str, dict] = {}
    manifest_rows: List[dict] = []  # findings about the manifest itself, one row each
    if unit.get("manifest"):
        manifest_entries = _manifest_entries(run_dir, unit, manifest_rows)
    integ = integrity_json.read_unit(run_dir, unit)
    listed = integ.expected if integ else {}
    passed = [f for f in unit["files"] if integ is None or f != integ.rel]
    if integ and (found := integ.unlisted_finding()):
        row_findings.setdefault(found.path, []).append(found)
    rows = []
    covered = 0  # files with a digest to check against
    no_crc: List[str] = []  # files without a digest whose bytes no per-record CRC-32 covers either
    prog = _progress.for_unit(unit)  # bytes hashed, for the CLI's progress line ($CKPTAUDIT_PROGRESS_DIR)
    passes = _file_passes(run_dir, {**unit, "files": passed}, manifest_entries, sidecar_map.keys() | listed.keys(),
                          prog, planned or (lambda rel: True), depth, stop, templates)
    for rel in passed:
        ff = passes[rel]
        if isinstance(ff, OSError):
            rows.append(_unreadable_row(unit, rel, ff))
            continue
        try:
            row = _file_row(run_dir, unit, rel, ff, manifest_entries.get(rel), sidecar_map.get(rel),
                            row_findings.get(rel, []), (listed[rel], integ.rel) if rel in listed else None, depth)
        except OSError as e:  # the whole-file re-read of a file whose chunks failed
            rows.append(_unreadable_row(unit, rel, e))
            continue
        covered += bool(row["expected_sha256_hex"])
        if not row["expected_sha256_hex"] and not len(ff.plan.crc_range):
            no_crc.append(rel)
        rows.append(row)
        if facts is not None:
            from ..onepass.facts import table_of

            facts.append(table_of(unit["unit"], rel, ff))
        passes[rel] = None  # its columns are in the table now
    prog.close()
    rows.extend(_missing_file_rows(unit, manifest_entries))
    rows.extend(manifest_rows)
    if integ is not None:
        integ.add_rows(run_dir, unit, rows)
        if integ.size_bytes is not None:  # its own row: when checked by a sidecar or manifest, or it has findings
            from ..onepass.filepass import FileFacts

            row = _file_row(run_dir, unit, integ.rel, FileFacts(integ.size_bytes, sha256_hex=integ.sha256_hex),
                            manifest_entries.get(integ.rel), sidecar_map.get(integ.rel), integ.findings)
            rows.extend([row] if row["expected_sha256_hex"] or integ.findings else [])
        elif integ.findings:  # it could not be read: its finding says so
            rows.append({**_unreadable_row(unit, integ.rel, OSError()),
                         "findings_json": json.dumps([f.to_dict() for f in integ.findings])})
    if rows and covered == 0 and not unreadable and integ is None:
        extra = json.loads(rows[0]["findings_json"])
        extra.append(_sidecar_missing(unit["unit"], no_crc).to_dict())
        rows[0]["findings_json"] = json.dumps(extra)
    for r in rows:  # rows hashed elsewhere (integrity.json's listed files) carry their SHA-256 only
        if r.get("sha256_hex") and not r.get("digest_hex"):
            r["digest_algorithm"], r["digest_hex"] = "sha256", r["sha256_hex"]
    return rows


def _sidecar_missing(unit: str, no_crc: List[str]) -> F.Finding:
    """``sidecar_missing`` of a unit no digest covers; ``no_crc``: its files no zip record CRC-32 covers either
    (safetensors, JSON, a legacy pickle), of which no more than "no damage found" can be said (in the detail)."""
    f = F.make("sidecar_missing", path=unit)
    f.detail.update(unverified_files=no_crc[:8], n_unverified=len(no_crc))
    return f


def _sidecar_digests(run_dir: Path, unit: dict, row_findings: Dict[str, List[F.Finding]]
                     ) -> Tuple[Dict[str, Tuple[str, str]], int]:
    """({file: (SHA-256 hex, "sidecar NAME")} from the unit's sidecars, how many were unreadable); a sidecar's
    faults (unreadable, malformed, naming another file, out of the run) go to ``row_findings`` by its file."""
    sidecar_map: Dict[str, Tuple[str, str]] = {}
    unreadable = 0
    for sc in unit.get("sidecars", []):
        sp = run_dir / sc
        target = sc[: -len(".sha256sum")] if sc.endswith(".sha256sum") else sc[: -len(".sha256")]
        if out := confine.resolved_outside(run_dir, sc):  # a link out of the run: never read
            row_findings.setdefault(target, []).append(confine.path_outside_run(
                sc, sc, out, "it is a symbolic link, and `sha256sum -c` would read that file"))
            continue
        try:
            text = fs.read_bounded(sp, 1 << 20).decode("utf-8", errors="replace")
        except OSError as e:  # a FIFO, a device, a giant, no permission: said, not skipped as "missing"
            row_findings.setdefault(target, []).append(
                F.make("sidecar_unreadable", path=target, sidecar=sc, why=str(e).split(": ", 1)[-1]))
            unreadable += 1
            continue
        entries, err = parse_sidecar(text)
        if err:
            row_findings.setdefault(target, []).append(F.make("sidecar_malformed", path=target, sidecar=sc, why=err))
            continue
        sc_dir = str(Path(sc).parent)
        outside = {n: out for n in entries if n and (out := confine.resolved_outside(run_dir, n, sc_dir))}
        for n, out in outside.items():  # `sha256sum -c` in the sidecar's folder would open it
            row_findings.setdefault(target, []).append(confine.path_outside_run(
                sc, n, out, "`sha256sum -c` would read that file"))
        entries = {n: h for n, h in entries.items() if n not in outside}
        if not entries:
            continue
        base = Path(target).name
        if base in entries or "" in entries:
            sidecar_map[target] = (entries.get(base, entries.get("")), f"sidecar {Path(sc).name}")
        else:
            named = next(iter(entries))
            row_findings.setdefault(target, []).append(
                F.make("sidecar_names_other_file", path=target, sidecar=sc, named=named))
            sidecar_map[target] = (entries[named], f"sidecar {Path(sc).name}")
    return sidecar_map, unreadable


def _unreadable_row(unit: dict, rel: str, e: OSError) -> dict:
    """The ``hash`` row of a file that could not be read."""
    from .load.loadtest import unreadable

    return {"unit": unit["unit"], "file": rel, "size_bytes": None, "sha256_hex": "", "hash_seconds": 0.0,
            "expected_sha256_hex": "", "expected_source": "", "verified": None,
            "findings_json": json.dumps([unreadable(rel, f"cannot read: {e.strerror}").to_dict()])}


def _file_row(run_dir: Path, unit: dict, rel: str, ff, me: Optional[dict], sidecar: Optional[Tuple[str, str]],
              findings_before: List[F.Finding], integ: Optional[Tuple[str, str]] = None, depth=None) -> dict:
    """The ``hash`` row of a file the pass read (``ff``) against its manifest entry ``me`` or else its sidecar
    digest, and against ``integ`` (the digest its folder's ``integrity.json`` lists, that manifest's path); raises
    ``OSError`` when a file whose chunks failed cannot be re-read whole (not at a depth without unchecked_digests)."""
    fl = list(findings_before)
    size = ff.size_bytes
    bad_chunks: List[int] = []
    algorithm = ""
    if ff.chunk_hex is not None:
        algorithm, want = entry_chunks(me, size) or ("", [])  # none when the file's size changed since the pass began
        got = ff.chunk_hex
        bad_chunks = [i for i in range(max(len(got), len(want))) if i >= len(got) or i >= len(want) or got[i] != want[i]]
        rehash = integ is not None or depth is None or depth.unchecked_digests  # the reader: checked by nothing
        digest = (sha256_file(run_dir / rel) if rehash else "") if bad_chunks else str(me.get("sha256_hex", "")).lower()
    else:
        digest = ff.sha256_hex
    record = ("sha256", digest) if digest else (FAST_DIGEST, ff.fast_hex) if ff.fast_hex else ("", "")
    expected, source = "", ""
    verified = None
    if me is not None:
        expected, source = str(me.get("sha256_hex", "")).lower(), "manifest"
        if isinstance(me.get("size_bytes"), int) and me["size_bytes"] != size:
            fl.append(F.make("size_mismatch_vs_manifest", path=rel, actual=size, expected=me["size_bytes"],
                             source="manifest"))
    elif sidecar is not None:
        expected, source = sidecar
    if expected:
        verified = expected == digest and not bad_chunks
        for start, end, idx in damaged_ranges(bad_chunks, me["chunk_bytes"], size) if bad_chunks else []:
            fl.append(F.make("chunk_checksum_mismatch", path=rel, start=start, last=end - 1, n_bytes=end - start,
                             chunks=", ".join(map(str, idx)), n_chunks=-(-size // me["chunk_bytes"]),
                             chunk_bytes=me["chunk_bytes"], source="manifest",
                             algorithm=SAID.get(algorithm, "SHA-256"),
                             where_text=tensors_in_range(run_dir, rel, unit["unit"], start, end),
                             range_note="" if (start, end) == (0, size) else (
                                 " Only that byte range changed: an intact copy of the file can be compared or "
                                 "repaired over that range alone.")))
        if not verified and not bad_chunks:
            fl.append(F.make("checksum_mismatch", path=rel, actual=digest, expected=expected, source=source))
    if integ is not None:
        expected, source, verified = _with_integrity(rel, digest, integ, expected, source, verified, fl)
    return {"unit": unit["unit"], "file": rel, "size_bytes": size, "mtime_ns": mtime_ns_of(ff.version),
            "sha256_hex": digest, "digest_algorithm": record[0], "digest_hex": record[1], "hash_seconds": ff.seconds, "expected_sha256_hex": expected, "expected_source": source,
            "verified": verified, "findings_json": json.dumps([f.to_dict() for f in fl])}


def _missing_file_rows(unit: dict, manifest_entries: Dict[str, dict]) -> List[dict]:
    """A ``manifest_file_missing`` row for each file the manifest lists that the unit lacks."""
    present = set(unit["files"])
    rows = []
    for rel, me in sorted(manifest_entries.items()):
        if rel in present:
            continue
        f = F.make("manifest_file_missing", path=rel, manifest=unit["manifest"], size_bytes=me.get("size_bytes"),
                   sha256_hex=me.get("sha256_hex"))
        rows.append({"unit": unit["unit"], "file": rel, "size_bytes": None, "sha256_hex": "", "hash_seconds": 0.0,
                     "expected_sha256_hex": str(me.get("sha256_hex", "")).lower(), "expected_source": "manifest",
                     "verified": False, "findings_json": json.dumps([f.to_dict()])})
    return rows


def _with_integrity(rel: str, digest: str, integ: Tuple[str, str], expected: str, source: str,
                    verified: Optional[bool], fl: List[F.Finding]) -> Tuple[str, str, Optional[bool]]:
    """``(expected, source, verified)`` of a row once ``digest`` is checked against ``integ`` (the digest an
    ``integrity.json`` lists, its path): ``integrity.json`` named as a source (beside a sidecar or manifest that
    agrees), ``integrity_mismatch`` appended to ``fl`` when they differ."""
    from ..formats import integrity_json

    want, manifest = integ
    if want != digest:
        fl.append(integrity_json.mismatch(rel, digest, want, manifest))
        return want, integrity_json.NAME, False
    return want, f"{source}, {integrity_json.NAME}" if source else integrity_json.NAME, verified is not False



def run(ctx: StageContext, part: Part, rows: EarlierRows, *, stop=None, facts_to=None) -> HashRows:
    """Hash every file of ``part``, one pass per file and ``PASSES_AT_ONCE`` units at once (the cores the rule
    reserves; the small units meanwhile on the calling thread, :mod:`ckptaudit.onepass.at_once`); rows in unit
    order, with the passes' facts, or those handed to ``facts_to`` (thread-safe) as each unit ends, not kept.  ``ctx.depth``: which SHA-256s; ``stop``: an event that stops the passes (the reader);
    units a verify plan leaves out are not read (:class:`ckptaudit.verification.hash_job.HashJob`)."""
    import functools

    from .. import layouts
    from . import liveness
    from ..onepass.pickle_templates import PickleTemplates
    from ..verification.hash_job import HashJob

    units = list(part.units)
    templates = PickleTemplates()  # one walk per data.pkl shape in this job (its units share most)
    job = HashJob(ctx.inventory, units, part.name, ctx.work, ctx.verify_plan)

    def one(u: dict) -> Tuple[List[dict], list]:
        if (kept := job.carried(u["unit"])) is not None:  # outside this audit's verify budget: not read
            return kept, []
        facts: list = []
        planned = functools.partial(layouts.reads_records, u)  # files a later stage reads by record
        got = liveness.guard("hash", u,
                             lambda: hash_unit(ctx.run_dir, u, facts, planned, ctx.depth, stop, templates),
                             lambda f: [{**liveness.error_row(u, f), "file": ""}])
        for t in facts if facts_to is not None else ():
            facts_to(t)
        return job.done(u["unit"], got), facts if facts_to is None else []

    done = map_in_order(one, units, [not small_unit(u, ctx.run_dir) for u in units], PASSES_AT_ONCE)
    job.write()
    return HashRows(tuple(HashRow.of(r) for got, _ in done for r in got), tuple(t for _, facts in done for t in facts))
