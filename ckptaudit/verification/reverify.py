"""What a re-run into an existing output folder trusts: by default nothing, every byte is hashed again.

A nightly audit exists to catch bytes that changed while nothing else did (bit rot, a bad disk or controller,
a copy that wrote garbage and restored the times).  So each audit gets an id (:func:`audit_id`), and unless
``reuse: true`` (``ckptaudit audit --reuse``) every per-part job carries it as a param: a new audit re-runs the
inventory and every part, whatever the files' sizes and mtimes say.

With ``reuse: true`` a part is redone only when one of its files' **stat key** changed: size, mtime, ctime,
inode and device (:func:`stat_key`).  ``os.utime`` can put an mtime back, not a ctime (the kernel sets ctime to
now on every write, ``utime`` and ``chmod``), and a file replaced by rename has a new inode.  What the stat key
cannot see, so what ``--reuse`` trusts: bytes that change below the file system (media bit rot, a disk or RAID
controller returning other bytes, a block device written directly), a clock set back while a file is
rewritten, and on S3 an object whose ETag and size stay the same.  The ``nightly`` profile forces the hash
stage, so it never reuses.

The hash table records when each file was hashed (``hashed_at_utc``); :func:`summary` tells the report which
units this audit re-verified and when the others were last hashed.

Re-reading every byte finds bit rot only against something: a file with a sidecar or manifest has its recorded
SHA-256, a zip record its CRC-32, and every file the digest the previous audit into the same output folder
recorded: its unit's rows in the verify ledger (:mod:`ckptaudit.verification.ledger`, the hash job's own part's
fragment; :func:`recorded_digests`), else the report's ``tables/hash.parquet`` (:func:`previous_digests`).  A
file whose size and mtime are those of that record but whose digest, in the same algorithm, is not gets
``digest_changed_since_last_audit``
(:func:`changed_since_last_audit`); digests of different algorithms (a sidecar added since: SHA-256 against the
previous BLAKE3) are never compared.  The finding keeps the recorded digest, so the audits after it keep
comparing with the bytes as they were, not the damaged ones.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Dict, Iterable, List, Optional

__all__ = ["ENV", "audit_id", "started_utc", "stat_key", "now_utc", "summary", "mtime_ns_of", "previous_digests",
           "changed_since_last_audit", "recorded_digests"]

#: The audit id travels to jobs (local shells and cluster jobs that re-read the Snakefile) in this variable.
ENV = "CKPTAUDIT_AUDIT_ID"


def now_utc() -> str:
    """The current time, ISO 8601 in UTC with microseconds (sortable as text)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def audit_id(main_process: bool) -> str:
    """This audit's id: ``<start time UTC>/<pid>``.  The process that runs the workflow makes a new one and
    puts it in ``$CKPTAUDIT_AUDIT_ID`` for the jobs it starts; a job that re-reads the Snakefile (a cluster
    job) takes it from there, so params computed in the job equal the main process's."""
    if not main_process and os.environ.get(ENV):
        return os.environ[ENV]
    aid = f"{now_utc()}/{os.getpid()}"
    os.environ[ENV] = aid
    return aid


def started_utc(aid: str) -> str:
    """The start time in an audit id (the text before ``/``)."""
    return aid.split("/", 1)[0]


