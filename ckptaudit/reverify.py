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
"""

from __future__ import annotations

import datetime as _dt
import os
from typing import Dict, Iterable, List, Optional

__all__ = ["ENV", "audit_id", "started_utc", "stat_key", "now_utc", "summary"]

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
