"""The finding catalogue: every kind of problem the audit can report, as data.

A *finding* is one row of diagnosis attached to one checkpoint unit (or to a
pointer such as ``latest``).  Each kind is declared once in :data:`CATALOGUE`
with its layer, its severity, a plain-words message template, the next step a
person should take, an optional exact ``repair`` template, the ``stage`` that
raises it and its ``detector`` (the function that decides and builds it), and
``caps`` — the best use a unit carrying this finding can still be put to:

* ``"resume"``     – the finding does not stop a faithful resume (possibly after
  the ``repair`` is applied);
* ``"warm-start"`` – the weights are usable, the training state is not;
* ``"none"``       – the unit must not be used at all.

The verdict (:mod:`ckptaudit.verdict`) takes the minimum cap over a unit's
findings as its ``usable_for``; nothing else in the code decides usability.

The package: :mod:`.model` (Kind, Finding, the vocabularies), one data file per
layer (:mod:`.file`, :mod:`.structure`, :mod:`.state`, :mod:`.security`),
:mod:`.catalogue` (assembly), :mod:`.build` (make, usable_for), :mod:`.repair_imports`
(the imports a printed Python repair needs) and :mod:`.docs` (the README table and
``docs/findings.md``).  It imports nothing heavy (no torch, no pandas) and nothing
else of ckptaudit: the Snakefile and every rule may import it.
"""

from __future__ import annotations

from .build import make, usable_for  # noqa: F401
from .catalogue import CATALOGUE  # noqa: F401
from .docs import DOCS_PATH, catalogue_markdown, findings_markdown, update_docs, update_readme
from .model import LAYERS, SEVERITIES, STAGES, USES, Finding, Kind

__all__ = [
    "CATALOGUE", "DOCS_PATH", "Finding", "Kind", "LAYERS", "SEVERITIES", "STAGES", "USES",
    "catalogue_markdown", "findings_markdown", "make", "update_docs", "update_readme", "usable_for",
]
