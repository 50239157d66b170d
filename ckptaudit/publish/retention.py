"""Retention: which old units :func:`prune` deletes (only verified ones older than the rollback point).

Keep rules count verified units only, and a unit that does not verify is never deleted.

Also sweeps temp leftovers of dead writers on this host and sidecars/manifests left without
their file unit.  Deletion renames a unit to a temp name first, so a crash mid-delete never
leaves a torn unit.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import fs
from ..units import step_from_name
from .clock import Clock
from .files import fsync_dir, remove_tree_quiet, rename_nfs_safe, unlink_quiet
from .._io import dead_writer
from .names import TMP_RE, SCHEMAS_READ, SIDECAR_SUFFIX, tmp_name

log = logging.getLogger("ckptaudit.publish")


@dataclass(frozen=True)
class Retention:
    """What :func:`prune` keeps after each publish (see there).  Counts are units; steps
    are optimizer steps; ``metric`` is a key of the ``metrics`` given to publish."""

    keep_last: Optional[int] = None
    keep_every: Optional[int] = None
    keep_best: Optional[int] = None
    metric: Optional[str] = None
    mode: str = "min"
    sweep_stale: bool = False


@dataclass
class PruneDecision:
    """What :func:`prune` decided for one unit: ``action`` is ``keep``, ``delete`` or
    ``sweep`` (a leftover of a dead writer); ``reason`` says why in words."""

    unit: str
    step: Optional[int]
    action: str
    reason: str


@dataclass
class PrunePlan:
    """``rollback``: the newest verified unit (never deleted), or None; ``dry_run``: nothing
    was deleted."""

    run_dir: Path
    rollback: Optional[str]
    decisions: List[PruneDecision]
    dry_run: bool

    @property
    def deleted(self) -> List[str]:
        return [d.unit for d in self.decisions if d.action in ("delete", "sweep")]


def verify_unit(run_dir: str | os.PathLike, unit: Dict[str, Any]) -> Tuple[bool, str]:
    """(True, "") when ``unit`` (an inventory unit dict) is complete and every file matches
    its manifest entry or sidecar; else (False, why).  Reads every byte of the unit
    (chunked files on all cores).  A file without any recorded digest cannot be verified."""
    from ..stages import hash as hashing

    if unit.get("in_progress"):
        return False, f"in progress ({unit['in_progress']})"
    if unit.get("missing_files"):
        return False, f"missing files {sorted(unit['missing_files'])}"
    if not unit.get("files"):
        return False, "no files"
    for row in hashing.hash_unit(Path(run_dir), unit):
        errs = [f for f in json.loads(row["findings_json"]) if f["severity"] == "error"]
        if errs:
            return False, f"{errs[0]['kind']}: {errs[0]['message']}"
        if row["verified"] is not True:
            return False, f"{row['file']} has no SHA-256 sidecar or manifest entry to verify it against"
    return True, ""


def _metric_of(run_dir: Path, unit: Dict[str, Any], metric: str) -> Optional[float]:
    """``metrics[metric]`` from the unit's manifest, or None."""
    if not unit.get("manifest"):
        return None
    try:
        doc = fs.loads_json((run_dir / unit["manifest"]).read_text())
        v = (doc.get("metrics") or {}).get(metric)
        return float(v) if isinstance(v, (int, float)) else None
    except (OSError, ValueError, AttributeError):
        return None


def stale_leftovers(run_dir: Path) -> List[Tuple[str, str]]:
    """(name, why) of temp leftovers in ``run_dir`` whose writer on this host is gone
    (:func:`ckptaudit._io.dead_writer`)."""
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return []
    out = []
    for n in names:
        pid = dead_writer(n)
        if pid is not None:
            out.append((n, f"leftover of process {pid} on this host, which is gone"))
    return out


def sweep_dead_writers(run_dir: Path) -> List[str]:
    """Remove the temp leftovers of ``run_dir`` whose writer on this host is gone (never another host's, never a
    live process's); returns their names.  :func:`ckptaudit.publish.publish` calls it before each save, so a
    run killed mid-save keeps at most one leftover: the last killed save's, until the next save."""
    gone = []
    for n, why in stale_leftovers(run_dir):
        remove_tree_quiet(run_dir / n)
        log.info("%s: removed %s (%s)", run_dir, n, why)
        gone.append(n)
    return gone


