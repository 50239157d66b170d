"""How to resume from the rollback point in its framework's own terms, when the framework's default pick is another unit.

The framework is read from the rollback unit's layout (:mod:`ckptaudit.layouts`); each
framework's default pick and resume call come from its installed source (versions as tested):

* ``hf-trainer`` — transformers 5.24 ``Trainer.train(resume_from_checkpoint=True)`` takes
  ``trainer_utils.get_last_checkpoint(output_dir)``: the ``checkpoint-<N>`` folder with the
  largest N, whatever it holds (no optimizer.pt: a fresh optimizer, silently).  Explicit:
  ``trainer.train(resume_from_checkpoint="<path>")``.
* ``lightning`` — lightning 2.6 ``trainer.fit(model, ckpt_path="last")`` takes the most recently
  written ``last*.ckpt`` of the checkpoint folder
  (``ModelCheckpoint._find_last_checkpoints``, ``_CheckpointConnector._parse_ckpt_path``).
  Explicit: ``trainer.fit(model, ckpt_path="<path>")``.
* ``accelerate`` — accelerate 1.15 ``Accelerator.load_state()`` without a folder (automatic
  checkpoint naming) takes the ``checkpoints/`` folder with the largest trailing number.
  Explicit: ``accelerator.load_state("<path>")``.
* ``deepspeed`` — deepspeed 0.19 ``engine.load_checkpoint(load_dir)`` reads the tag in
  ``load_dir/latest``.  Explicit: ``engine.load_checkpoint("<dir>", tag="<tag>")``.
* ``dcp`` — ``torch.distributed.checkpoint.load(state_dict, checkpoint_id="<path>")``.
* anything else (plain ``torch.save`` files, safetensors): the resume script names the file
  itself, so the hint is the path whenever the rollback point is not the newest unit.

:func:`instruction` is the one sentence the verdict's reasons, the end-of-audit summary and the
report's headline all print; None when the framework's default already resumes from the
rollback point (or there is nothing to resume).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

__all__ = ["instruction", "call", "framework_of", "default_pick", "is_lightning_last"]

_HF_DIR = re.compile(r"^checkpoint-(\d+)$")  # transformers trainer_utils._re_checkpoint
_TRAILING = re.compile(r"(\d+)$")  # accelerate load_state's sort key (the folder's trailing number)
_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")  # ModelCheckpoint.CHECKPOINT_NAME_LAST + FILE_EXTENSION (+ version)

NAMES = {"hf-trainer": "the HF Trainer", "lightning": "Lightning", "accelerate": "accelerate",
         "deepspeed": "DeepSpeed", "dcp": "torch.distributed.checkpoint"}
DEFAULT_CALL = {"hf-trainer": "trainer.train(resume_from_checkpoint=True)",
                "lightning": 'trainer.fit(model, ckpt_path="last")',
                "accelerate": "accelerator.load_state()",
                "deepspeed": "engine.load_checkpoint(load_dir)"}


def _parent(unit: str) -> str:
    return unit.rsplit("/", 1)[0] if "/" in unit else ""


def _base(unit: str) -> str:
    return unit.rsplit("/", 1)[-1]


def _join(run_dir: str, rel: str) -> str:
    if not rel or rel == ".":
        return run_dir.rstrip("/") or "."
    return f"{run_dir.rstrip('/')}/{rel}" if run_dir else rel


def is_lightning_last(unit: str) -> bool:
    """True for the file Lightning's ``ckpt_path="last"`` resumes from (``last.ckpt``, ``last-v1.ckpt``)."""
    return bool(_LAST.match(_base(unit)))


def framework_of(unit: dict) -> str:
    """The layout name that says how ``unit`` is resumed ("" for a plain file / unknown)."""
    layout = unit.get("layout") or ""
    if layout in NAMES:
        return layout
    if _base(unit["unit"]).endswith(".ckpt") and layout in ("torch-zip", "single-file"):
        return "lightning"  # a damaged or unrecognised .ckpt beside Lightning's own
    return ""


