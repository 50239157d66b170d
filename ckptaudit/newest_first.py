"""The reader's search: the audit's judgement of a run, paying tensor bytes only for the units it examines.

:func:`ckptaudit.safe_load_checkpoint` needs one answer — the unit the full audit would name as its
rollback point — at every resume.  Auditing the whole run for it hashes every byte of every kept
checkpoint (issue 23: 4.0 × SHA-256 + ``torch.load`` of the newest unit on a run of four).  :func:`search`
reaches the same answer in two passes:

1. **The run, by its metadata.**  The inventory (names, sizes, pointers), then the scan, config diff,
   structure and state stages over every unit at :data:`ckptaudit.fs.read_depth.METADATA_ONLY` and with
   ``state.nan_scan`` off: zip central directories and local headers, data.pkl and its static walk
   (security included), safetensors headers, JSON files — never a zip record's CRC32, a SHA-256, a load
   or a value scan.  This is what the run-level judgements need (step continuity, scheduler cadence, a
   unit written after a newer one, pointers, Lightning's ``last.ckpt``).
2. **The candidates, by every byte.**  The verdict is built (:func:`ckptaudit.verdict.build`) and its
   rollback chosen (:func:`choose`).  While the chosen unit has not been examined,
   it is: the hash stage (SHA-256 against its sidecar or manifest, or the manifest's chunk digests; no
   SHA-256 where nothing records one, :data:`ckptaudit.fs.read_depth.CHECKED_DIGESTS_ONLY`; the CRC32 of
   every zip record, the value statistics), then scan (a record that fails its CRC32 is not read again for its
   NUL runs), load test, config diff, structure and state with those facts, as the audit runs them (in the
   reader, the load test of a torch zip or safetensors file is the load it returns, done once in the caller's
   process: :mod:`ckptaudit.stages.load.reader`); its rows replace its metadata rows and the verdict is built
   again.  A unit whose full check fails drops out, and the next rollback is examined.
   The newest unit's hash stage starts on a thread before pass 1 (:class:`_Ahead`): it is the first choice
   unless its metadata fails, and the two passes overlap (Python for the metadata, GIL-free hashing for the
   bytes); when the first choice is another unit, that pass is stopped.

A unit that fails on its metadata is never read further: the full checks only add findings to what the
metadata pass saw, so the first unit that passes both is the audit's rollback point.  Bytes read: the
metadata of every unit, plus all bytes of the units examined (the rollback point and the newer units
whose metadata passed but whose bytes did not).

What the reader does not see, and the audit does: bit rot, a failing load or non-finite values in units
older than the one it returns (they would not change that answer), and the ``weight_norm_jump`` warning,
which compares value statistics of neighbouring units.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Tuple

#: The stage tables a unit has rows in, in the order the verdict reads findings (``ckptaudit.stages.TABLES``'s
#: stages; tests/test_architecture.py holds them equal: importing the stages here would load them for every reader).
TABLES = ("hash", "scan", "load", "structure", "configdiff", "state")


def _paths(out: Path, part: str) -> Dict[str, str]:
    parts = out / "tables" / "parts"
    return {s: str(parts / s / f"{part}.parquet") for s in (*TABLES, "tensors", "imports")}


def _metadata_pass(inv: dict, cfg: dict, out: Path, target_path: str) -> Dict[str, Dict[str, dict]]:
    """{table: {unit: row}} of the scan, configdiff, structure and state stages over every unit, metadata only."""
    from .fs import read_depth
    from . import tables
    from .stages import cli as stages

    meta_inv = {**inv, "parts": {"metadata": [u["unit"] for u in inv["units"]]}}
    meta_cfg = {**cfg, "state": {**(cfg.get("state") or {}), "nan_scan": False}}
    p = _paths(out, "metadata")
    stages.stage_scan(meta_inv, "metadata", meta_cfg, p["scan"], p["tensors"], p["imports"],
                      depth=read_depth.METADATA_ONLY)
    stages.stage_structure(meta_inv, "metadata", meta_cfg, p["scan"], p["tensors"], p["structure"], target_path)
    stages.stage_configdiff(meta_inv, "metadata", meta_cfg, p["scan"], p["configdiff"])
    stages.stage_state(meta_inv, "metadata", meta_cfg, p["scan"], p["tensors"], p["state"])
    return {t: {r["unit"]: r for r in tables.read_rows(p[t])} for t in ("scan", "configdiff", "structure", "state")}


def _part(unit: str) -> str:
    """The scratch part name of the byte-by-byte check of ``unit`` (a file name, whatever the unit is called)."""
    import hashlib

    return "unit-" + hashlib.sha256(unit.encode()).hexdigest()[:16]


class _Ahead:
    """The hash stage of the unit the search will most likely examine first (the newest one not being written),
    run on a thread while the run's units are judged by their metadata: the pass is hashing, CRC32 and numpy,
    which release the GIL, and the metadata pass is Python, so on two cores the two overlap.  Its bytes are those
    of a unit no older than the rollback point (the newest), which the search reads anyway when that unit is the
    rollback point or a unit it rejects after reading it.  When the search's first choice is another unit (the
    newest failed on its metadata: a save cut short), the pass is stopped at its next buffer
    (the ``stop`` event of :func:`ckptaudit.onepass.stream.run`) and its rows are never used."""

    def __init__(self, inv: dict, out: Path, skip, loads=None) -> None:
        import threading

        from .fs import read_depth
        from .stages import cli as stages

        live = [u for u in inv["units"] if not u.get("in_progress") and u["unit"] not in skip]
        self.unit = live[-1]["unit"] if live and _ends_whole(inv["run_dir"], live[-1]) else None
        self._stop = threading.Event()
        self._error: List[BaseException] = []
        self._thread = None
        if self.unit is None:
            return
        part = _part(self.unit)
        one = {**inv, "parts": {part: [self.unit]}}
        if loads is not None:  # the files' identity before their bytes are read: the load must find the same
            loads.pin(inv["run_dir"], live[-1])

        def run() -> None:
            try:
                stages.stage_hash(one, part, _paths(out, part)["hash"], depth=read_depth.CHECKED_DIGESTS_ONLY,
                                  stop=self._stop)
            except BaseException as e:  # noqa: BLE001 - raised again where the search would have raised it
                self._error.append(e)

        self._thread = threading.Thread(target=run, name="ckptaudit-hash-ahead", daemon=True)
        self._thread.start()

    def take(self, unit: str) -> bool:
        """True when ``unit``'s hash stage ran ahead to its end (waits for it; raises what it raised)."""
        if self._thread is None or unit != self.unit or self._stop.is_set():
            return False
        self._thread.join()
        if self._error:
            raise self._error[0]
        return True

    def stop(self) -> None:
        """Abandon the pass (when the search chose another unit first) and wait for its thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


#: A unit with more files than this is not read ahead (its tails would cost a read each).
AHEAD_MAX_FILES = 16


def _ends_whole(run_dir: str, unit: dict) -> bool:
    """Whether ``unit`` may be read ahead: a local unit of at most :data:`AHEAD_MAX_FILES` regular files inside
    the run, each zip among them (``PK\\x03\\x04`` first) ending with its end-of-central-directory record
    (``PK\\x05\\x06`` 22 bytes before the end: torch.save's writer adds no zip comment).  A save cut short
    fails it, and the metadata pass, which walks a cut zip's records, is then its only reader."""
    import stat

    from . import confine, fs
    from .formats.zip.reader import SIG_EOCD, SIG_LOCAL

    if fs.is_remote(run_dir) or len(unit["files"]) > AHEAD_MAX_FILES:
        return False
    for rel in unit["files"]:
        if confine.resolved_outside(run_dir, rel):
            return False
        try:
            fd = os.open(os.path.join(run_dir, rel), os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return False
            if st.st_size >= 22 and fs.pread(fd, 4, 0) == SIG_LOCAL and fs.pread(fd, 4, st.st_size - 22) != SIG_EOCD:
                return False
        finally:
            os.close(fd)
    return True


def _examine(inv: dict, unit: str, cfg: dict, out: Path, target_path: str,
             loads=None, ahead: "_Ahead | None" = None) -> Dict[str, List[dict]]:
    """{table: rows of ``unit``} from every stage, in the audit's order, reading all of its bytes.  ``loads``: the
    reader's loader (:class:`ckptaudit.stages.load.reader.ReaderLoads`), which keeps what it loaded of ``unit`` only;
    ``ahead``: a hash stage already started (:class:`_Ahead`), used when it is of ``unit``.  ``loads`` is told the
    identity of ``unit``'s files before the hash stage reads them (``ReaderLoads.pin``): it loads what was verified."""
    from .fs import read_depth
    from . import tables
    from .stages import cli as stages

    if loads is not None:
        loads.drop()  # the unit examined before was passed over: its objects go

    part = _part(unit)
    one = {**inv, "parts": {part: [unit]}}
    p = _paths(out, part)
    if ahead is None or not ahead.take(unit):
        if loads is not None:  # the files' identity before their bytes are read: the load must find the same
            loads.pin(inv["run_dir"], next(u for u in inv["units"] if u["unit"] == unit))
        stages.stage_hash(one, part, p["hash"], depth=read_depth.CHECKED_DIGESTS_ONLY)
    stages.stage_scan(one, part, cfg, p["scan"], p["tensors"], p["imports"], depth=read_depth.CHECKED_DIGESTS_ONLY)
    stages.stage_load(one, part, cfg, p["scan"], p["load"], loader=loads)
    stages.stage_structure(one, part, cfg, p["scan"], p["tensors"], p["structure"], target_path)
    stages.stage_configdiff(one, part, cfg, p["scan"], p["configdiff"])
    stages.stage_state(one, part, cfg, p["scan"], p["tensors"], p["state"])
    return {t: tables.read_rows(p[t]) for t in TABLES}


def prior_rows(audit: str | Path, inv: dict) -> Dict[str, Dict[str, List[dict]]]:
    """{unit: {table: its rows}} from a finished audit (its output folder, or the ``verdict.json`` in it) for
    every unit of ``inv`` (the run as it is now) that the audit covered and that has not changed since:
    the same files, each with the same size, mtime and inode (the inventory's snapshot).

    Raises ``FileNotFoundError`` when the folder holds no finished audit and ``ValueError`` when the audit
    was of another run folder."""
    import json

    from . import tables

    root = Path(audit)
    if root.name == "verdict.json":
        root = root.parent
    inv_path, verdict_path = root / "work" / "inventory.json", root / "verdict.json"
    if not inv_path.is_file() or not verdict_path.is_file():
        raise FileNotFoundError(f"{audit}: not a finished audit's output folder (no verdict.json and "
                                "work/inventory.json)")
    old = json.loads(inv_path.read_text())
    if Path(old["run_dir"]).resolve() != Path(inv["run_dir"]).resolve():
        raise ValueError(f"{audit} is an audit of {old['run_dir']}, not of {inv['run_dir']}")
    before = {u["unit"]: u for u in old["units"]}
    same = {u["unit"] for u in inv["units"] if u["unit"] in before and u.get("snapshot")
            and list(before[u["unit"]]["files"]) == list(u["files"])
            and before[u["unit"]].get("snapshot") == u["snapshot"]}
    out: Dict[str, Dict[str, List[dict]]] = {u: {t: [] for t in TABLES} for u in same}
    for t in TABLES:
        p = root / "tables" / f"{t}.parquet"
        if not p.is_file():
            raise FileNotFoundError(f"{audit}: the audit's {t} table is missing ({p})")
        for r in tables.read_rows(p):
            if r["unit"] in out:
                out[r["unit"]][t].append(r)
    return out


def search(run_dir: str | Path, cfg: dict, out: Path, audit: str | Path | None = None, loads=None
           ) -> Tuple[dict, dict, Dict[str, Dict[str, dict]], List[str]]:
    """(verdict, inventory, {"scan"/"state": {unit: row}}, units examined byte by byte, in the order examined)
    for the run at ``run_dir``; ``cfg``: a full stage config (:func:`ckptaudit.pipeline.merged_config`);
    ``out``: a scratch folder for the stage tables.  With ``audit`` (a finished audit's output folder), the
    units it covered that have not changed since (:func:`prior_rows`) are judged by its rows instead of
    their metadata; the unit returned is still examined byte by byte.  ``loads``: the load stage's loader for
    the examined units (:class:`ckptaudit.stages.load.reader.ReaderLoads`: the reader's load test is its final load).
    Raises what the inventory raises for a missing or unreadable run folder, ``ValueError`` for a folder of
    several runs (:func:`ckptaudit.stages.inventory.run_folder.check_one_run`), and what :func:`prior_rows` raises."""
    from .stages import cli as stages
    from .stages import target
    from .stages.inventory.run_folder import check_one_run

    work = out / "work"
    inv = stages.stage_inventory(str(run_dir), "auto", str(out / "tables" / "inventory.parquet"),
                                 str(work / "inventory.json"), str(work / "pointers.parquet"))
    check_one_run(inv)  # a folder of several runs has no one rollback point
    target_path = str(work / "target.json")
    target.write(cfg, target_path)
    prior = prior_rows(audit, inv) if audit is not None else {}
    ahead = _Ahead(inv, out, prior, loads)
    try:
        return _judge(inv, cfg, out, target_path, prior, loads, ahead)
    finally:
        ahead.stop()  # never leave a pass reading the run (or writing the scratch folder) behind


def _judge(inv: dict, cfg: dict, out: Path, target_path: str, prior: dict, loads, ahead: _Ahead) -> tuple:
    """:func:`search` once the inventory is made and the newest unit's pass is under way (``ahead``)."""
    from . import verdict

    todo = {**inv, "units": [u for u in inv["units"] if u["unit"] not in prior]}
    meta = _metadata_pass(todo, cfg, out, target_path) if todo["units"] else {}
    inv_units = {u["unit"]: u for u in inv["units"]}
    full: Dict[str, Dict[str, List[dict]]] = {}  # unit -> table -> its rows from the byte-by-byte check
    while True:
        tbl: Dict[str, List[dict]] = {t: [] for t in TABLES}
        for u in inv["units"]:
            name = u["unit"]
            for t in TABLES:
                if name in full:
                    tbl[t].extend(full[name][t])
                elif name in prior:
                    tbl[t].extend(prior[name][t])
                elif name in meta.get(t, {}):
                    tbl[t].append(meta[t][name])
        v = verdict.build(inv, tbl, cfg)
        state_rows = {r["unit"]: r for r in tbl["state"]}
        rollback, _ = choose(v, inv_units, state_rows)
        if rollback is None or rollback["unit"] != ahead.unit:
            ahead.stop()  # the newest unit is not the first choice: its pass is not needed now
        if rollback is None or rollback["unit"] in full:
            scan_rows = {r["unit"]: r for r in tbl["scan"]}
            return v, inv, {"scan": scan_rows, "state": state_rows}, list(full)
        full[rollback["unit"]] = _examine(inv, rollback["unit"], cfg, out, target_path, loads, ahead)


def choose(verdict: dict, inv_units: Dict[str, dict], state_rows: Dict[str, dict]) -> tuple:
    """(rollback unit of ``verdict`` as a verdict unit dict or None, {newer unit: why it is passed over}).

    The verdict's own rule (:func:`ckptaudit.verdict.decide`: newest ``resume`` unit,
    else newest ``warm-start`` unit; ``verdict["units"]`` is in save order) over the
    units that also hold model weights (state layer ``has_weights``); reasons are listed
    newest first."""
    units = verdict["units"]
    no_weights = {u["unit"] for u in units if u["usable_for"] != "none"
                  and (state_rows.get(u["unit"]) or {}).get("has_weights") is not True}
    cands = [u for u in units if u["usable_for"] != "none" and u["unit"] not in no_weights]
    resume = [u for u in cands if u["usable_for"] == "resume"]
    rollback = resume[-1] if resume else (cands[-1] if cands else None)
    newer = units[units.index(rollback) + 1:] if rollback else units
    reasons: Dict[str, str] = {}
    for u in reversed(newer):
        reasons[u["unit"]] = _why_not(u, inv_units.get(u["unit"]) or {}, u["unit"] in no_weights)
    return rollback, reasons


_LAYER_ORDER = {"file": 0, "security": 1, "structure": 2, "state": 3}  # cheap first, as the stages run


def _why_not(u: dict, inv_unit: dict, no_weights: bool) -> str:
    """One line: why verdict unit ``u`` is not the rollback point."""
    if inv_unit.get("in_progress"):
        return f"in-progress save ({inv_unit['in_progress']})"
    errs = sorted((f for f in u["findings"] if f["severity"] == "error"),
                  key=lambda f: _LAYER_ORDER.get(f["layer"], 9))
    if errs:
        return f"{errs[0]['kind']}: {errs[0]['message']}"
    if no_weights:
        return "no_model_weights: the audit found no model weights in this unit (nothing to load)"
    if u["usable_for"] != "resume":
        capped = [f for f in u["findings"] if f.get("caps") not in (None, "resume")] or u["findings"]
        if capped:
            return f"usable for {u['usable_for']} only: {capped[0]['kind']}: {capped[0]['message']}"
        return f"usable for {u['usable_for']} only"
    return "not chosen by the audit"


__all__ = ["search", "choose"]
