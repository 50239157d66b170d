"""A nightly that fits its window: ``verify_budget`` re-reads the units verified least recently, reuses the rest.

Re-reading every byte every night (the default, :mod:`ckptaudit.verification.reverify`) is right for a run of a few TB; a
store of hundreds of TB is days of reading at disk speed.  With ``verify_budget`` (``ckptaudit audit
--verify-budget 2TiB`` or ``3h``; config key ``verify_budget``) an audit reads:

1. every unit it **must** read: new ones, and those whose files, sidecars or manifest changed since their bytes
   were last verified (their **strong key** differs: each path's size, mtime, ctime, inode and device,
   :func:`ckptaudit.verification.reverify.stat_key`), or that have no previous digest;
2. then the units verified **least recently** first, while they fit in the budget (bytes; a duration is turned
   into bytes at the rate the previous audits' hash passes read, :func:`rate_bytes_per_s`).  When nothing but
   the must-read units fits, the least recently verified unit is read all the same (it would otherwise never
   be verified again); ``over_budget`` says so.

Both go by **part** (the units one job audits, ``units_per_job``): a part is read whole in one pass, whose facts
its scan, load test and state use, so no stage reads bytes the hash stage skipped (:func:`make_plan`).

Every other unit keeps its previous hash rows, digest and ``hashed_at_utc`` included; the report says of it
"not verified since <date>", never "verified".

What is kept, in the output folder's ``work/``:

- ``verify_ledger.json`` and ``verified/<part>.json``: each unit's last verification, its strong key and hash
  rows (:mod:`ckptaudit.verification.ledger`);
- ``verify_plan.json`` (:data:`PLAN`): this audit's choice (:func:`make_plan`), written once by the process
  that runs the workflow and read by every job (a cluster job re-reading the Snakefile chooses nothing).

Nothing here reads or writes an audited file: the plan stats them only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from .ledger import (
    carried_rows,
    digest_changed,
    load_ledger,
    read_json,
    unit_keys,
    verified_utc,
    write_fragment,
    write_ledger,
)

__all__ = ["Budget", "PLAN", "DEFAULT_RATE_BYTES_PER_S", "parse_budget", "rate_bytes_per_s", "make_plan",
           "part_token", "read_plan", "plan_for_audit", "JobSplit", "unit_verification", "age_seconds", "annotate",
           "METRIC_HELP", "metric_values", "budget_line"]

PLAN = "verify_plan.json"

#: Read rate assumed for a duration budget before any audit has timed a pass (bytes/s): one stream.
DEFAULT_RATE_BYTES_PER_S = 500 * 10 ** 6

_BYTE_UNITS = {"": 1, "b": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12, "pb": 10 ** 15,
               "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40, "pib": 2 ** 50}
_TIME_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


@dataclasses.dataclass(frozen=True)
class Budget:
    """A verify budget: ``bytes`` to read, or ``seconds`` of reading (exactly one is set); ``text`` as given."""

    text: str
    bytes: Optional[int] = None
    seconds: Optional[float] = None

    def to_bytes(self, rate_bytes_per_s: float) -> int:
        """The budget in bytes; a duration times ``rate_bytes_per_s`` (bytes/s)."""
        if self.bytes is not None:
            return self.bytes
        return int(self.seconds * rate_bytes_per_s)


def parse_budget(text: str) -> Optional[Budget]:
    """``"2TiB"``, ``"500GB"``, ``"1048576"`` (bytes; SI and binary units) or ``"3h"``, ``"45m"``, ``"90s"``,
    ``"1d"`` (a duration) as a :class:`Budget`; ``""`` (no budget: every byte is read) as None.
    Raises ``ValueError`` naming the text for anything else (a negative, a NaN, an unknown unit)."""
    if text is None or str(text).strip() == "":
        return None
    m = _BUDGET.match(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or (unit not in _BYTE_UNITS and unit not in _TIME_UNITS):
        raise ValueError(f"verify_budget {text!r}: expected bytes (e.g. 2TiB, 500GB) or a duration (e.g. 3h, 45m)")
    n = float(m.group(1))
    if unit in _TIME_UNITS:
        return Budget(str(text).strip(), seconds=n * _TIME_UNITS[unit])
    return Budget(str(text).strip(), bytes=int(n * _BYTE_UNITS[unit]))


def rate_bytes_per_s(ledger: Dict[str, dict]) -> float:
    """Bytes per second of one file pass, from the previous audits' hash rows (``size_bytes`` over
    ``hash_seconds`` summed); :data:`DEFAULT_RATE_BYTES_PER_S` when none timed a pass."""
    size = secs = 0.0
    for e in ledger.values():
        for r in e.get("rows", []):
            if r.get("size_bytes") and r.get("hash_seconds"):
                size += r["size_bytes"]
                secs += r["hash_seconds"]
    return size / secs if secs > 0 and size > 0 else float(DEFAULT_RATE_BYTES_PER_S)


def make_plan(units: Iterable[dict], ledger: Dict[str, dict], keys: Dict[str, Dict[str, object]],
              budget: Budget) -> dict:
    """Choose the parts (groups of units one job audits) this audit reads.

    ``units``: inventory units (``unit``, ``files``, ``size_bytes``, ``part``; a unit without ``part`` is a part
    of its own); ``ledger``: :func:`load_ledger`; ``keys``: each unit's strong key now (:func:`unit_keys`).

    A part is read whole: its hash job's one pass feeds its scan, load test and state, which would otherwise
    read the bytes it skipped, so every byte an audit reads is a byte it verifies and the budget bounds them all.
    Parts with a unit that must be read come first (whatever the budget), then the parts whose least recently
    verified unit is oldest, each while it fits (first fit; ties in inventory order); when none fits, the oldest
    is read all the same (``over_budget``).

    Returns ``{"budget", "budget_bytes", "rate_bytes_per_s", "chosen_bytes", "over_budget", "parts": {part:
    {"verify", "size_bytes", "last_verified_utc"}}, "units": {unit: {"verify": bool, "why", "size_bytes",
    "last_verified_utc", "part"}}}``; a unit's ``why`` is ``"new"``, ``"changed"`` (strong key or previous
    digest), ``"oldest"`` (its part chosen least recently verified first), ``"same part"`` (its part holds a
    new or changed unit) or ``"outside budget"``."""
    units = list(units)
    rate = rate_bytes_per_s(ledger)
    cap = budget.to_bytes(rate)
    out: Dict[str, dict] = {}
    parts: Dict[str, dict] = {}
    for i, u in enumerate(units):
        name, size = u["unit"], int(u.get("size_bytes") or 0)
        e = ledger.get(name)
        last = verified_utc(e)
        must = carried_rows(e, keys.get(name), u["files"]) is None
        part = str(u.get("part") or name)
        out[name] = {"verify": must, "why": ("new" if e is None else "changed") if must else "outside budget",
                     "size_bytes": size, "last_verified_utc": last, "part": part}
        p = parts.setdefault(part, {"verify": False, "size_bytes": 0, "last_verified_utc": last, "order": i,
                                    "units": []})
        p["size_bytes"] += size
        p["verify"] = p["verify"] or must
        p["units"].append(name)
        if (last or "") < (p["last_verified_utc"] or ""):
            p["last_verified_utc"] = last
    used = sum(p["size_bytes"] for p in parts.values() if p["verify"])
    optional = sorted((p["last_verified_utc"] or "", p["order"], name) for name, p in parts.items() if not p["verify"])
    taken = []
    for _, _, name in optional:
        if used + parts[name]["size_bytes"] <= cap:
            taken.append(name)
            used += parts[name]["size_bytes"]
    over = False
    if optional and not taken and cap > 0:  # the oldest is bigger than what is left: read it anyway
        taken.append(optional[0][2])
        used += parts[optional[0][2]]["size_bytes"]
        over = True
    for name in taken:
        parts[name]["verify"] = True
        for un in parts[name]["units"]:
            out[un].update(verify=True, why="oldest")
    for p in parts.values():
        for un in p["units"]:
            if p["verify"] and not out[un]["verify"]:
                out[un].update(verify=True, why="same part")
    return {"budget": budget.text, "budget_bytes": cap, "rate_bytes_per_s": rate, "chosen_bytes": used,
            "over_budget": over or used > cap,
            "parts": {n: {k: p[k] for k in ("verify", "size_bytes", "last_verified_utc")} for n, p in parts.items()},
            "units": out}


def part_token(plan: dict, part: str) -> str:
    """What ``part`` adds to its Snakemake signature under a budget: the id of the audit that last chose to read
    it (``plan["tokens"]``, :func:`plan_for_audit`), so that it runs when this audit reads it and is reused, as
    with ``reuse: true`` (judged by its files' stat keys), by every later audit that does not; ``""`` for a
    part no budgeted audit has read."""
    token = (plan.get("tokens") or {}).get(part)
    return f" verified-by {token}" if token else ""


def read_plan(work: str | os.PathLike, audit_id: Optional[str] = None) -> Optional[dict]:
    """The plan in ``work/verify_plan.json``; None when there is none, or ``audit_id`` is given and it is
    another audit's."""
    try:
        with open(Path(work) / PLAN) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if audit_id is not None and doc.get("audit_id") != audit_id:
        return None
    return doc


def plan_for_audit(inv: dict, work: str | os.PathLike, budget: Budget, audit_id: str, main_process: bool) -> dict:
    """This audit's plan: read from ``work/verify_plan.json`` when it is this audit's (``audit_id``), else made
    (:func:`make_plan`) and written there by the ``main_process``, which also folds the hash jobs' additions
    into the ledger (:func:`write_ledger`).  ``tokens``: per part, the audit that last read it (this one for the
    parts it reads, else the previous plan's), for :func:`part_token`.  Raises ``RuntimeError`` in a job that
    finds no plan of its audit."""
    plan = read_plan(work, audit_id)
    if plan is not None:
        return plan
    if not main_process:
        raise RuntimeError(f"{Path(work) / PLAN}: no verify plan of audit {audit_id} (the main process writes it)")
    from .._io import atomic_write

    ledger = load_ledger(work)
    osd = inv.get("object_store") or {}
    keys = {u["unit"]: unit_keys(inv["run_dir"], u, osd.get(u["unit"])) for u in inv["units"]}
    plan = {"audit_id": audit_id, **make_plan(inv["units"], ledger, keys, budget)}
    before = (read_plan(work) or {}).get("tokens") or {}
    plan["tokens"] = {p: audit_id if x["verify"] else before.get(p, "") for p, x in plan["parts"].items()}
    write_ledger(work, ledger)
    Path(work).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(work) / PLAN, json.dumps(plan, indent=1, sort_keys=True).encode())
    return plan


