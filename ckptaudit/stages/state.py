"""State layer, per unit: components present and sound, counters consistent,
values finite.

The value statistics of every floating tensor of the weights and optimizer moments
(non-finite count, norm; :mod:`ckptaudit.onepass.values`) come from the hash stage's one
pass over the file (:mod:`ckptaudit.onepass.facts`); a tensor it did not cover is streamed
here from the file's bytes (offsets from the static scan), ``chunk_mib`` at a time into one
reused buffer, so memory stays bounded whatever the checkpoint size; torch is not imported.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .. import components as C
from .. import findings as F
from .. import roles
from ..components.findings import missing_weights, step_counter_reset
from ..components.run_needs import RunNeeds, judged
from ..formats.pickles import too_complex
from .. import fs
from ..onepass.values import FLOAT_DTYPES, chunk_stats, np_view
from .weight_norms import WeightNorms, norms_json
from .context import Part, StageContext
from .rows import EarlierRows, StateRow, StateRows, findings_of


def scan_values(run_dir: Path, tensors: List[dict], chunk_bytes: int, facts=None) -> Dict[str, dict]:
    """Value statistics of tensors: {tensor name: {"nonfinite": n, "norm": l2, "short": bool}}, as
    :func:`value_stats` gives them (a dict per tensor: for a caller that wants them all at once)."""
    return {t["name"]: {"nonfinite": bad, "norm": norm, "short": short}
            for t, (bad, norm, short) in value_stats(run_dir, tensors, chunk_bytes, facts)}


def value_stats(run_dir: Path, tensors: Iterable[dict], chunk_bytes: int, facts=None
                ) -> Iterator[Tuple[dict, Tuple[int, float, bool]]]:
    """``(tensor row, (non-finite count, L2 norm, short))`` of each floating tensor of ``tensors`` (rows with
    ``file``, ``name``, ``dtype``, ``data_offset``, ``nbytes``): from the hash stage's one pass where ``facts``
    (:class:`ckptaudit.onepass.facts.ByteFacts`) has them, else streamed from the tensor's bytes (``short``:
    the file ended first; a remote object's bytes the pass kept, ``facts.kept``, are served, not fetched).

    Per run of rows of one file (the tensors table holds a file's tensors together), the tensors the pass
    answered come first, then the others in file order.  Tensors sharing bytes (tied weights) are read once.
    Tensors whose offset is unknown (−1) are skipped.  Memory: one ``chunk_bytes`` buffer plus numpy
    temporaries of the same order, and a reference per tensor that the pass did not answer — nothing per
    answered tensor, and ``tensors`` is read once, as it comes (issue 22: 100,000 tensors in one file).  The
    buffer is made only when a tensor is read, no larger than the largest such tensor (a unit the pass answered
    whole costs no ``chunk_bytes`` allocation: issue 45, 16 MiB zeroed per small unit was most of its cost)."""
    buf = _ChunkBuffer(chunk_bytes)
    kept = None if facts is None else facts.kept
    rel, path, left = None, "", []
    for t in tensors:
        if not (t["dtype"] in FLOAT_DTYPES and t["data_offset"] is not None and t["data_offset"] >= 0
                and t["nbytes"]):
            continue
        if t["file"] != rel:
            if left:
                yield from _read_values(run_dir / rel, left, buf, kept)
            rel, path, left = t["file"], fs.fspath(run_dir / t["file"]), []
        v = None if facts is None else facts.values_of(path, t["data_offset"], t["nbytes"], t["dtype"])  # the pass's
        if v is not None and v[2] == t["nbytes"]:
            yield t, (v[0], math.sqrt(v[1]), False)
        else:
            left.append(t)
    if left:
        yield from _read_values(run_dir / rel, left, buf, kept)


class _ChunkBuffer:
    """The read buffer of :func:`value_stats`: at most ``chunk_bytes``, made on first use and grown (up to
    ``chunk_bytes``) only when a larger tensor is read."""

    __slots__ = ("chunk_bytes", "buf")

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self.buf = bytearray()

    def for_tensors(self, ts: List[dict]) -> bytearray:
        want = min(self.chunk_bytes, max(max((t["nbytes"] for t in ts), default=1), 8))
        if len(self.buf) < want:
            self.buf = bytearray(want)
        return self.buf


def _read_values(path, ts: List[dict], chunks: _ChunkBuffer, kept=None) -> Iterator[Tuple[dict, Tuple[int, float, bool]]]:
    """:func:`value_stats` of tensors ``ts`` of one file, read from its bytes through ``chunks``' buffer (answered
    from ``kept`` first: bytes of a remote object already read)."""
    try:
        fh = fs.open_binary(path, block_size=fs.STREAM_BLOCK_BYTES, kept=kept)
    except OSError:
        return
    buf = chunks.for_tensors(ts)
    seen: Dict[Tuple[int, int, str], Tuple[int, float, bool]] = {}
    with fh:
        for t in sorted(ts, key=lambda x: x["data_offset"]):
            key = (t["data_offset"], t["nbytes"], t["dtype"])
            if key in seen:
                yield t, seen[key]
                continue
            item = 1 if t["dtype"].startswith("float8") else {"float64": 8, "float32": 4}.get(t["dtype"], 2)
            step = max(item, (len(buf) // item) * item)
            bad, sq, left = 0, 0.0, t["nbytes"]
            fh.seek(t["data_offset"])
            short = False
            while left > 0:
                n = min(step, left)
                mv = memoryview(buf)[:n]
                got = fh.readinto(mv)
                if got != n:
                    short = True
                    break
                b, s = chunk_stats(np_view(mv, t["dtype"]), t["dtype"])
                bad += b
                sq += s
                left -= n
            seen[key] = (bad, math.sqrt(sq), short)
            yield t, seen[key]


def _file_matches(tensor_file: str, fkey: str) -> bool:
    return fkey == "root" or tensor_file == fkey or tensor_file.endswith("/" + fkey)


def _under(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(prefix + ".")


def tensor_role(t: dict, c: C.Components) -> str:
    """``weights``, ``optimizer`` (moments) or ``other`` for one tensor row of a unit.

    Roles come from where the structural recognition found the components
    (``c.weights_at``, ``c.optimizer_at``); other float tensors (callback
    sentinels such as Lightning's ``kth_value = inf``, metrics, RNG) are
    counted, never judged as weights.
    """
    for fkey, prefix in c.optimizer_at:
        if _file_matches(t["file"], fkey) and _under(t["name"], prefix):
            return "optimizer"
    for fkey, prefix in c.weights_at:
        if _file_matches(t["file"], fkey) and _under(t["name"], prefix):
            return "weights"
    return "other"


def analyse_unit(unit: dict, scan_row: dict, tensors: Iterable[dict], run_dir: Path, cfg: dict,
                 byte_facts=None, parsed: Optional[Callable[[], tuple]] = None,
                 scan_findings: Optional[Sequence[F.Finding]] = None) -> StateRow:
    """One row of the ``state`` table (with its findings) for a unit; ``tensors`` (its rows of the tensors
    table) is iterated once, as it comes; ``byte_facts``: the hash stage's
    (:class:`ckptaudit.onepass.facts.ByteFacts`), which answer for the value statistics it computed; ``parsed``:
    gives the scan row's (components, tree, facts) already parsed (default: :func:`ckptaudit.components.of_scan_row`);
    ``scan_findings``: the scan's findings on the unit as values (default: parsed from the row's ``findings_json``)."""
    scfg = cfg.get("state", {})
    row: dict = {"unit": unit["unit"]}  # the row's columns as they are decided
    fl: List[F.Finding] = []
    parse = parsed or (lambda: C.of_scan_row(scan_row))  # (components, tree, facts), parsed once
    tree = parse()[1] if parsed else json.loads(scan_row.get("tree_json") or "{}")
    if scan_findings is None:
        scan_findings = findings_of(scan_row.get("findings_json"))
    cut = too_complex(scan_findings)  # the walk or its tree gave up: the tree is partial
    if not roles.weights_intact(scan_row) or not tree:
        row.update(step=unit.get("step_from_name"), step_source="name" if unit.get("step_from_name") is not None else "")
        if tree and _pickle_proven(scan_findings):  # the damage lies in tensor bytes; the counters were read intact
            c = parse()[0]
            if c.step is not None:
                row.update(step=c.step, step_source=c.step_source)
        scan_errors = [f for f in scan_findings if f.severity == "error"]
        if not tree and not scan_errors and not cut:  # an empty folder, or one with only metadata: nothing to resume from
            row.update(has_weights=False)
            fl.append(missing_weights(unit["unit"], "none"))
        return StateRow(**row, run_needs_json=RunNeeds(False).to_json(), findings=tuple(fl))
    c = parse()[0]
    name_step = unit.get("step_from_name") if c.name_number == "step" else None
    p = unit["unit"]
    step = c.step
    row.update(
        step=step if step is not None else name_step,
        step_source=c.step_source or ("name" if name_step is not None else ""),
        has_weights=bool(c.weights) if c.weights or not cut else None, has_optimizer=c.optimizer is not None,
        optimizer_nonempty=c.optimizer_nonempty, optimizer_step=c.optimizer_step,
        has_scheduler=c.scheduler is not None, scheduler_last_epoch=c.scheduler_last_epoch,
        has_scaler=c.scaler, has_rng=c.rng, has_sampler=c.sampler, has_ema=c.ema,
        epoch=c.epoch, best_metric=c.best_metric, loss=c.loss,
    )
    row.update(run_needs_json=RunNeeds.of(p, c, judged(row, c)).to_json())  # read by the report (run_findings)
    if not cut:  # a partial tree cannot show what is missing (the scan's pickle_too_complex says so)
        from ..components.restore_rules import missing_keys

        fl.extend(_completeness(p, c, step, name_step))
        fl.extend(missing_keys(unit, tree))  # keys the producer's resume reads from every file
    fl.extend(_counter_findings(p, c, step, name_step))
    if scfg.get("nan_scan", True) and c.weights:
        fl.extend(_value_findings(p, c, tensors, run_dir, scfg, row, byte_facts))
    return StateRow(**row, findings=tuple(fl))


#: File-layer errors confined to one record of a torch zip; with ``member`` a storage record (``…/data/<key>``),
#: data.pkl (which holds the step and the other counters) was read from bytes its own CRC32 covers.
_RECORD_DAMAGE = frozenset({"zip_crc_mismatch", "zip_member_header_corrupted", "zero_filled_span"})
_STORAGE_RECORD = re.compile(r"(^|/)data/\w+$")


def _pickle_proven(scan_findings: Sequence[F.Finding]) -> bool:
    """True when every file-layer error of a unit names a tensor storage record of a torch zip (its CRC, its local
    header, a zeroed span inside it), so the tree walked from data.pkl is the saved one: a unit whose weights are
    damaged still shows the step it records (``ckpt.pt (step 40): not usable: …``, not ``(no step)``).  Any
    other file error (a cut archive, a damaged data.pkl, a safetensors header) leaves the name's step alone."""
    errors = [f for f in scan_findings if f.layer == "file" and f.severity == "error"]
    return bool(errors) and all(f.kind in _RECORD_DAMAGE
                                and _STORAGE_RECORD.search(str((f.detail or {}).get("member", "")))
                                for f in errors)