def _ours(p: Path, target: str, what: str) -> Optional[os.stat_result]:
    """The ``lstat`` of ``p`` when it is a small regular file in exactly our format naming ``target`` (a
    ``sha256sum`` line, or a ``ckptaudit.manifest/1`` or ``/2`` whose ``unit`` is it: ``what`` says which),
    else None."""
    from ..formats.sidecar import parse_sidecar

    try:
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode) or st.st_size > (1 << 20):
            return None
        text = p.read_text(errors="replace")
    except OSError:
        return None
    if what == "manifest":
        try:
            doc = fs.loads_json(text)
        except ValueError:
            return None
        return st if isinstance(doc, dict) and doc.get("schema") in SCHEMAS_READ and doc.get("unit") == target else None
    entries, err = parse_sidecar(text)
    return st if not err and list(entries) == [target] else None


def _orphan_integrity_files(run_dir: Path, swept: frozenset = frozenset()) -> Dict[str, Tuple[str, Tuple[int, int]]]:
    """{name: (why, (st_ino, st_mtime_ns))} of sidecars and manifests this module wrote for
    a file unit that is not there and is not being written.  ``swept``: temp names the same prune removes (their
    writers are gone, :func:`stale_leftovers`): a temp of ``X`` among them is no write in flight, so ``X``'s
    sidecar goes in the same sweep (a save killed inside its manifest write leaves ``X.sha256``, its data temp
    and its manifest temp: one ``--sweep-stale`` removes all three).

    A file publish writes ``X.sha256`` and ``X.manifest.json`` before it renames its temp
    file to ``X`` (see :func:`publish`), and :func:`_delete_unit` removes them after the
    unit; a kill in between leaves them behind.  Only files in exactly our format are
    candidates (a single ``sha256sum`` line naming ``X``; a ``ckptaudit.manifest/1`` or ``/2`` whose
    ``unit`` is ``X``), only when neither ``X`` nor any temp file of ``X`` (from any host)
    exists, and only for names with a step.  The stat key lets the caller skip a file that
    a new publish of ``X`` replaced in the meantime."""
    try:
        names = sorted(os.listdir(run_dir))
    except OSError:
        return {}
    in_flight = {m.group(4) for n in names if n not in swept and (m := TMP_RE.match(n))}
    present = set(names)
    out: Dict[str, Tuple[str, Tuple[int, int]]] = {}
    for n in names:
        if n.endswith(SIDECAR_SUFFIX):
            target, what = n[: -len(SIDECAR_SUFFIX)], "SHA-256 sidecar"
        elif n.endswith(".manifest.json"):
            target, what = n[: -len(".manifest.json")], "manifest"
        else:
            continue
        if not target or target in present or target in in_flight or step_from_name(target) is None:
            continue
        st = _ours(run_dir / n, target, what)
        if st is None:
            continue
        out[n] = (f"{what} of {target}, which does not exist and is not being written (a save or delete "
                  "that was killed between the two)", (st.st_ino, st.st_mtime_ns))
    return out


def _delete_unit(run_dir: Path, unit: Dict[str, Any], clock: Clock) -> None:
    """Delete a unit without ever leaving a torn one: rename it to a temp name (in progress
    for the audit), fsync the folder, then remove it and, for a file unit, its sidecars and
    manifest."""
    src = run_dir / unit["unit"]
    parent = src.parent
    tmp = parent / tmp_name(src.name)
    rename_nfs_safe(src, tmp)
    fsync_dir(parent, clock)
    if unit["kind"] == "file":
        for extra in list(unit.get("sidecars", [])) + ([unit["manifest"]] if unit.get("manifest") else []):
            unlink_quiet(run_dir / extra)
    remove_tree_quiet(tmp)
    fsync_dir(parent, clock)


