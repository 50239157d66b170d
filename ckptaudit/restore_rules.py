"""A producer's resume rules about combinations of components: what its resume starts fresh, silently.

A framework's resume does not read a checkpoint file by file: the HF Trainer loads ``optimizer.pt`` only when
``scheduler.pt`` is there too, and otherwise continues with a fresh optimizer and schedule without a word.
The rules are data on each producer (:class:`ckptaudit.producers.contract.RestoreRule`, with where in the
framework's code each one is), applied to the units of its layouts (with the contracts off too: the layout
is recognised by structure); :func:`broken` judges one unit's components against them.
"""

from __future__ import annotations

from typing import List

from . import findings as F
from . import producers
from .producers.paths import base, parent


def _present(c, comp: str) -> bool:
    """Whether components ``c`` hold ``comp`` (``optimizer``, ``scheduler``, ``scaler``, ``rng``, ``sampler``)."""
    if comp in ("optimizer", "scheduler"):
        return getattr(c, comp) is not None
    return bool(getattr(c, comp, False))


def broken(name: str, c) -> List[tuple]:
    """``[(resume_starts_component_fresh finding, the needs it names)]`` for each rule of the unit's producer
    (:class:`ckptaudit.producers.contract.RestoreRule`) whose component the unit holds without what it needs."""
    out = []
    for key, rule in c.restores_together:
        lacking = [n for n in rule.needs if not _present(c, n)]
        if not _present(c, rule.component) or not lacking:
            continue
        p = producers.by_key(key)
        call = "the resume"
        if p is not None and p.resume_call:
            call = p.resume_call.format(path=name, dir=parent(name), tag=base(name))
        out.append((F.make("resume_starts_component_fresh", path=name, component=rule.component,
                           needs=" and ".join(lacking), framework=p.name if p else key,
                           source=rule.source, call=call), lacking))
    return out