def unit_verification(last_verified_utc: Optional[str], audit_started_utc: Optional[str]) -> str:
    """What the report says of a unit's bytes: ``""`` when this audit verified them (``last_verified_utc`` not
    before ``audit_started_utc``), ``"not verified since <YYYY-MM-DD HH:MM UTC>"`` when an earlier audit did,
    ``"never verified"`` when none did.  Never calls bytes verified that this audit did not read."""
    if not last_verified_utc:
        return "never verified"
    if not audit_started_utc or last_verified_utc >= audit_started_utc:  # a report run by hand: as reverify does
        return ""
    return f"not verified since {last_verified_utc[:10]} {last_verified_utc[11:16]} UTC"


def age_seconds(last_verified_utc: Optional[str], now_unix: float) -> float:
    """Seconds from ``last_verified_utc`` (ISO 8601) to ``now_unix``; ``inf`` when never verified."""
    import datetime as _dt

    if not last_verified_utc:
        return math.inf
    t = _dt.datetime.fromisoformat(last_verified_utc)
    return max(0.0, now_unix - t.timestamp())


class JobSplit:
    """A hash job's share of the plan: which of its ``units`` it reads, which keep their previous rows.

    ``plan_path`` None (no budget): every unit is read.  Otherwise a unit the plan leaves out keeps the rows of
    its last verification (:meth:`carried`) when its strong key is still the one they were verified under; one
    whose key changed since the plan was made is read all the same.  Each unit's strong key is taken here,
    before any pass, and recorded with the rows (:meth:`done`, :meth:`write`): a file changed during the pass
    has another ctime by the next audit, which then reads it."""

    def __init__(self, inv: dict, units: Sequence[dict], plan_path: Optional[str] = None,
                 fragment: Optional[str | os.PathLike] = None):
        osd = inv.get("object_store") or {}
        self.keys = {u["unit"]: unit_keys(inv["run_dir"], u, osd.get(u["unit"])) for u in units}
        self._carried: Dict[str, List[dict]] = {}
        self._entries: Dict[str, dict] = {}
        # the last verification of each unit, for digest_changed: the ledger under a budget, else what this
        # part's job recorded last time (``fragment``: no job reads the whole ledger of a big store)
        prev = (load_ledger(Path(plan_path).parent) if plan_path else
                ((read_json(Path(fragment)) or {}).get("units") or {}) if fragment else {})
        self._previous = {u["unit"]: prev[u["unit"]] for u in units if u["unit"] in prev}
        if plan_path:
            plan = read_plan(Path(plan_path).parent) or {}
            chosen = plan.get("units") or {}
            ledger = prev
            for u in units:
                if not (chosen.get(u["unit"]) or {"verify": True}).get("verify", True):
                    rows = carried_rows(ledger.get(u["unit"]), self.keys[u["unit"]], u["files"])
                    if rows is not None:
                        self._carried[u["unit"]] = rows
                        self._entries[u["unit"]] = ledger[u["unit"]]

    def previous_rows(self, unit: str) -> Optional[List[dict]]:
        """The hash rows of ``unit``'s last verification this job knows of (its part's ledger fragment, or the
        ledger under a budget), None when it knows none."""
        prev = self._previous.get(unit)
        return None if prev is None else list(prev.get("rows") or [])

    def carried(self, unit: str) -> Optional[List[dict]]:
        """The previous rows of ``unit`` when this job does not read it, else None."""
        return self._carried.get(unit)

    def done(self, unit: str, rows: List[dict], recorded_utc: str,
             recorded: Optional[Dict[str, dict]] = None) -> None:
        """Record the rows of ``unit`` read by this job, under the key taken before its pass, after comparing
        their digests with its last verification's, the one check for bit rot (a finding appended to a row's
        findings): under the same strong key :func:`digest_changed` (``digest_changed_unseen``); else, with the
        same size and mtime, :func:`ckptaudit.verification.reverify.changed_since_last_audit` (a write that put
        the times back changes the ctime).  The last verification is the unit's ledger rows; ``recorded``
        (:func:`ckptaudit.verification.reverify.previous_digests` of the report's table) stands in for a unit the
        ledger does not know."""
        from .reverify import changed_since_last_audit, recorded_digests

        prev = self._previous.get(unit)
        same_key = bool(prev) and prev.get("keys") == self.keys[unit]
        before = {r.get("file"): r for r in (prev or {}).get("rows") or [] if r.get("hashed_at_utc")}
        then = recorded_digests((prev or {}).get("rows") or []) if prev else (recorded or {})
        for r in rows:
            f = digest_changed(r, before.get(r.get("file"))) if same_key else None
            if f is None and r.get("digest_hex") and r.get("verified") is not False:
                f = changed_since_last_audit(r, then.get(r.get("file")))
            if f is not None:
                r["findings_json"] = json.dumps(json.loads(r.get("findings_json") or "[]") + [f.to_dict()])
        self._entries[unit] = {"keys": self.keys[unit], "rows": rows, "recorded_utc": recorded_utc}

    def write(self, path: str | os.PathLike) -> None:
        """This job's additions to the ledger (every unit it read or carried) at ``path``."""
        write_fragment(path, dict(sorted(self._entries.items())))