#: the framework's own resume call for one unit ({path}: the unit; {dir} and {tag}: its folder and name)
CALLS = {"hf-trainer": 'trainer.train(resume_from_checkpoint="{path}")',
         "lightning": 'trainer.fit(model, ckpt_path="{path}")',
         "accelerate": 'accelerator.load_state("{path}")',
         "deepspeed": 'engine.load_checkpoint("{dir}", tag="{tag}")',
         "dcp": 'torch.distributed.checkpoint.load(state_dict, checkpoint_id="{path}")'}
PLAIN_CALL = 'load "{path}" in the resume script'


def call(framework: str, run_dir: str, unit: str) -> str:
    """The framework's own resume call for ``unit`` (run-relative) of the run at ``run_dir``."""
    return CALLS.get(framework, PLAIN_CALL).format(path=_join(run_dir, unit), dir=_join(run_dir, _parent(unit)),
                                                    tag=_base(unit))


def default_pick(v: dict, framework: str, rollback: str) -> Tuple[Optional[str], bool]:
    """(the unit the framework's default resume would take, whether a default exists) for the rollback
    unit's folder; the unit is None when the default names nothing the audit found."""
    units: List[dict] = v.get("units") or []
    folder = _parent(rollback)
    here = [u for u in units if _parent(u["unit"]) == folder]
    if framework == "hf-trainer":
        named = [(int(m.group(1)), u["unit"]) for u in here if (m := _HF_DIR.match(_base(u["unit"])))]
        return (max(named)[1] if named else None), True
    if framework == "accelerate":
        named = [(int(m.group(1)), u["unit"]) for u in here if u.get("layout") == "accelerate"
                 and (m := _TRAILING.search(_base(u["unit"])))]
        return (max(named)[1] if named else None), bool(named)
    if framework == "lightning":
        last = sorted(u["unit"] for u in here if is_lightning_last(u["unit"]))
        links = [p for p in v.get("pointers") or [] if is_lightning_last(p["path"]) and _parent(p["path"]) == folder]
        if not last and links:  # save_last="link": the link's target (relative to its folder)
            tag = (links[-1].get("target") or "").strip()
            return (_join(folder, tag) if folder and tag else tag or None), True
        return (last[-1] if last else None), bool(last)
    if framework == "deepspeed":
        latest = next((p for p in v.get("pointers") or [] if _base(p["path"]) == "latest"
                       and _parent(p["path"]) == folder), None)
        if latest is None:
            return None, False
        tag = (latest.get("target") or "").strip()
        return (_join(folder, tag) if folder else tag) if tag else None, True
    return None, False


def _same_state(v: dict, a: Optional[str], b: str) -> bool:
    """Whether resuming from ``a`` is resuming from ``b``: the same unit, or a copy of it usable for resume at
    the same step (Lightning's ``last.ckpt`` beside ``epoch=E-step=S.ckpt``)."""
    if a == b:
        return True
    by = {u["unit"]: u for u in v.get("units") or []}
    ua, ub = by.get(a or ""), by.get(b)
    return bool(ua and ub and ua["usable_for"] == "resume" and ua.get("step") is not None
                and ua.get("step") == ub.get("step"))


def instruction(v: Dict) -> Optional[str]:
    """One sentence: how to resume from the verdict's rollback point in its framework's terms, when the
    framework's default would resume from another unit (or fail); None when the default is right."""
    rb = v.get("rollback")
    if not rb or v.get("recommendation") != "resume":
        return None
    by = {u["unit"]: u for u in v.get("units") or []}
    unit = by.get(rb["unit"]) or {"unit": rb["unit"], "layout": ""}
    fw = framework_of(unit)
    run_dir = str(v.get("run_dir") or "")
    how = call(fw, run_dir, rb["unit"])
    pick, has_default = default_pick(v, fw, rb["unit"])
    if has_default:
        if _same_state(v, pick, rb["unit"]):
            return None
        picked = f"would take {pick}" if pick else "would not find it"
        return (f"Resume from {rb['unit']} explicitly: {how}; {NAMES[fw]}'s default "
                f"{DEFAULT_CALL.get(fw, 'resume')} {picked}.")
    newest = v.get("newest") or {}
    if newest.get("unit") in (None, rb["unit"]) or _same_state(v, newest.get("unit"), rb["unit"]):
        return None
    if fw in NAMES:
        return f"Resume from {rb['unit']} explicitly: {how}; the newest unit is {newest['unit']}."
    return f"To resume, {how}, not the newest unit {newest['unit']}."