def _completeness(p: str, c: C.Components, step: Optional[int], name_step: Optional[int]) -> List[F.Finding]:
    """Which components a faithful resume needs and the unit lacks."""
    training_state = c.optimizer is not None or c.scheduler is not None or c.step is not None
    if not c.weights:
        return [missing_weights(p, ", ".join(repr(k) for k in c.top_keys[:12]) or "none")]
    if c.weights_only_format or not training_state:
        return [F.make("weights_only_checkpoint", path=p)]
    out: List[F.Finding] = _optimizer_completeness(p, c, step)
    # a scheduler or RNG state the unit lacks is judged against the run (run_findings.missing_components):
    # a component the run never had is not missing
    if step is None:
        out.append(F.make("missing_step", path=p, name_step=name_step, repair_code="",
                          name_text=f" (the name says step {name_step})" if name_step is not None else ""))
    return out


def _optimizer_completeness(p: str, c: C.Components, step: Optional[int]) -> List[F.Finding]:
    """The optimizer state missing, empty at a step after 0 where the optimizer keeps state, or holding state
    for fewer parameters than its param groups list (an unpartitioned state only)."""
    needs = c.optimizer_needs
    if c.optimizer is None:
        return [F.make("missing_optimizer_state", path=p)]
    if not c.optimizer_nonempty and needs is not None and needs.needs_state and (step is None or step > 0):
        return [F.make("empty_optimizer_state", path=p, step=step if step is not None else "unknown",
                       optimizer=needs.name)]
    if c.optimizer_nonempty and not c.optimizer_partitioned:
        want = sum(C.group_size(g) or 0 for g in c.optimizer.get("param_groups", []))
        have = C.n_entries(c.optimizer.get("state") or {})  # the scan tree keeps 4,096 entries of a dict
        if want and have < want and (needs is None or needs.needs_state is not False):
            return [F.make("optimizer_state_incomplete", path=p, have=have, want=want)]
    return []


