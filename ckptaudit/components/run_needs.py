"""What the run-wide judgement of missing components asks of one unit: its components reduced to a few fields.

:func:`ckptaudit.run_findings.missing_components` decides, for the whole run, which units lack a scheduler or
RNG state that the run had.  It asks of each unit only whether it is judged at all (a training checkpoint), which
of the two components it holds, what its producer never or always saves, whether a torch LR scheduler drove its
optimizer and at which learning rates, and which of its producer's restore rules it breaks
(:func:`ckptaudit.components.restore_rules.broken`).  The state stage collects every unit's components already
(:func:`ckptaudit.stages.state.analyse_unit`); it writes these fields as the ``state`` table's
``run_needs_json``, so the report reads a few hundred bytes a unit instead of parsing the unit's scan tree and
collecting its components again (1.1 ms a unit at 10,000 units, on the audit's last, single job).  A state row
without the column (one the state stage's liveness guard wrote) is collected from the scan row, as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .. import findings as F


def judged(s: Optional[dict], c) -> bool:
    """True for a unit the state stage judged as a training checkpoint (weights and training state): ``s`` its
    state row (as a record, or the row's columns as the state stage decides them), ``c`` its
    :class:`~ckptaudit.components.Components`."""
    return bool(s) and s.get("has_weights") is True and s.get("has_optimizer") is not None and \
        not c.weights_only_format and (c.optimizer is not None or c.scheduler is not None or c.step is not None)


@dataclass(frozen=True)
class RunNeeds:
    """One unit's components as the run-wide judgement reads them.

    ``judged``: a training checkpoint (weights and training state; :func:`judged`);
    ``scheduler`` / ``rng``: it holds them; ``never_saves`` / ``always_saves`` / ``producer``: its producer's
    contract; ``scheduled_by_torch``, ``group_lrs``: :class:`~ckptaudit.components.Components`' of the same names;
    ``broken``: ``(finding, the needs it names)`` of each restore rule the unit breaks."""

    judged: bool
    scheduler: bool = False
    rng: bool = False
    never_saves: frozenset = frozenset()
    always_saves: frozenset = frozenset()
    producer: str = ""
    scheduled_by_torch: bool = False
    group_lrs: Tuple[float, ...] = ()
    broken: Tuple[Tuple[F.Finding, Tuple[str, ...]], ...] = ()

    @classmethod
    def of(cls, unit: str, c, judged: bool) -> "RunNeeds":
        """The needs of unit ``unit`` whose components are ``c`` (:class:`~ckptaudit.components.Components`)."""
        from .restore_rules import broken

        if not judged:
            return cls(False)
        return cls(True, c.scheduler is not None, bool(c.rng), frozenset(c.never_saves), frozenset(c.always_saves),
                   c.producer, c.scheduled_by_torch, tuple(c.group_lrs),
                   tuple((f, tuple(needs)) for f, needs in broken(unit, c)))

    def to_json(self) -> str:
        """The ``run_needs_json`` cell (:meth:`of_json` reads it back equal)."""
        if not self.judged:
            return json.dumps({"judged": False})
        return json.dumps({"judged": True, "scheduler": self.scheduler, "rng": self.rng,
                           "never_saves": sorted(self.never_saves), "always_saves": sorted(self.always_saves),
                           "producer": self.producer, "scheduled_by_torch": self.scheduled_by_torch,
                           "group_lrs": list(self.group_lrs),
                           "broken": [[f.to_dict(), list(needs)] for f, needs in self.broken]})

    @classmethod
    def of_json(cls, text: Optional[str]) -> Optional["RunNeeds"]:
        """The needs in a ``run_needs_json`` cell; None for an empty cell.  Raises ``ValueError`` (a
        ``json.JSONDecodeError``) on a cell that is not one."""
        if not text:
            return None
        d = json.loads(text)
        if not d.get("judged"):
            return cls(False)
        broken: List[Tuple[F.Finding, Tuple[str, ...]]] = [(F.Finding.from_dict(f), tuple(needs))
                                                            for f, needs in d.get("broken", [])]
        return cls(True, bool(d["scheduler"]), bool(d["rng"]), frozenset(d["never_saves"]),
                   frozenset(d["always_saves"]), str(d["producer"]), bool(d["scheduled_by_torch"]),
                   tuple(float(x) for x in d["group_lrs"]), tuple(broken))
