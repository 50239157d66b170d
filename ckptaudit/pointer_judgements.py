"""Pointer judgements: whether a resume that follows each pointer of the run (``latest``, a tracker, a link)
reaches a usable unit — a detector that runs after the units are judged, on their ``usable_for``.

A pointer is read by the inventory (``pointers``: ``path``, ``target``, ``resolved``, ``exists``,
``is_symlink``, ``kind``); it is judged here against the verdict's units (``unit``, ``step``, ``name_step``,
``usable_for``, ``findings``), which it never changes.  :func:`judge` returns one row per pointer and, apart,
the findings that also join the unit a pointer names (:attr:`PointerJudgements.on_units`): a pointer to a
unit with damaged bytes when that unit is already unusable.  Such a finding caps ``none``, a level the unit
already holds, so joining it never changes the unit's ``usable_for`` (:func:`ckptaudit.verdict.build` takes
it once, before this detector runs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import confine, producers
from . import findings as F
from .layouts import leftovers
from .run_findings import save_key

#: ``usable_for`` in order, worst first (:data:`ckptaudit.findings.USES` reversed).
_RANK = {"none": 0, "warm-start": 1, "resume": 2}


@dataclass(frozen=True)
class PointerJudgements:
    """``rows``: one per pointer, in the inventory's order (``path``, ``target``, ``resolved``, ``ok``, ``kind``,
    ``finding``: a finding dict or None); ``on_units``: ``{unit: [finding dict]}``, the pointer findings that
    also join the (already unusable) unit they name, in pointer order."""

    rows: List[dict]
    on_units: Dict[str, List[dict]] = field(default_factory=dict)


def judge(pointers: List[dict], units_out: List[dict]) -> PointerJudgements:
    """Every pointer of the run judged against the verdict units ``units_out`` (:func:`pointer_finding`);
    ``ok``: a resume that follows it works (no finding, a finding capped at ``resume``, or
    ``latest_pointer_not_newest``: a newer unit exists but the pointer still reaches a usable one)."""
    by_unit = {u["unit"]: u for u in units_out}
    rows: List[dict] = []
    on_units: Dict[str, List[dict]] = {}
    for p in pointers:
        res = p.get("resolved") or ""
        f = pointer_finding(p, units_out, by_unit)
        kind = f.kind if f is not None else ""
        ok = f is None or f.kind == "latest_pointer_not_newest" or F.CATALOGUE[f.kind].caps == "resume"
        if f is not None and f.kind in JOINS_UNIT and by_unit[res]["usable_for"] == "none":
            # a resume through this pointer reads the damaged bytes the unit's own findings name: the finding is
            # the unit's too; a unit unusable for other reasons says so in its own findings
            on_units.setdefault(res, []).append(f.to_dict())
        rows.append({"path": p["path"], "target": p["target"], "resolved": res, "ok": ok, "kind": kind,
                     "finding": f.to_dict() if f else None})
    return PointerJudgements(rows, on_units)


#: The kinds :func:`pointer_to_unit_finding` makes for a pointer to a unit with damaged bytes.
JOINS_UNIT = ("symlink_target_unusable", "latest_pointer_incomplete")


def pointer_finding(p: dict, units_out: List[dict], by_unit: Dict[str, dict]) -> Optional[F.Finding]:
    """What is wrong with pointer ``p`` (an inventory pointer row), or None: never read, its producer's own check,
    out of the run, refused, dangling, or naming a unit (:func:`pointer_to_unit_finding`).  The repair suggests
    the newest usable unit other than the one it names."""
    usable = [u for u in units_out if u["usable_for"] != "none" and u["unit"] != p.get("resolved")]
    best = max(usable, key=save_key, default=None)
    suggestion = best["unit"].rsplit("/", 1)[-1] if best else "none"
    res = p.get("resolved") or ""
    kind = p["kind"]
    if leftovers.POINTER_NOT_READ in kind:  # a FIFO or device named as a pointer: never opened
        return leftovers.irregular(p["path"], kind.split(leftovers.POINTER_NOT_READ, 1)[1])
    pf = producers.pointer_file(p)
    text = pf.text_of(suggestion) if pf is not None and pf.text_of is not None and best else suggestion
    if pf is not None and pf.check is not None and (bad := pf.check(p, suggestion)) is not None:
        return bad
    if confine.POINTER_OUTSIDE in kind or (kind.startswith("symbolic link, refused") and confine.OUTSIDE_WORDS in kind):
        where = (kind.split(confine.POINTER_OUTSIDE, 1)[1] if confine.POINTER_OUTSIDE in kind
                 else kind.rsplit("(", 1)[-1].rstrip(")"))
        return confine.path_outside_run(p["path"], p["target"], where,
                                        "a resume that follows this pointer would load from there")
    if kind.startswith("symbolic link, refused"):
        return F.make("pointer_refused", path=p["path"], pointer=p["path"], target=p["target"],
                      why=kind.split(": ", 1)[-1], suggestion=suggestion)
    if p["is_symlink"] and not p["exists"]:
        return F.make("dangling_symlink", path=p["path"], pointer=p["path"], target=p["target"], suggestion=suggestion)
    if res and res in by_unit:
        return pointer_to_unit_finding(p, by_unit[res], best, suggestion, text, pf)
    if res and p["exists"]:
        return None  # names something that is not a unit (e.g. a plain file): nothing to judge
    ctext = f"; the newest complete checkpoint is {suggestion}" if best else "; no complete checkpoint exists"
    return F.make("latest_pointer_dangling", path=p["path"], pointer=p["path"], target=p["target"],
                  suggestion=suggestion, suggestion_text=text, complete_text=ctext)


def pointer_to_unit_finding(p: dict, u: dict, best: Optional[dict], suggestion: str, text: str = "",
                            pf=None) -> Optional[F.Finding]:
    """A pointer that names unit ``u``: the unit's bytes are damaged (:data:`JOINS_UNIT`), or a newer usable unit
    ``best`` exists (the producer's own finding when its pointer file has one, ``pf.behind``); None when it
    names the right unit.  ``text``: what the pointer must hold to name ``best``.  Reads ``u``, never changes it."""
    text = text or suggestion
    file_errs = [x["kind"] for x in u["findings"] if x["severity"] == "error" and x["layer"] == "file"]
    if file_errs:
        # a resume through this pointer reads damaged or missing bytes; a unit that is unusable for
        # other reasons (a changed world size, NaN weights) says so in its own findings
        why = ", ".join(file_errs) or "not usable"
        if p["is_symlink"]:  # a framework's "last" link, a publish symlink: re-point the link
            return F.make("symlink_target_unusable", path=p["path"], pointer=p["path"], target=p["target"],
                          suggestion=suggestion, why=why)
        # a text pointer (a "latest" file, a tracker): rewrite the name it holds
        return F.make("latest_pointer_incomplete", path=p["path"], pointer=p["path"], target=p["target"],
                      suggestion=suggestion, suggestion_text=text, why=why)
    if best and u["step"] is not None and best["step"] is not None and best["step"] > u["step"]:
        if pf is not None and pf.behind is not None and _RANK[best["usable_for"]] >= _RANK[u["usable_for"]]:
            return pf.behind(p, suggestion, text)
        return F.make("latest_pointer_not_newest", path=p["path"], pointer=p["path"], target=p["target"],
                      suggestion=suggestion)
    return None
