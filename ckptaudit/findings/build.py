"""Building findings from the catalogue, and the best use a unit's findings leave."""

from __future__ import annotations

import string
from typing import Any, Dict, Iterable

from .catalogue import CATALOGUE
from .model import USES, Finding
from .repair_imports import with_imports

_USE_RANK = {u: i for i, u in enumerate(USES)}
#: The layer each stage checks: a kind of stage ``"any"`` (``audit_error``) raised by a stage is on that layer.
STAGE_LAYER = {"hash": "file", "scan": "file", "load": "file", "structure": "structure", "configdiff": "structure",
               "state": "state"}


class _SafeDict(dict):
    def __missing__(self, key):  # unfilled template fields stay visible, never raise
        return "{" + key + "}"


def _render(template: str, values: Dict[str, Any]) -> str:
    if not template:
        return ""
    return string.Formatter().vformat(template, (), _SafeDict(values))


def make(kind: str, path: str = "", **values: Any) -> Finding:
    """Build a :class:`Finding` of a catalogued ``kind``.

    ``values`` fill the kind's templates and are kept in ``detail``.  Raises
    ``KeyError`` for a kind not in :data:`CATALOGUE` (a programming error).
    A Python ``repair`` gets the import lines it needs put before it
    (:func:`ckptaudit.findings.repair_imports.with_imports`), so it runs as printed.
    The kind's ``stage`` and ``detector`` are copied in; a kind of stage
    ``"any"`` takes the ``stage`` value it is given (the stage that raised it)
    and the layer that stage checks (:data:`STAGE_LAYER`).
    """
    k = CATALOGUE[kind]
    vals = dict(values)
    vals.setdefault("path", path)
    stage, layer = k.stage, k.layer
    if stage == "any" and isinstance(values.get("stage"), str) and values["stage"]:
        stage = values["stage"]
        layer = STAGE_LAYER.get(stage, k.layer)
    return Finding(
        kind=k.kind,
        layer=layer,
        severity=k.severity,
        caps=k.caps,
        message=_render(k.message, vals),
        next_step=_render(k.next_step, vals),
        repair=with_imports(_render(k.repair, vals)),
        path=path,
        detail={key: _jsonable(v) for key, v in values.items()},
        stage=stage,
        detector=k.detector,
    )


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def usable_for(findings: Iterable[Finding | Dict[str, Any]], start: str = "resume") -> str:
    """The best use left after ``findings``: the minimum of their caps."""
    best = _USE_RANK[start]
    for f in findings:
        caps = f["caps"] if isinstance(f, dict) else f.caps
        best = max(best, _USE_RANK[caps])
    return USES[best]

