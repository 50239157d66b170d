"""Damage is data: one unit's failure inside a stage, or a unit that changes while it is audited.

An audit of a run that is still training (the nightly drill beside a writer)
meets files renamed, rewritten or deleted between the inventory and the scan.
The inventory records a snapshot of every file of a unit (size, mtime, inode);
the report stage compares it with the files as they are at the end, and a unit
that changed or vanished gets ``unit_changed_during_audit`` (it is excluded from
the rollback choice: what was audited is no longer what is there).  An
exception raised while one unit is examined becomes an ``audit_error`` finding
on that unit, in the layer the stage checks, and the other units go on.
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

from .. import findings as F
from ..findings.build import STAGE_LAYER  # noqa: F401 - re-exported: make() gives audit_error its stage's layer

__all__ = ["snapshot", "changed_files", "guard", "error_row", "STAGE_LAYER"]


def _stat(root, f: str) -> Optional[Tuple]:
    """``(size_bytes, mtime_ns, inode)`` of a local file, ``(size_bytes, mtime_ns, etag)`` of an object (from the
    listing: an object rewritten with the same size gets a new ETag and LastModified); None when it is gone."""
    from .. import fs

    if fs.is_remote(root):
        try:
            i = fs.path(fs.join(root, f)).info()
        except (OSError, ValueError):
            return None
        return (i["size"], i["mtime_ns"], i["etag"])
    try:
        st = os.lstat(os.path.join(str(root), f))
    except (OSError, ValueError):
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def snapshot(root, files: List[str]) -> Dict[str, list]:
    """{file: [size_bytes, mtime_ns, inode]} of a unit's files now; an object's third value is its ETag."""
    out = {}
    for f in files:
        s = _stat(root, f)
        if s is not None:
            out[f] = list(s)
    return out


def changed_files(root, snap: Dict[str, list]) -> List[str]:
    """Files of a snapshot that are gone or differ (size, mtime, inode or ETag) now.  An object store is listed
    again first, so an object replaced since the inventory's listing is seen."""
    from .. import fs

    if snap and fs.is_remote(root):
        fs.refresh(root)
    out = []
    for f, want in sorted(snap.items()):
        now = _stat(root, f)
        if now is None or list(now) != list(want):
            out.append(f)
    return out


def changed_finding(unit: str, files: List[str], root) -> F.Finding:
    gone = [f for f in files if _stat(root, f) is None]
    what = (f"{len(gone)} file(s) vanished ({', '.join(gone[:3])})" if gone else
            f"{len(files)} file(s) were rewritten ({', '.join(files[:3])})")
    return F.make("unit_changed_during_audit", path=unit, what=what, files=files)


def guard(stage: str, unit: dict, fn: Callable[[], object], fallback: Callable[[F.Finding], object]):
    """``fn()``, or ``fallback(audit_error finding)`` when it raises (the unit's damage is data)."""
    try:
        return fn()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - any failure on one unit is a finding on that unit
        if os.environ.get("CKPTAUDIT_RAISE_AUDIT_ERRORS") == "1":  # for developers: see the traceback
            raise
        logging.getLogger("ckptaudit").debug("audit_error in %s of %s", stage, unit["unit"], exc_info=True)
        return fallback(F.make("audit_error", path=unit["unit"], stage=stage, error_type=type(e).__name__,
                               error=str(e)[:300]))


def error_row(unit: dict, f: F.Finding) -> dict:
    """A stage row of ``unit`` that carries only ``f``, the ``audit_error`` finding :func:`guard` made."""
    import json

    return {"unit": unit["unit"], "findings_json": json.dumps([f.to_dict()])}
