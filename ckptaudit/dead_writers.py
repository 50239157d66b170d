"""Leftovers of ``ckptaudit.publish`` saves whose writer is gone: one finding for the run, not a unit each.

A writer SIGKILLed mid-save leaves its temp file (:func:`ckptaudit._io.tmp_name`); the inventory recognises it
as a save in progress whose process is gone on this host (:data:`ckptaudit.units.DEAD_WRITER_WORDS` in its
``unit_in_progress`` finding, decided once, at inventory time).  Forty-seven such leftovers are one fact
about the run — its disk fills — not forty-seven units: :func:`split` takes them out of the verdict's units
(so they never reach the timeline, the headline or the rollback choice) and :func:`finding` says it once,
with the command that removes them.
"""

from __future__ import annotations

import shlex
from typing import Dict, List, Optional, Tuple

from . import findings as F
from .text import size_text
from .units import DEAD_WRITER_WORDS

EXAMPLES = 3


def is_leftover(u: Dict) -> bool:
    """Whether verdict unit ``u`` is only a ckptaudit.publish temp of a process that is gone."""
    return any(f.get("kind") == "unit_in_progress" and DEAD_WRITER_WORDS in str(f.get("message"))
               for f in u.get("findings") or [])


def split(units: List[Dict]) -> Tuple[List[Dict], List[Dict]]:
    """``(units, leftovers)``: the verdict units without dead writers' temps, and those temps (same order)."""
    kept, left = [], []
    for u in units:
        (left if is_leftover(u) else kept).append(u)
    return kept, left


def finding(leftovers: List[Dict], run_dir: str) -> Optional[Dict]:
    """The ``dead_writer_leftovers`` finding (a dict, as in verdict.json) for ``leftovers`` (verdict units with
    ``unit`` and ``size_bytes``), or None when there are none.  Its repair is ``ckptaudit prune RUN
    --sweep-stale`` with ``run_dir`` quoted for the shell."""
    if not leftovers:
        return None
    size = sum(int(u.get("size_bytes") or 0) for u in leftovers)
    names = [u["unit"] for u in leftovers]
    examples = ", ".join(names[:EXAMPLES]) + (f" and {len(names) - EXAMPLES} more" if len(names) > EXAMPLES else "")
    return F.make("dead_writer_leftovers", path="", count=len(names), size=size_text(size), size_bytes=size,
                  examples=examples, units=names[:100],
                  run_quoted=shlex.quote(run_dir)).to_dict()
