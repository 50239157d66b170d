"""The JSON Schemas of what ckptaudit writes for other programs: ``verdict.schema.json`` (``verdict.json``,
schema ``ckptaudit.verdict/1``).  Draft 2020-12, checked with ``jsonschema`` (a Snakemake dependency).

With ``CKPTAUDIT_CHECK_VERDICT_SCHEMA=1`` in the environment the report job validates every verdict it writes
and fails when one does not match (the test suite sets it, so every verdict a test writes is checked).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

__all__ = ["verdict_schema", "verdict_problems", "check_verdict", "CHECK_ENV"]

CHECK_ENV = "CKPTAUDIT_CHECK_VERDICT_SCHEMA"


@lru_cache(maxsize=1)
def verdict_schema() -> dict:
    """The parsed ``verdict.schema.json``."""
    return json.loads((Path(__file__).with_name("verdict.schema.json")).read_text())


def verdict_problems(doc: dict) -> list:
    """``["path: message", …]`` where ``doc`` does not match the verdict schema ([] when it does)."""
    import jsonschema

    v = jsonschema.Draft202012Validator(verdict_schema())
    return [f"/{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]


def check_verdict(doc: dict) -> None:
    """Raise ``ValueError`` naming the first problems when ``CHECK_ENV`` is set and ``doc`` does not match."""
    if not os.environ.get(CHECK_ENV):
        return
    problems = verdict_problems(doc)
    if problems:
        raise ValueError("verdict.json does not match ckptaudit/schemas/verdict.schema.json: "
                         + "; ".join(problems[:5]))