def _value_findings(p: str, c: C.Components, tensors: Iterable[dict], run_dir: Path, scfg: dict,
                    row: dict, byte_facts=None) -> List[F.Finding]:
    """Non-finite values and norms of the weights and optimizer moments (other tensors are only counted).

    One pass over :func:`value_stats`; what it keeps is the names with non-finite values and each weight's
    norm (the ``tensor_norms_json`` column), not a dict per tensor (issue 22).  ``n_float_tensors`` counts
    the tensors judged; a name in two files of a unit (ZeRO's per-rank partitions) is one name in the lists,
    judged by the file read last."""
    out: List[F.Finding] = []
    t0 = time.perf_counter()
    judged = (t for t in tensors if tensor_role(t, c) != "other")
    bad: Dict[str, str] = {}  # name -> role, of tensors with non-finite values
    norms = WeightNorms()  # weights' name -> norm (finite ones), as columns
    n = scanned = 0
    for t, (nonfinite, norm, _short) in value_stats(run_dir, judged, int(scfg.get("chunk_mib", 16)) << 20,
                                                    byte_facts):
        name, role = t["name"], tensor_role(t, c)
        n += 1
        scanned += t["nbytes"]
        if nonfinite:
            bad[name] = role
            norms.drop(name)
        else:
            bad.pop(name, None)
            if role == "weights":
                norms.set(name, norm)
    row["scan_seconds"] = time.perf_counter() - t0
    row["scanned_bytes"] = scanned
    row["n_float_tensors"] = n
    bad_w = sorted(k for k, r in bad.items() if r == "weights")
    bad_o = sorted(k for k, r in bad.items() if r == "optimizer")
    row["n_nonfinite_tensors"] = len(bad_w) + len(bad_o)
    row["nonfinite_tensors"] = bad_w + bad_o
    row["weight_norm"] = math.sqrt(sum(x * x for _, x in norms.items())) if norms and not bad_w else None
    row["tensor_norms_json"] = norms_json(norms)
    if bad_w:
        out.append(F.make("nan_in_weights", path=p, n_tensors=len(bad_w), examples=_examples(bad_w)))
    if bad_o:
        out.append(F.make("nonfinite_optimizer_state", path=p, examples=_examples(bad_o),
                          weights_text=" as well as the weights" if bad_w else " while the weights are finite"))
    return out


