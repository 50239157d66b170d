"""The framework's configured resume entry judged by what that resume would do (Lightning's ``last.ckpt``).

Some producers resume from a unit they find by name (:attr:`ckptaudit.producers.contract.Producer.entry`):
Lightning's ``trainer.fit(model, ckpt_path="last")`` loads the newest ``last*.ckpt`` of the checkpoint
folder, which ``ModelCheckpoint(save_last=True)`` writes as a second full save (sources in
:mod:`ckptaudit.producers.lightning`; ``save_last="link"`` makes a symbolic link, which
:mod:`ckptaudit.discovery` audits as a pointer).  Such an entry is a unit, judged by its own bytes like any
other, and it is also the file the configured resume loads.  When it is damaged the newest intact unit is
still there, but a job that resumes the way it was configured crashes in the load (a truncated zip: the
weights-only unpickler's IndexError), so :func:`entry_findings` gives it ``resume_entry_damaged``: the
repair copies the rollback unit over it atomically, the next step also names the explicit call
(:mod:`ckptaudit.resume_hint`).  The verdict reports the entries, joins each entry's finding to its unit
(:func:`ckptaudit.verdict.build`) and exits 1 while one is damaged (:func:`ckptaudit.verdict.exit_code`).

A detector that runs on the units' ``usable_for``, which it never changes: ``resume_entry_damaged`` (capped
``none``) goes only to an unusable entry, ``resume_entry_weights_only`` (capped ``warm-start``) only to one
usable for a warm start, so joining it leaves the unit's ``usable_for`` as it was.

An entry whose bytes hold intact weights but no training state (``ModelCheckpoint(save_weights_only=True)``:
usable for a warm start by its own findings) is no resume point either, but it is not damaged: it gets
``resume_entry_weights_only``, whose cap is a warm start, so what the configured resume would do never makes
intact weights unusable.
"""

from __future__ import annotations

import shlex
from typing import List, Optional

from . import findings as F
from . import producers
from .producers.contract import Producer
from .producers.paths import parent
from .resume_hint import call


def _entry_of(u: dict) -> Optional[Producer]:
    """The producer whose configured resume loads unit row ``u`` by name, or None."""
    if u.get("layout") == "irregular":
        return None
    return next((p for p in producers.with_entry() if p.entry(u["unit"])), None)


#: The kinds :func:`entry_findings` makes; what they say of a unit is not the unit's own finding.
ENTRY_KINDS = ("resume_entry_damaged", "resume_entry_weights_only")


def _why(u: dict) -> str:
    """The unit's own findings that keep it from being a resume point: its errors, else (a unit usable for a warm
    start by warnings alone: a weights-only save's ``missing_optimizer_state``) what caps it."""
    own = [f for f in u["findings"] if f["kind"] not in ENTRY_KINDS]
    errs = [f["kind"] for f in own if f["severity"] == "error"] or [f["kind"] for f in own if f["caps"] != "resume"]
    return ", ".join(dict.fromkeys(errs)) or f"usable for {u['usable_for']} only"


def _outcome(u: dict) -> str:
    """What the configured resume does with the damaged entry ``u``: its load fails on damaged bytes, or it
    restores state the audit judged unusable (non-finite weights) and carries on."""
    layers = {f["layer"] for f in u["findings"] if f["severity"] == "error" and f["kind"] not in ENTRY_KINDS}
    return "restore that damaged state and train on from it" if layers and layers <= {"state"} else \
        "fail in the load"


def _newer(u: dict, best: dict) -> bool:
    """Whether unit row ``u`` records a later step than ``best`` (unknown steps: not newer)."""
    return u["step"] is not None and best["step"] is not None and u["step"] > best["step"]


def entry_findings(units_out: List[dict], run_dir: str) -> List[dict]:
    """The resume entries among the verdict units ``units_out`` (``unit``, ``step``, ``name_step``, ``layout``,
    ``usable_for``, ``findings``), one row each: ``{"unit", "framework", "call", "ok", "finding"}``.  An entry
    that is no resume point while an intact one is beside it gets a finding (a dict; None otherwise):
    ``resume_entry_weights_only`` when its weights are intact (it stays usable for a warm start), else
    ``resume_entry_damaged``.  ``units_out`` is read, never changed: the verdict joins the finding to the unit."""
    out = []
    for u in units_out:
        p = _entry_of(u)
        if p is None:
            continue
        f = None
        folder = parent(u["unit"])
        good = [x for x in units_out if x["usable_for"] == "resume" and not p.entry(x["unit"])
                and parent(x["unit"]) == folder and x["unit"].endswith(p.unit_suffix)]
        best = max(good, key=lambda x: (x["step"] if x["step"] is not None else -1,
                                        x.get("name_step") is not None, x["unit"]), default=None)
        # an intact entry that is no resume point, with none beside it (a finished run's stripped weights) is not
        # damaged: there is nothing to copy over it, and its resume's refusal is the framework's own design
        ok = u["usable_for"] == "resume" or (best is None and u["usable_for"] != "none")
        if not ok:
            # intact weights stay usable for a warm start whatever the configured resume would do with the file
            kind = "resume_entry_weights_only" if u["usable_for"] == "warm-start" else "resume_entry_damaged"
            dst = shlex.quote(u["unit"])
            if best and (kind == "resume_entry_damaged" or not _newer(u, best)):
                src = shlex.quote(best["unit"])
                repair = f"cp -p {src} {dst}.tmp && mv {dst}.tmp {dst}"
                instead = (f"Replace it with a copy of {best['unit']} (the repair), or resume with an explicit path: "
                           f"{call(p.key, run_dir, best['unit'])}.")
            elif best:  # intact weights newer than every resume point: never overwritten by a repair
                repair = ""
                instead = (f"Resume with an explicit path, {call(p.key, run_dir, best['unit'])}, or warm-start from "
                           f"its newer weights; it is not overwritten, as no resume point holds its step.")
            else:
                repair = ""
                instead = f"No intact {p.name} checkpoint is beside it to copy over it; see the verdict's rollback point."
            fields = dict(path=u["unit"], why=_why(u), next_text=instead, repair_code=repair, framework=p.name,
                          entry_call=p.entry_call, outcome=_outcome(u),
                          intact_text=f" although {best['unit']} is intact" if best else "")
            f = (F.make("resume_entry_weights_only", **fields) if kind == "resume_entry_weights_only"
                 else F.make("resume_entry_damaged", **fields)).to_dict()
        out.append({"unit": u["unit"], "framework": p.key, "call": p.entry_call, "ok": ok, "finding": f})
    return out
