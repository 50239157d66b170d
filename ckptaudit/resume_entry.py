"""The framework's configured resume entry (Lightning's ``last.ckpt`` for ``ckpt_path="last"``) judged by what that resume would do.

lightning 2.6 ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` as a second full save of the
training state (``_save_last_checkpoint`` → ``_save_checkpoint``); only ``save_last="link"`` makes a
symbolic link (:mod:`ckptaudit.inventory` audits that as a pointer).  A real ``last.ckpt`` is
therefore a unit, judged by its own bytes like any other, and it is also the file
``trainer.fit(model, ckpt_path="last")`` loads (``_CheckpointConnector._parse_ckpt_path``: the newest
``last*.ckpt`` of the checkpoint folder).  When it is damaged the newest intact unit is still there,
but a job that resumes the way it was configured crashes in the load (a truncated zip: the
weights-only unpickler's IndexError), so :func:`entry_findings` adds ``resume_entry_damaged`` to it:
the repair copies the rollback unit over it atomically, the next step also names the explicit
``ckpt_path`` (:mod:`ckptaudit.resume_hint`).  The verdict reports the entries and exits 1 while one
is damaged (:func:`ckptaudit.verdict.exit_code`).
"""

from __future__ import annotations

import shlex
from typing import List

from . import findings as F
from .resume_hint import call, is_lightning_last


def _why(u: dict) -> str:
    errs = [f["kind"] for f in u["findings"] if f["severity"] == "error" and f["kind"] != "resume_entry_damaged"]
    return ", ".join(dict.fromkeys(errs)) or f"usable for {u['usable_for']} only"


def entry_findings(units_out: List[dict], run_dir: str) -> List[dict]:
    """The resume entries among ``units_out`` ({"unit", "framework", "ok", "finding"}); a damaged entry
    (not usable for resume) gets a ``resume_entry_damaged`` finding added to its own findings."""
    out = []
    for u in units_out:
        if not is_lightning_last(u["unit"]) or u.get("layout") in ("irregular",):
            continue
        ok = u["usable_for"] == "resume"
        f = None
        if not ok:
            folder = u["unit"].rsplit("/", 1)[0] if "/" in u["unit"] else ""
            good = [x for x in units_out if x["usable_for"] == "resume" and not is_lightning_last(x["unit"])
                    and (x["unit"].rsplit("/", 1)[0] if "/" in x["unit"] else "") == folder
                    and x["unit"].endswith(".ckpt")]
            best = max(good, key=lambda x: (x["step"] if x["step"] is not None else -1,
                                            x.get("name_step") is not None, x["unit"]), default=None)
            dst = shlex.quote(u["unit"])
            if best:
                src = shlex.quote(best["unit"])
                repair = f"cp -p {src} {dst}.tmp && mv {dst}.tmp {dst}"
                instead = (f"Replace it with a copy of {best['unit']} (the repair), or resume with an explicit path: "
                           f"{call('lightning', run_dir, best['unit'])}.")
            else:
                repair = ""
                instead = "No intact Lightning checkpoint is beside it to copy over it; see the verdict's rollback point."
            f = F.make("resume_entry_damaged", path=u["unit"], why=_why(u), next_text=instead, repair_code=repair,
                       intact_text=f" although {best['unit']} is intact" if best else "").to_dict()
            u["findings"].append(f)
            u["usable_for"] = F.usable_for(u["findings"])
        out.append({"unit": u["unit"], "framework": "lightning", "call": 'trainer.fit(model, ckpt_path="last")',
                    "ok": ok, "finding": f})
    return out