def prune(run_dir: str | os.PathLike, *, keep_last: Optional[int] = None, keep_every: Optional[int] = None,
          keep_best: Optional[int] = None, metric: Optional[str] = None, mode: str = "min",
          sweep_stale: bool = False, dry_run: bool = False, echo: Optional[Callable[[str], None]] = print,
          _verified: Optional[set] = None) -> PrunePlan:
    """Delete old checkpoint units of ``run_dir`` by retention rules; return the plan.

    Kept: the ``keep_last`` newest *verified* units (by step), every unit whose step is a
    multiple of ``keep_every``, the ``keep_best`` verified units with the best
    ``metrics[metric]`` in their manifest (``mode`` ``"min"`` or ``"max"``), the rollback
    point (the newest unit that verifies) and the unit ``latest`` names.  Verified means
    complete (a folder has its ``COMPLETE`` marker, no file is missing) and every byte
    matches the unit's manifest or sidecar digests (:func:`verify_unit`).  A unit that does
    not verify (truncated, a flipped byte, a file or the marker gone) never counts towards
    ``keep_last``/``keep_best``, so it can never push an intact unit out, and it is never
    deleted either: it is the evidence of what went wrong, kept for the audit, and the plan
    says why.  Deleted: only units that are complete, verified and of an older step than
    the rollback point and kept by no rule; anything in progress or without a step is
    kept.  ``sweep_stale``: also remove ``.ckptaudit-tmp-*`` leftovers whose writer
    process on this host is gone, and sidecars/manifests of file units that no longer
    exist and are not being written (:func:`_orphan_integrity_files`).  ``dry_run``: delete nothing, and
    ``echo`` each line of what would be deleted (``echo=None`` prints nothing).

    With ``sweep_stale`` and no keep rule, only the leftovers are removed: every unit is kept, and none is
    verified (nothing of a unit is read).

    Raises ``ValueError`` without any keep rule (and no ``sweep_stale``) or with a bad value, and
    ``FileNotFoundError`` for a missing ``run_dir``.
    """
    from ..discovery import discover

    sweep_only = sweep_stale and keep_last is None and keep_every is None and keep_best is None
    if not sweep_only:
        _check_rules(keep_last, keep_every, keep_best, metric, mode)
    root = Path(run_dir)
    units, pointers, _ = discover(root)
    trusted = set(_verified or ())
    by_name = {u.unit: u.to_dict() for u in units}
    stepped = sorted((u for u in by_name.values() if u["step_from_name"] is not None and u["unit"] != "."),
                     key=lambda u: (u["step_from_name"], u["mtime_ns"]), reverse=True)
    stale = dict(stale_leftovers(root)) if sweep_stale else {}
    orphans = _orphan_integrity_files(root, swept=set(stale)) if sweep_stale else {}
    verified: Dict[str, Tuple[bool, str]] = {}

    def check(u) -> Tuple[bool, str]:
        if u["unit"] not in verified:
            verified[u["unit"]] = (True, "") if u["unit"] in trusted and not u["in_progress"] else \
                verify_unit(root, u)
        return verified[u["unit"]]

    if sweep_only:
        rollback = None
        decisions = [PruneDecision(u["unit"], u["step_from_name"], "keep", "no keep rule: --sweep-stale alone "
                                   "removes only leftovers") for u in stepped if u["unit"] not in stale]
    else:
        rollback = next((u for u in stepped if not u["in_progress"] and check(u)[0]), None)
        keep = _kept_by_rules(root, stepped, by_name, pointers, rollback, check, keep_last=keep_last,
                              keep_every=keep_every, keep_best=keep_best, metric=metric, mode=mode)
        decisions = [_decision(u, keep, rollback, check) for u in stepped if u["unit"] not in stale]
    for u in by_name.values():
        if (u["step_from_name"] is None or u["unit"] == ".") and u["unit"] not in stale:
            decisions.append(PruneDecision(u["unit"], None, "keep", "no step in its name"))
    for n, why in stale.items():
        decisions.append(PruneDecision(n, None, "sweep", why))
    for n, (why, _) in orphans.items():
        decisions.append(PruneDecision(n, None, "sweep", why))
    plan = PrunePlan(root, rollback["unit"] if rollback else None, decisions, dry_run)
    _carry_out(plan, by_name, orphans, echo)
    return plan