def stat_key(path: str) -> Optional[List[int]]:
    """``[size_bytes, mtime_ns, ctime_ns, inode, device]`` of ``path`` (symlinks followed), or None when it
    cannot be stat'ed (a missing file is a change too)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def mtime_ns_of(version: str) -> Optional[int]:
    """A local file's mtime (ns) from its :func:`ckptaudit.fs.version` tag ``"<mtime_ns>:<inode>"``, as the hash
    table records it for the next audit's comparison; None for an object's ETag or no tag."""
    head, sep, _ = version.partition(":")
    return int(head) if sep and head.isdigit() else None


def summary(hash_rows: Iterable[dict], aid: Optional[str], reuse: bool) -> Dict[str, object]:
    """Which units this audit re-verified, from the hash table's ``hashed_at_utc``.

    Returns ``{"audit_started_utc", "reuse", "units_reverified", "units_reused", "last_hashed_utc"}``:
    ``last_hashed_utc`` maps each unit to the oldest hash time of its files (its bytes are as verified as its
    least recently hashed file); a unit is re-verified when that time is not before this audit's start.  Files
    that were never hashed (missing, unreadable) have no time and do not count.  ``aid`` None (a report run by
    hand): every unit counts as re-verified when it has a time."""
    start = started_utc(aid) if aid else ""
    oldest: Dict[str, str] = {}
    for r in hash_rows:
        t = r.get("hashed_at_utc") or ""
        if not t:
            continue
        u = r["unit"]
        if u not in oldest or t < oldest[u]:
            oldest[u] = t
    again = sorted(u for u, t in oldest.items() if t >= start)
    return {"audit_started_utc": start or None, "reuse": bool(reuse), "units_reverified": len(again),
            "units_reused": len(oldest) - len(again), "last_hashed_utc": dict(sorted(oldest.items()))}


#: The finding kind of a digest that changed with size and mtime kept.
CHANGED = "digest_changed_since_last_audit"


_RECORD = ("size_bytes", "mtime_ns", "digest_algorithm", "digest_hex", "hashed_at_utc")


def previous_digests(ledger: Path, files: Iterable[str]) -> Dict[str, dict]:
    """{file: ``{"size_bytes", "mtime_ns", "digest_algorithm", "digest_hex", "hashed_at_utc"}``} of ``files`` as the
    previous audit recorded them in ``ledger`` (its ``tables/hash.parquet``), each as :func:`recorded_digests`
    gives it; ``{}`` when the ledger is missing, unreadable, or from a ckptaudit that recorded no mtime."""
    from .. import tables

    want = sorted(set(files))
    cols = ["file", *_RECORD, "findings_json"]
    try:
        if not want or not Path(ledger).is_file():
            return {}
        import pyarrow as pa
        import pyarrow.compute as pc

        t = tables.read_table(ledger, columns=cols)  # a column missing (an older ckptaudit): ArrowInvalid
        rows = t.filter(pc.is_in(t["file"].cast(pa.string()), value_set=pa.array(want))).to_pylist()
    except (OSError, ValueError):  # an unreadable ledger compares with nothing
        return {}
    return recorded_digests(rows)


def recorded_digests(rows: Iterable[dict]) -> Dict[str, dict]:
    """{file: ``{"size_bytes", "mtime_ns", "digest_algorithm", "digest_hex", "hashed_at_utc"}``} of hash rows
    recorded by an earlier audit (the report's table, or a unit's rows in the verify ledger,
    :mod:`ckptaudit.verification.ledger`); a row carrying a :data:`CHANGED` finding keeps that finding's recorded
    digest and time (the bytes before they changed).  Rows without size, mtime or digest are left out."""
    out: Dict[str, dict] = {}
    for r in rows:
        rec = {k: r.get(k) for k in _RECORD}
        if CHANGED in (r.get("findings_json") or ""):
            for f in json.loads(r["findings_json"]):
                if f.get("kind") == CHANGED:
                    d = f.get("detail", {})
                    rec.update(digest_hex=d.get("expected"), hashed_at_utc=d.get("last_hashed_utc"))
        if rec["size_bytes"] is not None and rec["mtime_ns"] is not None and rec["digest_algorithm"] and \
                rec["digest_hex"] and r.get("file"):
            out[r["file"]] = rec
    return out


def changed_since_last_audit(row: dict, previous: Optional[dict]):
    """A :data:`CHANGED` finding (:class:`ckptaudit.findings.Finding`) when hash row ``row`` has the size, mtime and
    digest algorithm of ``previous`` (:func:`previous_digests`) but another digest; else None (nothing recorded,
    the file written since, another algorithm, or the same bytes)."""
    from .. import findings as F

    if not previous or not row.get("digest_hex") or row.get("digest_algorithm") != previous["digest_algorithm"]:
        return None
    if (row.get("size_bytes"), row.get("mtime_ns")) != (previous["size_bytes"], previous["mtime_ns"]):
        return None
    if row["digest_hex"] == previous["digest_hex"]:
        return None
    from ..formats.chunk_digest import SAID

    return F.make("digest_changed_since_last_audit", path=row["file"], algorithm=SAID.get(row["digest_algorithm"], row["digest_algorithm"]),
                  actual=row["digest_hex"], expected=previous["digest_hex"], size_bytes=row["size_bytes"],
                  last_hashed_utc=previous["hashed_at_utc"] or "an earlier audit")
