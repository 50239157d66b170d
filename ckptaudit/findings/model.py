"""The finding model: a catalogue entry (:class:`Kind`) and one diagnosis on one unit (:class:`Finding`).

A kind names its ``stage`` (the Snakemake rule whose job runs its detector, which is also the table the
finding is written to; ``"any"`` for a kind every stage can raise) and its ``detector``
(``module:function``, ``module:Class.method`` for a method): the function where the finding is decided
and built.  :func:`ckptaudit.findings.make` copies both into every :class:`Finding`, so a finding in a
report leads straight to the code that made it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict

LAYERS = ("file", "structure", "state", "security")
SEVERITIES = ("error", "warning", "info")
USES = ("resume", "warm-start", "none")  # best first
#: the Snakemake rules that run detectors (rule name = stage = table name), and "any" (raised by every stage)
STAGES = ("inventory", "hash", "scan", "load", "configdiff", "target", "structure", "state", "report", "any")


@dataclass(frozen=True)
class Kind:
    """One catalogue entry.  Templates use ``str.format`` fields."""

    kind: str
    layer: str
    severity: str
    caps: str
    message: str
    next_step: str
    repair: str = ""
    stage: str = ""  # one of STAGES
    detector: str = ""  # "ckptaudit.formats.sniff:generic_findings" (module:function or module:Class.method)


@dataclass
class Finding:
    """One diagnosis on one unit.

    ``message``, ``next_step`` and ``repair`` are already rendered; ``detail``
    keeps the structured values the templates were filled with (bytes, keys,
    steps) so tables and tests can read them without parsing prose.  ``stage``
    and ``detector`` come from the kind's catalogue entry.
    """

    kind: str
    layer: str
    severity: str
    caps: str
    message: str
    next_step: str
    repair: str = ""
    path: str = ""  # file inside the unit the finding is about ("" = whole unit)
    detail: Dict[str, Any] = field(default_factory=dict)
    stage: str = ""
    detector: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Finding":
        return cls(**{k: d.get(k, "" if k != "detail" else {}) for k in cls.__dataclass_fields__})
