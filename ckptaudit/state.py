"""State layer, per unit: components present and sound, counters consistent,
values finite.

The value scan streams every floating tensor of the weights and optimizer
moments straight from the file's bytes (their offsets come from the static
scan), ``chunk_mib`` at a time into one reused buffer, so memory stays bounded
whatever the checkpoint size; torch is not imported.  NaN/Inf tests follow
IEEE 754 bit patterns (all exponent bits set); bfloat16 is the upper half of a
float32 (torch docs, "torch.bfloat16"); float8 e4m3fn has no Inf and NaN =
``S.1111.111``, e5m2 follows IEEE (PyTorch RFC "float8 types").
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import components as C
from . import findings as F
from . import fs

FLOAT_DTYPES = {"float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
OPTIMIZER_PREFIXES = tuple(k + "." for k in C.OPTIMIZER_KEYS) + ("optimizer_state_dict.",)


def _np_view(buf, dtype: str):
    import numpy as np

    if dtype == "bfloat16":
        return np.frombuffer(buf, dtype=np.uint16)
    if dtype.startswith("float8"):
        return np.frombuffer(buf, dtype=np.uint8)
    return np.frombuffer(buf, dtype={"float32": np.float32, "float64": np.float64, "float16": np.float16}[dtype])


def _chunk_stats(a, dtype: str) -> Tuple[int, float]:
    """(non-finite count, sum of squares of the finite values) of one chunk."""
    import numpy as np

    if dtype == "float8_e4m3fn":
        return int(np.count_nonzero((a & 0x7F) == 0x7F)), 0.0
    if dtype == "float8_e5m2":
        return int(np.count_nonzero((a & 0x7C) == 0x7C)), 0.0
    if dtype == "bfloat16":
        bad = int(np.count_nonzero((a & 0x7F80) == 0x7F80))
        f = (a.astype(np.uint32) << 16).view(np.float32)
    else:
        f = a
        bad = f.size - int(np.count_nonzero(np.isfinite(f)))
    if bad:
        f = f[np.isfinite(f)]
    return bad, _sum_squares(f)


_BLOCK = 1 << 16


def _sum_squares(f) -> float:
    """Σx² of finite values: float32 dot products over 64 Ki-element blocks, added
    in float64 (no float64 copy of the chunk); recomputed in float64 only when a
    block overflows float32."""
    import numpy as np

    if f.size == 0:
        return 0.0
    if f.dtype == np.float64:
        return float(np.dot(f, f))
    total = 0.0
    for i in range(0, f.size, _BLOCK):
        b = f[i:i + _BLOCK]
        if b.dtype != np.float32:
            b = b.astype(np.float32)
        total += float(np.dot(b, b))
    if not np.isfinite(total):
        f64 = f.astype(np.float64)
        total = float(np.dot(f64, f64))
    return total


def scan_values(run_dir: Path, tensors: List[dict], chunk_bytes: int) -> Dict[str, dict]:
    """Stream tensors' bytes; return {tensor name: {"nonfinite": n, "norm": l2}}.

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


def is_optimizer_tensor(name: str) -> bool:
    return name.startswith(OPTIMIZER_PREFIXES) or ".optimizer_state_dict." in name or name.startswith(
        ("optimizer.pt:", "zero_pp_rank"))


