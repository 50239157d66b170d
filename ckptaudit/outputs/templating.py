"""The Jinja environment shared by report.html and drill.html: package templates, escaping, shared filters.

Both pages are rendered from ``ckptaudit/templates`` with HTML autoescaping and ``StrictUndefined`` (a
misspelt variable is an error, not an empty cell); both include ``_style.css`` (one stylesheet) and
``_charts.html.j2`` (the inline-SVG chart macro), so each page stays one self-contained file.
"""

from __future__ import annotations

from typing import Optional

from ..text import step_text


def mib(b: Optional[int], none: str = "") -> str:
    """``123 MiB`` for a byte count, ``none`` for 0 or None."""
    return f"{b / 2**20:.0f} MiB" if b else none


def environment():
    """A fresh ``jinja2.Environment`` over the package templates (jinja2 is imported here, lazily)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ckptaudit", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
    )
    env.filters["step_text"] = step_text
    env.filters["mib"] = mib
    from .summary import repair_where

    env.globals["repair_where"] = repair_where
    return env


def render(template: str, **context) -> str:
    """Render one package template with ``context``."""
    return environment().get_template(template).render(**context)
