"""What one hash job checks its part's passes against: the verify budget's plan and the previous verifications.

A unit the plan leaves out keeps its previous rows (:class:`ckptaudit.verification.budget.JobSplit`); a unit read
gets its rows stamped with when its bytes were verified, compared with its last verification in the ledger
(``digest_changed_unseen``) and with the digests the previous audit into the same output folder recorded
(:func:`ckptaudit.verification.reverify.changed_since_last_audit`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional, Sequence

from . import budget, ledger, reverify


class HashJob:
    """The hash job of part ``part`` (its ``units`` of the inventory ``inv``).  ``work``: the audit's work folder
    (``verified/<part>.json``, this job's additions to the ledger; its ``../tables/hash.parquet``, the previous
    audit's digests; None: neither); ``verify_plan``: ``work/verify_plan.json`` of a ``verify_budget`` audit."""

    def __init__(self, inv: dict, units: Sequence[dict], part: str, work: Optional[Path] = None,
                 verify_plan: Optional[str] = None) -> None:
        self.fragment = work / ledger.FRAGMENTS / f"{part}.json" if work is not None else None
        self.split = budget.JobSplit(inv, units, verify_plan, self.fragment)
        self.previous = {} if work is None else reverify.previous_digests(
            work.parent / "tables" / "hash.parquet", [f for u in units for f in u["files"]])

    def carried(self, unit: str) -> Optional[List[dict]]:
        """The previous rows of ``unit`` when the verify plan leaves it out (it is not read), else None."""
        return self.split.carried(unit)

    def done(self, unit: str, rows: List[dict]) -> List[dict]:
        """``rows`` (``unit``'s hash rows, just read) stamped with ``hashed_at_utc`` and with the findings of a
        digest that changed since the last verification; recorded for the ledger."""
        done_at = reverify.now_utc()  # when these bytes were last verified (the report's "last hashed")
        for r in rows:
            if r.get("digest_hex"):
                r["hashed_at_utc"] = done_at
        self.split.done(unit, rows, done_at)  # digest_changed_unseen against the ledger's last verification
        for r in rows:
            if r.get("digest_hex") and r.get("verified") is not False and "digest_changed_unseen" not in (
                    r.get("findings_json") or "") and (f := reverify.changed_since_last_audit(r, self.previous.get(r["file"]))):
                r["findings_json"] = json.dumps(json.loads(r.get("findings_json") or "[]") + [f.to_dict()])
        return rows

    def write(self) -> None:
        """This job's additions to the ledger (every unit it read or carried), when it has a work folder."""
        if self.fragment is not None:
            self.split.write(self.fragment)
