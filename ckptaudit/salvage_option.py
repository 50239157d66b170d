"""Whether the verdict offers a salvage of the damaged newest unit, and the command that does it.

When the newest unit cannot be resumed from and the rollback point is older, every step between them is
lost, unless much of the newest unit is intact.  The report job asks :func:`ckptaudit.salvage.unit_tensors`
(the same proofs ``ckptaudit salvage`` uses: each storage record's CRC-32, a manifest's chunk digests; one
read of the unit) which of its tensors are proven intact.  The weights are its tensors outside an optimizer
state_dict (recognised by its shape on the path: ``….state.<parameter index>.…``), weighed by bytes.  With
at least ``salvage.min_weights_share`` of them intact, ``verdict["salvage"]`` names the unit, the share, the
steps a warm start from it would keep over the rollback point, and the command (``--fill-from`` the rollback
unit, so the lost tensors come from there); the verdict's reasons get one sentence.  Local runs only.

The verdict's sentence and ``ckptaudit salvage``'s summary state the same two measured shares in the same words
(:func:`shares`, :func:`share_words`): the proven-intact part of the *model weights'* bytes (the tensors outside
an optimizer state) and of *all tensors'* bytes.  A cut in the optimizer state leaves the first near 100 % and
the second near half; either alone read beside the other looked like a contradiction.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import List, Optional

#: the words for the two shares, everywhere they are printed
WEIGHTS_WORDS = "the bytes of the model weights"
ALL_WORDS = "the bytes of all tensors"


def weights_share(tensors: List) -> tuple:
    """``(intact weight bytes, weight bytes)`` of salvage's ``TensorBytes`` list."""
    from .intact import is_optimizer_state

    total = intact = 0
    for t in tensors:
        if is_optimizer_state(t.name):
            continue
        total += t.nbytes
        if t.status == "intact":
            intact += t.nbytes
    return intact, total


def shares(tensors: List) -> dict:
    """``{"model_weights", "all_tensors"}``: the proven-intact (status ``intact``) share of the bytes of the
    tensors outside an optimizer state, and of every tensor, each in [0, 1] rounded to 6 places (None when
    there are no such bytes); ``tensors``: salvage's ``TensorBytes`` of one unit."""
    wi, wt = weights_share(tensors)
    ai = sum(t.nbytes for t in tensors if t.status == "intact")
    at = sum(t.nbytes for t in tensors)
    return {"model_weights": round(wi / wt, 6) if wt else None, "all_tensors": round(ai / at, 6) if at else None}


def share_words(sh: dict) -> str:
    """``"98.0 % of the bytes of the model weights and 52.3 % of the bytes of all tensors"`` for :func:`shares`' dict;
    a share is shown rounded down to 0.1 % (never 100.0 % unless all, never 0.0 % unless none)."""
    w, a = sh.get("model_weights"), sh.get("all_tensors")
    if w is None:
        return f"no model weights (tensors outside an optimizer state); {_pct(a)} of {ALL_WORDS}"
    return f"{_pct(w)} of {WEIGHTS_WORDS} and {_pct(a)} of {ALL_WORDS}"


def _pct(x: Optional[float]) -> str:
    if not x:
        return "0 %"
    if x >= 1:
        return "100 %"
    v = math.floor(x * 1000) / 10
    return f"{v:.1f} %" if v > 0 else "< 0.1 %"


def offer(v: dict, run_root, out_dir, cfg: dict) -> Optional[dict]:
    """``{"unit", "step", "weights_share", "steps_kept", "command", "sentence"}`` when verdict ``v`` should
    offer salvage of its newest unit (local run ``run_root``; the command writes under ``out_dir``), else
    None.  Never raises for a unit it cannot read: no offer then.  No offer for a unit whose data.pkl the scan
    could not walk to its end (:func:`ckptaudit.formats.pickles.walk_cut`): the tensors it does not name would be
    left out of both shares."""
    from .intact import unit_tensors

    newest, rollback = v.get("newest"), v.get("rollback")
    if not newest or "://" in str(run_root):
        return None
    unit = next((u for u in v.get("units", []) if u["unit"] == newest["unit"]), None)
    if unit is None or unit["usable_for"] == "resume" or (rollback and rollback["unit"] == unit["unit"]):
        return None
    path = Path(run_root) / unit["unit"]
    from .confine import resolved_outside

    if resolved_outside(Path(run_root), unit["unit"]) or any(f["kind"] == "path_outside_run" for f in unit["findings"]):
        return None  # never read what lies outside the run
    from .formats.pickles import walk_cut

    if walk_cut(unit["findings"]):
        # the scan's walk of a data.pkl ran out of its budget; salvage's walk is the same walk under the same
        # budget, so it would name only the tensors before the cut: a share of a partial list is no measure of
        # the unit (and the walk would be paid a second time, in the report job, to learn that)
        return None
    try:
        tensors, _ = unit_tensors(path, run_root)
    except (OSError, ValueError):
        return None
    intact, total = weights_share(tensors)
    share = intact / total if total else 0.0
    measured = shares(tensors)
    if not intact or share < float((cfg.get("salvage") or {}).get("min_weights_share", 0.5)):
        return None
    step = unit.get("step") if unit.get("step") is not None else _name_step(unit["unit"])
    kept = step - rollback["step"] if rollback and step is not None and rollback.get("step") is not None else None
    if kept is not None and kept <= 0:
        return None  # the rollback point is as new: nothing to keep
    dest = Path(out_dir).resolve() / "salvage" / (unit["unit"].replace("/", "_") + "-salvaged")
    cmd = ["ckptaudit", "salvage", str(path.resolve()), "--out", str(dest)]
    if rollback:
        cmd += ["--fill-from", str((Path(run_root) / rollback["unit"]).resolve())]
    command = " ".join(shlex.quote(c) for c in cmd)
    keeps = (f"keeps up to {kept} steps over the rollback point" if kept else
             "may keep steps over the rollback point" if rollback else
             "is all that is left of the run's training (no other unit can be resumed or warm-started from)")
    sentence = (f"Salvage: {share_words(measured)} of {unit['unit']} are proven intact (zip record CRC-32, "
                f"manifest or file digests); a warm start from them {keeps}, without its optimizer state where "
                f"that is lost: {command}")
    return {"unit": unit["unit"], "step": step, "weights_share": round(share, 4), "shares": measured,
            "steps_kept": kept, "command": command, "sentence": sentence}


def _name_step(unit: str) -> Optional[int]:
    from .units import step_from_name

    return step_from_name(Path(unit).name)