def annotate(v: dict, hash_rows: Sequence[dict], plan_path: Optional[str] = None,
             audit_id: Optional[str] = None) -> None:
    """Add to a verdict ``v`` (after :func:`ckptaudit.stages.report._add_reverified`) when each unit's bytes were last
    verified: ``units[i]["last_verified_utc"]`` (its least recently hashed file; None when never) and
    ``units[i]["verification_note"]`` (:func:`unit_verification`: ``""`` when this audit read them), and to
    ``v["bytes_verified"]``: ``verified_bytes`` (bytes this audit hashed), ``verify_budget`` (the text, None
    without one), ``verify_budget_bytes``, ``over_budget``, ``units_never_verified`` and
    ``oldest_verification_utc``.  ``plan_path``: ``work/verify_plan.json`` of a budgeted audit, read when it is
    ``audit_id``'s."""
    bv = v.setdefault("bytes_verified", {})
    start = bv.get("audit_started_utc")
    plan = None
    if plan_path:
        plan = read_plan(Path(plan_path).parent, audit_id)
    never = 0
    times = []
    for u in v.get("units", []):
        last = u.get("last_hashed_utc")
        u["last_verified_utc"] = last
        u["verification_note"] = unit_verification(last, start)
        never += not last
        times += [last] if last else []
    bv["verified_bytes"] = sum(int(r.get("size_bytes") or 0) for r in hash_rows
                               if r.get("hashed_at_utc") and (not start or r["hashed_at_utc"] >= start))
    bv["verify_budget"] = plan["budget"] if plan else None
    bv["verify_budget_bytes"] = plan["budget_bytes"] if plan else None
    bv["over_budget"] = bool(plan and plan.get("over_budget"))
    bv["units_never_verified"] = never
    bv["oldest_verification_utc"] = min(times) if times else None