def _examples(names: List[str], n: int = 4) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def _counter_findings(p: str, c: C.Components, step: Optional[int], name_step: Optional[int]) -> List[F.Finding]:
    """Counters of one unit that contradict each other.

    Only evidence inside the unit is used: the optimizer's own per-parameter
    step counts every update since the optimizer was built, so a global step
    far below it means the global counter was reset.  A scheduler's
    ``last_epoch`` is not compared here: its cadence (per step, per epoch,
    per accumulation cycle) is learnt across the run (:mod:`ckptaudit.verdict`).
    """
    out: List[F.Finding] = []
    opt_step = c.optimizer_step if c.step_counts == "steps" else None  # epochs and updates are not comparable
    evidence = []
    if opt_step is not None and step is not None and opt_step > 0 and step < 0.5 * opt_step:
        evidence.append(f"the optimizer's per-parameter step is {opt_step:g}")
    if name_step is not None and step is not None and name_step > 0 and step < 0.5 * name_step:
        evidence.append(f"the name says step {name_step}")
    if evidence:
        true_step = int(opt_step) if opt_step else name_step
        le = c.scheduler_last_epoch
        sched = (f"; the scheduler's last_epoch is {le}: if it steps once per optimizer step, set it to {true_step} "
                 "too (its cadence could not be learnt from this unit alone)") if le is not None and le < (true_step or 0) else ""
        out.append(step_counter_reset(p, field=_field_text(c.step_source), saved=step,
                                      evidence=" and ".join(evidence), true_step=true_step, scheduler_text=sched,
                                      repair_code=_step_repair(p, c.step_source, true_step)))
        return out
    if name_step is not None and step is not None and name_step != step:
        out.append(F.make("step_name_disagrees", path=p, name_step=name_step, content_step=step))
    if opt_step is not None and step is not None and abs(opt_step - step) > max(2, 0.1 * step):
        out.append(F.make("optimizer_step_mismatch", path=p, opt_step=f"{opt_step:g}", step=step))
    return out