def analyse_unit(unit: dict, scan_row: dict, tensors: List[dict], run_dir: Path, cfg: dict) -> dict:
    """One row of the ``state`` table (with its findings) for a unit."""
    scfg = cfg.get("state", {})
    row = {"unit": unit["unit"], "findings_json": "[]"}
    fl: List[F.Finding] = []
    tree = json.loads(scan_row.get("tree_json") or "{}")
    facts = json.loads(scan_row.get("facts_json") or "{}")
    if not scan_row.get("file_ok") or not scan_row.get("security_ok") or not tree:
        row.update(step=unit.get("step_from_name"), step_source="name" if unit.get("step_from_name") is not None else "")
        return row
    c = C.collect(scan_row["layout"], tree, facts)
    name_step = unit.get("step_from_name")
    p = unit["unit"]
    step = c.step
    row.update(
        step=step if step is not None else name_step,
        step_source=c.step_source or ("name" if name_step is not None else ""),
        has_weights=bool(c.weights), has_optimizer=c.optimizer is not None,
        optimizer_nonempty=c.optimizer_nonempty, optimizer_step=c.optimizer_step,
        has_scheduler=c.scheduler is not None, scheduler_last_epoch=c.scheduler_last_epoch,
        has_scaler=c.scaler, has_rng=c.rng, has_sampler=c.sampler, has_ema=c.ema,
        epoch=c.epoch, best_metric=c.best_metric,
    )
    training_state = c.optimizer is not None or c.scheduler is not None or c.step is not None
    if not c.weights:
        if scan_row["layout"] not in ("dcp",) or not tree:
            fl.append(F.make("missing_model_weights", path=p, keys=", ".join(repr(k) for k in c.top_keys[:12]) or "none"))
    elif c.weights_only_format or not training_state:
        fl.append(F.make("weights_only_checkpoint", path=p))
    else:
        if c.optimizer is None:
            fl.append(F.make("missing_optimizer_state", path=p))
        elif not c.optimizer_nonempty and not c.optimizer_partitioned:
            fl.append(F.make("empty_optimizer_state", path=p, step=step if step is not None else "unknown"))
        elif c.optimizer_partitioned and not c.optimizer_nonempty:
            fl.append(F.make("empty_optimizer_state", path=p, step=step if step is not None else "unknown"))
        elif c.optimizer_nonempty:
            want = sum(C.group_size(g) or 0 for g in c.optimizer.get("param_groups", []))
            have = len(c.optimizer.get("state", {}))
            if want and have < want:
                fl.append(F.make("optimizer_state_incomplete", path=p, have=have, want=want))
        if c.scheduler is None:
            fl.append(F.make("missing_scheduler_state", path=p, step=step if step is not None else name_step))
        if not c.rng and scan_row["layout"] not in ("deepspeed",):
            fl.append(F.make("missing_rng_state", path=p))
        if step is None:
            fl.append(F.make("missing_step", path=p, name_step=name_step if name_step is not None else "?"))
        fl.extend(_counter_findings(p, c, step, name_step))
    # values
    if scfg.get("nan_scan", True) and c.weights:
        t0 = time.perf_counter()
        vals = scan_values(run_dir, tensors, int(scfg.get("chunk_mib", 16)) << 20)
        row["scan_seconds"] = time.perf_counter() - t0
        row["scanned_bytes"] = sum(t["nbytes"] for t in tensors if t["name"] in vals)
        row["n_float_tensors"] = len(vals)
        bad_w = sorted(n for n, v in vals.items() if v["nonfinite"] and not is_optimizer_tensor(n))
        bad_o = sorted(n for n, v in vals.items() if v["nonfinite"] and is_optimizer_tensor(n))
        row["n_nonfinite_tensors"] = len(bad_w) + len(bad_o)
        row["nonfinite_tensors"] = bad_w + bad_o
        wn = [v["norm"] for n, v in vals.items() if not is_optimizer_tensor(n) and not v["nonfinite"]]
        row["weight_norm"] = math.sqrt(sum(x * x for x in wn)) if wn and not bad_w else None
        row["tensor_norms_json"] = json.dumps({n: round(v["norm"], 6) for n, v in vals.items()
                                               if not is_optimizer_tensor(n) and not v["nonfinite"]})
        if bad_w:
            fl.append(F.make("nan_in_weights", path=p, n_tensors=len(bad_w), examples=_examples(bad_w)))
        if bad_o:
            fl.append(F.make("nonfinite_optimizer_state", path=p, examples=_examples(bad_o)))
    row["findings_json"] = json.dumps([f.to_dict() for f in fl])
    return row


def _examples(names: List[str], n: int = 4) -> str:
    shown = ", ".join(repr(x) for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def _counter_findings(p: str, c: C.Components, step: Optional[int], name_step: Optional[int]) -> List[F.Finding]:
    out: List[F.Finding] = []
    opt_step = c.optimizer_step
    last_epoch = c.scheduler_last_epoch
    evidence = []
    if opt_step is not None and step is not None and opt_step > 0 and step < 0.5 * opt_step:
        evidence.append(f"the optimizer's per-parameter step is {opt_step:g}")
    if name_step is not None and step is not None and name_step > 0 and step < 0.5 * name_step:
        evidence.append(f"the name says step {name_step}")
    if evidence:
        true_step = int(opt_step) if opt_step else name_step
        field = c.step_source.split(":")[-1] if c.step_source else "step"
        lines = [f"ckpt[{field!r}] = {true_step}"]
        if last_epoch is not None and last_epoch < 0.5 * (true_step or 0):
            lines.append(f"ckpt['scheduler']['last_epoch'] = {true_step}; ckpt['scheduler']['_step_count'] = {true_step + 1}")
        out.append(F.make("step_counter_reset", path=p, field=field, saved=step,
                          evidence=" and ".join(evidence), true_step=true_step,
                          repair_code="; ".join(lines)))
        return out
    if last_epoch is not None and step is not None and step > 0 and last_epoch < 0.5 * step:
        out.append(F.make("step_counter_reset", path=p, field="scheduler.last_epoch", saved=last_epoch,
                          evidence=f"the global step is {step}", true_step=step,
                          repair_code=f"ckpt['scheduler']['last_epoch'] = {step}; ckpt['scheduler']['_step_count'] = {step + 1}"))
        return out
    if name_step is not None and step is not None and name_step != step:
        out.append(F.make("step_name_disagrees", path=p, name_step=name_step, content_step=step))
    if opt_step is not None and step is not None and abs(opt_step - step) > max(2, 0.1 * step):
        out.append(F.make("optimizer_step_mismatch", path=p, opt_step=f"{opt_step:g}", step=step))
    return out
