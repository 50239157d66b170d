"""A producer's resume rules about combinations of components: what its resume starts fresh, silently.

A framework's resume does not read a checkpoint file by file, and reads some keys of every file it loads: the HF
Trainer loads ``optimizer.pt`` only when
``scheduler.pt`` is there too, and otherwise continues with a fresh optimizer and schedule without a word.
Accelerate's ``load_state`` raises when a folder's ``custom_checkpoint_<i>.pkl`` files are not as many as the
objects the job registered.  The rules are data on each producer (:class:`ckptaudit.producers.contract.RestoreRule`
and :class:`~ckptaudit.producers.contract.CountRule`, with where in the framework's code each one is),
applied to the units of its layouts (with the contracts off too: the layout is recognised by structure);
:func:`broken` judges one unit's components, :func:`count_mismatches` the run's units against each other and
:func:`missing_keys` the root keys of a unit's files (:class:`~ckptaudit.producers.contract.RequiredKeys`: Lightning's
``trainer.fit`` raises ``KeyError`` on a ``.ckpt`` without ``pytorch-lightning_version``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import List

from .. import findings as F
from .. import producers, resume_hint
from ..producers.paths import base


def _resume_call(p, unit: str) -> str:
    """The producer's own resume call for run-relative ``unit`` (:func:`ckptaudit.resume_hint.call`), or "the
    resume" for a producer without one."""
    return resume_hint.call(p.key, "", unit) if p is not None and p.resume_call else "the resume"


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
        call = _resume_call(p, name)
        out.append((F.make("resume_starts_component_fresh", path=name, component=rule.component,
                           needs=" and ".join(lacking), framework=p.name if p else key,
                           source=rule.source, call=call), lacking))
    return out


def count_mismatches(units: List[dict]) -> List[tuple]:
    """``[(unit, registered_count_mismatch finding)]`` for each unit of a producer with a
    :class:`~ckptaudit.producers.contract.CountRule` whose count of those files differs from the run's.

    The run's count stands for what the resuming job has (the audit cannot see the job's registrations): the
    count most of the producer's complete units hold, or the newest unit's when that is larger (an object
    registered later in the run: the job that resumes is the code of the newest save)."""
    groups = {}
    for u in units:
        p = producers.for_layout(u.get("layout") or "")
        if p is not None and p.file_counts and not u.get("in_progress"):
            groups.setdefault(p.key, (p, []))[1].append(u)
    out = []
    for p, us in groups.values():
        us = sorted(us, key=lambda u: (u.get("step_from_name") is None, u.get("step_from_name") or 0, u["unit"]))
        for rule in p.file_counts:
            rx = re.compile(rule.pattern)
            counts = [sum(1 for f in u.get("files") or () if rx.fullmatch(base(f))) for u in us]
            if len(set(counts)) < 2:
                continue
            tally = Counter(counts)
            common = max(tally.values())
            want = max(max(c for c in tally if tally[c] == common), counts[-1])
            for u, have in zip(us, counts):
                if have != want:
                    call = _resume_call(p, u["unit"])
                    out.append((u["unit"], F.make("registered_count_mismatch", path=u["unit"], have=have, want=want,
                                                  pattern=rule.pattern, counted=rule.counted, framework=p.name,
                                                  call=call, source=rule.source)))
    return out


def missing_keys(unit: dict, tree: dict) -> List[F.Finding]:
    """``resume_key_missing`` for each file of ``unit`` (an inventory row: ``unit``, ``layout``) whose root (in
    ``tree``, the scan's ``{file key: pruned object}``) is in a producer's checkpoint format but lacks a key the
    producer's resume reads from every file (:class:`~ckptaudit.producers.contract.RequiredKeys`).

    The producer is the one whose layout the unit has or that claims it (Lightning: a ``.ckpt`` file), or any
    producer whose format the root shows by structure (``min_format_keys`` of its ``format_keys``); the root must
    show the format either way, so a plain ``.ckpt`` of a custom loop is never judged by Lightning's rule."""
    claimed = producers.for_unit(unit)
    out = []
    for fkey, root in tree.items():
        if not isinstance(root, dict):
            continue
        keys = set(root)
        for p in producers.PRODUCERS:
            rule = p.required_keys
            if rule is None or len(rule.format_keys & keys) < rule.min_format_keys - (p is claimed):
                continue
            lacking = [k for k in rule.keys if k not in keys]
            if rule.weights_only_without and not (rule.weights_only_without & keys):
                lacking = [k for k in lacking if k not in rule.weights_only_without]  # a weights-only save
            if lacking:
                out.append(_missing_keys_finding(unit["unit"], fkey, p, rule, lacking))
    return out


def _missing_keys_finding(unit: str, fkey: str, p, rule, lacking: List[str]) -> F.Finding:
    """The ``resume_key_missing`` finding of one file (``fkey``: its key in the scan tree, ``root`` for a file
    unit) lacking ``lacking`` under producer ``p``'s rule; the repair writes a copy beside it with the keys added."""
    path = unit if fkey == "root" else fkey
    stem, dot, ext = path.rpartition(".")
    fixed = f"{stem}.repaired.{ext}" if dot and "/" not in ext else f"{path}.repaired"
    codes = [rule.repair[k].format(file=path, fixed=fixed, key=k) for k in lacking if k in rule.repair]
    call = _resume_call(p, unit)
    return F.make("resume_key_missing", path=path, framework=p.name, call=call,
                  keys=" and ".join(repr(k) for k in lacking), them="it" if len(lacking) == 1 else "them",
                  consequences="; ".join(f"{rule.keys[k]} (no {k!r})" if len(lacking) > 1 else rule.keys[k]
                                         for k in lacking),
                  source=rule.source,
                  repair_text=(f", or resume from the copy {fixed!r} the repair writes" if codes and
                               len(codes) == len(lacking) else ""),
                  repair_code="\n".join(codes) if len(codes) == len(lacking) else "")
