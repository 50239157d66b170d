"""Saves whose files are loaded together: one unusable file makes the others of its save unusable too.

Some producers write one file per rank and resume every rank from the same save, choosing it by names alone
(NVRx's ``find_latest``: the newest iteration every rank *holds*, :mod:`ckptaudit.producers.nvrx`).  Each file
is its own unit here, judged alone by every stage; only the run shows that rank 1's cut file of iteration 30
makes rank 0's intact file of 30 no rollback point: the resume picks 30 and rank 1's load fails.  The producers
say which files belong together (:func:`ckptaudit.producers.spoiled_saves`); :func:`findings` turns that into
``save_spoiled_by_another_rank`` on each usable file of such a save.
"""

from __future__ import annotations

from typing import Dict, List

from . import findings as F
from . import producers


def findings(units: List[dict]) -> Dict[str, List[dict]]:
    """``{unit: [finding dict]}`` for the verdict units (``unit``, ``usable_for``) that a damaged file of their
    own save spoils; {} when contracts are off."""
    if not producers.enabled():
        return {}
    spoiled = producers.spoiled_saves({u["unit"]: u["usable_for"] for u in units})
    return {u: [F.make("save_spoiled_by_another_rank", path=u, why=why).to_dict()] for u, why in spoiled.items()}
