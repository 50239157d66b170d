"""Where the publishes in flight in this process are, for :class:`PreemptionGuard`'s handler.

``PHASES`` holds one entry per publish in flight: ``"writing"`` (inside the ``with``
block's body), then ``"closing"``/``"commit"`` once ``__exit__`` has begun.  It is only
ever mutated, never rebound (tests read it as ``ckptaudit.publish.phases.PHASES``).
``EXIT_CODES`` holds the code object of ``_Publish.__exit__`` (registered by
:mod:`.unit`), so the handler can tell a signal that lands on entry to ``__exit__``,
before its first statement, without importing the writer.
"""

from __future__ import annotations

from types import CodeType
from typing import List

# phase of the publishes in flight in this process ("writing" or "commit"), for PreemptionGuard
PHASES: List[str] = []

EXIT_CODES: List[CodeType] = []


def in_exit(code: CodeType) -> bool:
    """True when ``code`` is a registered ``__exit__`` of a publish."""
    return any(code is c for c in EXIT_CODES)