def _check_rules(keep_last: Optional[int], keep_every: Optional[int], keep_best: Optional[int],
                 metric: Optional[str], mode: str) -> None:
    """Raise ``ValueError`` for no keep rule, a count below 1, ``keep_best`` without a metric, or a bad mode."""
    if keep_last is None and keep_every is None and keep_best is None:
        raise ValueError("prune needs at least one of keep_last, keep_every, keep_best")
    for k, v in (("keep_last", keep_last), ("keep_every", keep_every), ("keep_best", keep_best)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{k} must be an int >= 1, got {v!r}")
    if keep_best is not None and not metric:
        raise ValueError("keep_best needs metric= (a key of the metrics given to publish)")
    if mode not in ("min", "max"):
        raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")


def _kept_by_rules(root: Path, stepped: List[dict], by_name: Dict[str, dict], pointers, rollback: Optional[dict],
                   check: Callable[[dict], Tuple[bool, str]], *, keep_last: Optional[int], keep_every: Optional[int],
                   keep_best: Optional[int], metric: Optional[str], mode: str) -> Dict[str, str]:
    """{unit: why it is kept} by the rules, the rollback point and the pointers (the first reason wins)."""
    complete = [u for u in stepped if not u["in_progress"] and not u.get("missing_files")]
    keep: Dict[str, str] = {rollback["unit"]: "rollback point (newest verified unit)"} if rollback else {}
    for p in (p for p in pointers if p.resolved in by_name):
        keep.setdefault(p.resolved, f"named by {p.path}")
    if keep_last:  # counts verified units only: a damaged newest unit never pushes an intact one out
        for u in [u for u in complete if check(u)[0]][:keep_last]:
            keep.setdefault(u["unit"], f"one of the {keep_last} newest (keep_last)")
    if keep_every:
        for u in complete:
            if u["step_from_name"] % keep_every == 0:
                keep.setdefault(u["unit"], f"step is a multiple of {keep_every} (keep_every)")
    if keep_best and metric:
        for v, u in _best(root, complete, check, metric, mode)[:keep_best]:
            keep.setdefault(u["unit"], f"{metric}={v:g} is among the {keep_best} best (keep_best)")
    return keep


def _best(root: Path, units: List[dict], check: Callable[[dict], Tuple[bool, str]], metric: str,
          mode: str) -> List[Tuple[float, dict]]:
    """``(metrics[metric], unit)`` of the verified ``units`` whose manifest records it, best first (``mode``)."""
    scored = [(v, u) for u in units if (v := _metric_of(root, u, metric)) is not None and check(u)[0]]
    scored.sort(key=lambda t: t[0], reverse=(mode == "max"))
    return scored


def _decision(u: dict, keep: Dict[str, str], rollback: Optional[dict],
              check: Callable[[dict], Tuple[bool, str]]) -> PruneDecision:
    """Keep or delete one unit with a step: deleted only when verified, older than the rollback point and kept
    by no rule."""
    name, step = u["unit"], u["step_from_name"]
    if name in keep:
        return PruneDecision(name, step, "keep", keep[name])
    if u["in_progress"]:
        return PruneDecision(name, step, "keep", f"in progress ({u['in_progress']}); not a unit to prune")
    if rollback is None:
        return PruneDecision(name, step, "keep", "no unit verifies, so there is no rollback point to protect; "
                                                 "nothing is deleted")
    if not check(u)[0]:
        return PruneDecision(name, step, "keep", f"does not verify ({check(u)[1]}); left for the audit and not "
                                                 "counted by any keep rule")
    if step >= rollback["step_from_name"]:
        return PruneDecision(name, step, "keep", f"not older than the rollback point {rollback['unit']}")
    return PruneDecision(name, step, "delete", f"verified, older than the rollback point {rollback['unit']}, "
                                               "kept by no rule")


def _carry_out(plan: PrunePlan, by_name: Dict[str, dict], orphans: Dict[str, tuple],
               echo: Optional[Callable[[str], None]]) -> None:
    """Delete what ``plan`` deletes and sweeps (or, on a dry run, ``echo`` it), each with its directory fsync."""
    root, clock = plan.run_dir, Clock()
    for d in plan.decisions:
        if d.action == "keep":
            continue
        if plan.dry_run:
            if echo is not None:
                echo(f"would delete {d.unit}" + (f" (step {d.step})" if d.step is not None else "") + f": {d.reason}")
            continue
        if d.action == "delete":
            _delete_unit(root, by_name[d.unit], clock)
        elif d.unit in orphans:
            try:  # a publish of the same unit may have replaced it since the listing: leave that one
                st = os.lstat(root / d.unit)
                if (st.st_ino, st.st_mtime_ns) != orphans[d.unit][1]:
                    continue
            except OSError:
                continue
            unlink_quiet(root / d.unit)
        else:
            remove_tree_quiet(root / d.unit)
        log.info("%s: deleted %s (%s)", root, d.unit, d.reason)
