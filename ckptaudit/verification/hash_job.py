"""What one hash job checks its part's passes against: the verify budget's plan and the previous verifications.

A unit the plan leaves out keeps its previous rows (:class:`ckptaudit.verification.budget.JobSplit`); a unit read
gets its rows stamped with when its bytes were verified and compared with its last verification: its rows in the
ledger (this part's fragment, or the ledger under a budget), else, for a unit the ledger does not know (the first
audit since, or a unit packed into another part since), the digests the previous audit into the same output folder
recorded in its hash table (:meth:`ckptaudit.verification.budget.JobSplit.done`: ``digest_changed_unseen``,
``digest_changed_since_last_audit``).  The report's whole table is read only for such units, so a job reads what
its part needs.
"""

from __future__ import annotations

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
        unknown = [f for u in units if self.split.previous_rows(u["unit"]) is None for f in u["files"]]
        self.previous = {} if work is None or not unknown else reverify.previous_digests(
            work.parent / "tables" / "hash.parquet", unknown)

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
        self.split.done(unit, rows, done_at, self.previous)  # bit rot against the unit's last verification
        return rows

    def write(self) -> None:
        """This job's additions to the ledger (every unit it read or carried), when it has a work folder."""
        if self.fragment is not None:
            self.split.write(self.fragment)
