"""The JSON Schemas of what ckptaudit writes for other programs: ``verdict.schema.json`` (``verdict.json``,
schema ``ckptaudit.verdict/1``) and ``drill.schema.json`` (the drill's ``drill.json``, ``ckptaudit.drill/1``).
Draft 2020-12, checked with ``jsonschema`` (a Snakemake dependency).  Within a schema version keys may be added,
never removed or changed in meaning; a change that breaks a reader bumps the version (``/2``).

With ``CKPTAUDIT_CHECK_VERDICT_SCHEMA=1`` in the environment the report job validates every verdict it writes,
and the drill every drill.json, and each fails when its document does not match (the test suite sets it, so
every verdict and drill document a test writes is checked).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

__all__ = ["schema", "problems", "verdict_schema", "verdict_problems", "check_verdict", "drill_problems",
           "check_drill", "CHECK_ENV"]

CHECK_ENV = "CKPTAUDIT_CHECK_VERDICT_SCHEMA"
NAMES = ("verdict", "drill")


@lru_cache(maxsize=len(NAMES))
def schema(name: str) -> dict:
    """The parsed ``<name>.schema.json`` (``name`` one of :data:`NAMES`); ``KeyError`` for another name."""
    if name not in NAMES:
        raise KeyError(name)
    return json.loads((Path(__file__).with_name(f"{name}.schema.json")).read_text())


def problems(doc: dict, name: str) -> list:
    """``["/path: message", …]`` where ``doc`` does not match schema ``name`` ([] when it does)."""
    import jsonschema

    v = jsonschema.Draft202012Validator(schema(name))
    return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


def _check(doc: dict, name: str) -> None:
    if not os.environ.get(CHECK_ENV):
        return
    found = problems(doc, name)
    if found:
        raise ValueError(f"{name}.json does not match ckptaudit/schemas/{name}.schema.json: " + "; ".join(found[:5]))


def verdict_schema() -> dict:
    """The parsed ``verdict.schema.json``."""
    return schema("verdict")


def verdict_problems(doc: dict) -> list:
    """Where ``doc`` does not match the verdict schema ([] when it does)."""
    return problems(doc, "verdict")


def drill_problems(doc: dict) -> list:
    """Where ``doc`` does not match the drill schema ([] when it does)."""
    return problems(doc, "drill")


def check_verdict(doc: dict) -> None:
    """Raise ``ValueError`` naming the first problems when ``CHECK_ENV`` is set and ``doc`` does not match."""
    _check(doc, "verdict")


def check_drill(doc: dict) -> None:
    """Raise ``ValueError`` naming the first problems when ``CHECK_ENV`` is set and ``doc`` (drill.json) does
    not match."""
    _check(doc, "drill")