def _field_text(step_source: str) -> str:
    return step_source.split(":", 1)[-1] if step_source else "step"


def _step_repair(unit: str, step_source: str, true_step: Optional[int]) -> str:
    """The statement that restores the step counter in the loaded checkpoint dict ``ckpt``
    of a single-file unit (``ckpt`` as the resume script loads it), else ""."""
    fkey, _, dotted = step_source.partition(":")
    if fkey != "root" or not dotted or true_step is None or "*" in dotted:
        return ""
    access = "".join(f"[{k!r}]" for k in dotted.split("."))
    return f"ckpt{access} = {true_step}"


#: The columns of the ``tensors`` table this layer reads, and the kinds of the hash stage's facts it asks for.
TENSOR_COLUMNS = ["unit", "file", "name", "dtype", "data_offset", "nbytes"]
FACT_KINDS = ("values", "bytes")


def run(ctx: StageContext, part: Part, rows: EarlierRows) -> StateRows:
    """The state layer of ``part``: a row per unit with a scan (``rows.scan``); tensor value statistics come from
    the hash stage's facts (``rows.hash``) where it has them, remote reads from the bytes its pass kept."""
    from .. import tables
    from . import liveness
    from .rows import HashRows

    scans = rows.scan.by_unit()
    tens = tables.UnitRows(None, TENSOR_COLUMNS, rows.scan.tensors)  # a unit's rows as dicts while read
    facts = (rows.hash or HashRows(())).byte_facts(ctx.run_dir, kinds=FACT_KINDS)
    cfg = dict(ctx.config)
    return StateRows(tuple(
        liveness.guard("state", u, lambda: analyse_unit(u, scans[u["unit"]].row, tens.rows(u["unit"]), ctx.run_dir,
                                                        cfg, facts, lambda: scans[u["unit"]].parsed,
                                                        scans[u["unit"]].findings),
                       lambda f: StateRow(u["unit"], findings=(f,)))
        for u in part.units if u["unit"] in scans))