#: The help line of each series :func:`metric_values` gives.
METRIC_HELP = {
    "ckptaudit_unit_oldest_verification_age_seconds":
        "seconds since the least recently verified unit's bytes were read",
    "ckptaudit_units_never_verified": "units whose bytes no audit has read",
    "ckptaudit_verified_bytes": "bytes this audit read and hashed",
    "ckptaudit_verify_budget_bytes": "the audit's verify_budget in bytes (only with one)",
}


def metric_values(v: dict, now_unix: float) -> Dict[str, float]:
    """The verification series of a verdict ``v`` (:mod:`ckptaudit.outputs.metrics`), by metric name:
    ``ckptaudit_unit_oldest_verification_age_seconds`` (seconds since the least recently verified unit's bytes
    were read; left out when no unit was ever verified), ``ckptaudit_units_never_verified`` (units no audit has
    read), ``ckptaudit_verified_bytes`` (bytes this audit read and hashed) and ``ckptaudit_verify_budget_bytes``
    (the budget; left out without one)."""
    bv = v.get("bytes_verified") or {}
    units = v.get("units") or []
    times = [u.get("last_verified_utc", u.get("last_hashed_utc")) for u in units]
    out: Dict[str, float] = {"ckptaudit_units_never_verified": float(sum(not t for t in times)),
                             "ckptaudit_verified_bytes": float(bv.get("verified_bytes") or 0)}
    if any(times):
        out["ckptaudit_unit_oldest_verification_age_seconds"] = age_seconds(min(t for t in times if t), now_unix)
    if bv.get("verify_budget_bytes") is not None:
        out["ckptaudit_verify_budget_bytes"] = float(bv["verify_budget_bytes"])
    return out


def budget_line(v: dict) -> List[str]:
    """The terminal summary's line about a budgeted audit (``[]`` without a budget): units and bytes read, and the
    units it did not read with the oldest verification among them, e.g. ``"  verify budget 2TiB: read 2 of 6
    units (2.5 MiB); 4 not verified by this audit, the oldest not since 2026-11-03 00:00 UTC"``."""
    bv = v.get("bytes_verified") or {}
    if not bv.get("verify_budget"):
        return []
    units = v.get("units") or []
    left = [u for u in units if u.get("verification_note")]
    line = (f"  verify budget {bv['verify_budget']}: read {len(units) - len(left)} of {len(units)} units "
            f"({(bv.get('verified_bytes') or 0) / 2 ** 20:.1f} MiB)")
    if left:
        times = [u["last_verified_utc"] for u in left if u.get("last_verified_utc")]
        line += f"; {len(left)} not verified by this audit"
        oldest = min(times) if times else ""
        line += f", the oldest not since {oldest[:10]} {oldest[11:16]} UTC" if oldest else ""
    return [line]
