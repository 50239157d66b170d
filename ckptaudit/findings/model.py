"""The finding model: a catalogue entry (:class:`Kind`) and one diagnosis on one unit (:class:`Finding`).

A kind names its ``stage`` (the Snakemake rule whose job runs its detector, which is also the table the
finding is written to; ``"any"`` for a kind every stage can raise) and its ``detector``
(``module:function``, ``module:Class.method`` for a method): the function where the finding is decided
and built.  :func:`ckptaudit.findings.make` copies both into every :class:`Finding`, so a finding in a
report leads straight to the code that made it.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, asdict, dataclass, field
from typing import Any, Dict

LAYERS = ("file", "structure", "state", "security")
SEVERITIES = ("error", "warning", "info")
USES = ("resume", "warm-start", "none")  # best first
#: the Snakemake rules that run detectors (rule name = stage = table name), and "any" (raised by every stage)
STAGES = ("inventory", "hash", "scan", "load", "target", "structure", "configdiff", "state", "report", "any")


@dataclass
class _Entry:
    """The fields a catalogue entry and a finding share: which kind, its layer, severity and caps, and what to
    tell a person (templates in a :class:`Kind`, rendered text in a :class:`Finding`)."""

    kind: str
    layer: str
    severity: str
    caps: str
    message: str
    next_step: str
    repair: str = ""


@dataclass(unsafe_hash=True)  # hashable by value, as a frozen dataclass is
class Kind(_Entry):
    """One catalogue entry, read-only once built.  Templates use ``str.format`` fields."""

    stage: str = ""  # one of STAGES
    detector: str = ""  # "ckptaudit.formats.sniff:generic_findings" (module:function or module:Class.method)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__:  # set once by __init__, never again
            raise FrozenInstanceError(f"cannot assign to field {name!r}: a catalogue entry is read-only")
        object.__setattr__(self, name, value)


@dataclass
class Finding(_Entry):
    """One diagnosis on one unit: a :class:`Kind`'s fields with its templates rendered.

    ``message``, ``next_step`` and ``repair`` are already rendered; ``detail``
    keeps the structured values the templates were filled with (bytes, keys,
    steps) so tables and tests can read them without parsing prose.  ``stage``
    and ``detector`` come from the kind's catalogue entry.
    """

    path: str = ""  # file inside the unit the finding is about ("" = whole unit)
    detail: Dict[str, Any] = field(default_factory=dict)
    stage: str = ""
    detector: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Finding":
        return cls(**{k: d.get(k, "" if k != "detail" else {}) for k in cls.__dataclass_fields__})
