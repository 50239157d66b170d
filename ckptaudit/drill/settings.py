"""The drill's settings: the ``drill:`` block of config/config.yaml over its defaults, and the rule's params."""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any, Dict, Mapping, Optional

from ..config import defaults

#: Defaults of the ``drill:`` block, read from config/config.yaml (config/schema.yaml documents each key).
DEFAULTS: Dict[str, Any] = defaults()["drill"]


def drill_config(cfg: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The ``drill`` block of a full config (``cfg["drill"]``) over :data:`DEFAULTS`."""
    out = dict(DEFAULTS)
    out.update(((cfg or {}).get("drill") or {}))
    out["devices"] = list(out["devices"])
    return out


def rule_config_json(config: Mapping[str, Any]) -> str:
    """The drill block as sorted JSON (a Snakemake param: a changed drill config re-runs the drill)."""
    return json.dumps(drill_config(config), sort_keys=True)


def rule_mem_mb(config: Mapping[str, Any]) -> int:
    """``mem_mb`` of the drill job: one child's limit (children run one after another) plus the parent."""
    return int(drill_config(config)["memory_limit_mib"]) + 512


def rule_runtime_minutes(config: Mapping[str, Any]) -> int:
    """``runtime`` (minutes) of the drill job: every device's child at its timeout, plus a minute."""
    c = drill_config(config)
    return int(math.ceil(float(c["timeout_seconds"]) * len(c["devices"]) / 60.0)) + 1


def report_date(config: Mapping[str, Any]) -> str:
    """``drill.report_date``, or today's UTC date (YYYY-MM-DD): the folder of the dated nightly report."""
    d = drill_config(config).get("report_date") or ""
    return d or _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
