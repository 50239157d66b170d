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
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import components as C
from . import findings as F
from . import roles
from . import fs
from .onepass import facts
from .onepass.values import FLOAT_DTYPES, _BLOCK, _chunk_stats, _np_view, _sum_squares  # noqa: F401 - re-exported


def scan_values(run_dir: Path, tensors: List[dict], chunk_bytes: int) -> Dict[str, dict]:
    """Value statistics of tensors: {tensor name: {"nonfinite": n, "norm": l2}}, from the hash stage's pass
    where it has them, else streamed from the tensors' bytes.

    Tensors sharing bytes (tied weights) are read once.  Tensors whose offset
    is unknown (−1) are skipped.  Memory: one ``chunk_bytes`` buffer plus numpy
    temporaries of the same order.
    """
    out: Dict[str, dict] = {}
    by_file: Dict[str, List[dict]] = {}
    for t in tensors:
        if t["dtype"] in FLOAT_DTYPES and t["data_offset"] is not None and t["data_offset"] >= 0 and t["nbytes"]:
            by_file.setdefault(t["file"], []).append(t)
    buf = bytearray(chunk_bytes)
    for rel, ts in by_file.items():
        seen: Dict[Tuple[int, int, str], dict] = {}
        ts = _known_values(fs.fspath(run_dir / rel), ts, seen, out)  # what the hash stage's pass answered
        if not ts:
            continue
        try:
            fh = fs.open_binary(run_dir / rel, block_size=fs.STREAM_BLOCK_BYTES)
        except OSError:
            continue
        with fh:
            for t in sorted(ts, key=lambda x: x["data_offset"]):
                key = (t["data_offset"], t["nbytes"], t["dtype"])
                if key in seen:
                    out[t["name"]] = seen[key]
                    continue
                item = 1 if t["dtype"].startswith("float8") else {"float64": 8, "float32": 4}.get(t["dtype"], 2)
                step = max(item, (chunk_bytes // item) * item)
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
                    b, s = _chunk_stats(_np_view(mv, t["dtype"]), t["dtype"])
                    bad += b
                    sq += s
                    left -= n
                res = {"nonfinite": bad, "norm": math.sqrt(sq), "short": short}
                seen[key] = res
                out[t["name"]] = res
    return out


def _known_values(path: str, ts: List[dict], seen: Dict[Tuple[int, int, str], dict],
                  out: Dict[str, dict]) -> List[dict]:
    """Fill ``out``/``seen`` from the hash stage's one pass (:mod:`ckptaudit.onepass.facts`); the tensors it
    did not answer, which are read here."""
    left = []
    for t in ts:
        key = (t["data_offset"], t["nbytes"], t["dtype"])
        known = seen.get(key)
        if known is None and (v := facts.values_of(path, *key)) is not None and v[2] == t["nbytes"]:
            known = seen[key] = {"nonfinite": v[0], "norm": math.sqrt(v[1]), "short": False}
        if known is None:
            left.append(t)
        else:
            out[t["name"]] = known
    return left


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


def analyse_unit(unit: dict, scan_row: dict, tensors: List[dict], run_dir: Path, cfg: dict) -> dict:
    """One row of the ``state`` table (with its findings) for a unit."""
    scfg = cfg.get("state", {})
    row = {"unit": unit["unit"], "findings_json": "[]"}
    fl: List[F.Finding] = []
    tree = json.loads(scan_row.get("tree_json") or "{}")
    facts = json.loads(scan_row.get("facts_json") or "{}")
    scan_findings = json.loads(scan_row.get("findings_json") or "[]")
    cut = any(f.get("kind") == "pickle_too_complex" for f in scan_findings)  # the walk gave up: the tree is partial
    if not roles.weights_intact(scan_row) or not scan_row.get("security_ok") or not tree:
        row.update(step=unit.get("step_from_name"), step_source="name" if unit.get("step_from_name") is not None else "")
        scan_errors = [f for f in scan_findings if f.get("severity") == "error"]
        if not tree and not scan_errors and not cut:  # an empty folder, or one with only metadata: nothing to resume from
            row.update(has_weights=False)
            row["findings_json"] = json.dumps([missing_weights(unit["unit"], "none").to_dict()])
        return row
    c = C.of_scan_row(scan_row)[0]
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
    if not cut:  # a partial tree cannot show what is missing (the scan's pickle_too_complex says so)
        fl.extend(_completeness(p, c, step, name_step))
    fl.extend(_counter_findings(p, c, step, name_step))
    if scfg.get("nan_scan", True) and c.weights:
        fl.extend(_value_findings(p, c, tensors, run_dir, scfg, row))
    row["findings_json"] = json.dumps([f.to_dict() for f in fl])
    return row


def missing_weights(path: str, keys: str) -> F.Finding:
    """``missing_model_weights``: unit ``path`` holds no model weights (``keys``: what it holds instead).
    Decided by :func:`analyse_unit` (nothing to resume from), :func:`_completeness` (no weights among the
    components), the DeepSpeed adapter (no ``mp_rank_XX_model_states.pt``, at scan time) and, for a unit the
    static walk gave up on, :func:`ckptaudit.cut_walk.findings` (torch.load found no tensor in it)."""
    return F.make("missing_model_weights", path=path, keys=keys)


def step_counter_reset(path: str, **values) -> F.Finding:
    """``step_counter_reset``: a saved step counter (``field``) went back to ``saved`` where the unit's other
    evidence says ``true_step``; ``values`` are the template's fields (``field``, ``saved``, ``evidence``,
    ``true_step``, ``scheduler_text``, ``repair_code``), kept in the detail in the order given.  Decided by
    :func:`_counter_findings` (one unit) and :func:`ckptaudit.run_findings.scheduler_resets` (the
    scheduler's ``last_epoch`` read across the run)."""
    return F.make("step_counter_reset", path=path, **values)


def _completeness(p: str, c: C.Components, step: Optional[int], name_step: Optional[int]) -> List[F.Finding]:
    """Which components a faithful resume needs and the unit lacks."""
    training_state = c.optimizer is not None or c.scheduler is not None or c.step is not None
    if not c.weights:
        return [missing_weights(p, ", ".join(repr(k) for k in c.top_keys[:12]) or "none")]
    if c.weights_only_format or not training_state:
        return [F.make("weights_only_checkpoint", path=p)]
    out: List[F.Finding] = []
    needs = c.optimizer_needs
    if c.optimizer is None:
        out.append(F.make("missing_optimizer_state", path=p))
    elif not c.optimizer_nonempty and needs is not None and needs.needs_state and (step is None or step > 0):
        out.append(F.make("empty_optimizer_state", path=p, step=step if step is not None else "unknown",
                          optimizer=needs.name))
    elif c.optimizer_nonempty and not c.optimizer_partitioned:
        want = sum(C.group_size(g) or 0 for g in c.optimizer.get("param_groups", []))
        have = C.n_entries(c.optimizer.get("state") or {})  # the scan tree keeps 4,096 entries of a dict
        if want and have < want and (needs is None or needs.needs_state is not False):
            out.append(F.make("optimizer_state_incomplete", path=p, have=have, want=want))
    # a scheduler or RNG state the unit lacks is judged against the run (run_findings.missing_components):
    # a component the run never had is not missing
    if step is None:
        out.append(F.make("missing_step", path=p, name_step=name_step, repair_code="",
                          name_text=f" (the name says step {name_step})" if name_step is not None else ""))
    return out


def _value_findings(p: str, c: C.Components, tensors: List[dict], run_dir: Path, scfg: dict,
                    row: dict) -> List[F.Finding]:
    """Non-finite values and norms of the weights and optimizer moments (other tensors are only counted)."""
    out: List[F.Finding] = []
    roles = {(t["file"], t["name"]): tensor_role(t, c) for t in tensors}
    judged = [t for t in tensors if roles[(t["file"], t["name"])] != "other"]
    t0 = time.perf_counter()
    vals = scan_values(run_dir, judged, int(scfg.get("chunk_mib", 16)) << 20)
    row["scan_seconds"] = time.perf_counter() - t0
    row["scanned_bytes"] = sum(t["nbytes"] for t in judged if t["name"] in vals)
    row["n_float_tensors"] = len(vals)
    role_of = {t["name"]: roles[(t["file"], t["name"])] for t in judged}
    bad_w = sorted(n for n, v in vals.items() if v["nonfinite"] and role_of.get(n) == "weights")
    bad_o = sorted(n for n, v in vals.items() if v["nonfinite"] and role_of.get(n) == "optimizer")
    row["n_nonfinite_tensors"] = len(bad_w) + len(bad_o)
    row["nonfinite_tensors"] = bad_w + bad_o
    wn = [v["norm"] for n, v in vals.items() if role_of.get(n) == "weights" and not v["nonfinite"]]
    row["weight_norm"] = math.sqrt(sum(x * x for x in wn)) if wn and not bad_w else None
    row["tensor_norms_json"] = json.dumps({n: round(v["norm"], 6) for n, v in vals.items()
                                           if role_of.get(n) == "weights" and not v["nonfinite"]})
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
    opt_step = c.optimizer_step
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
