"""A unit the static pickle walk gave up on is judged by what ``torch.load`` found in it.

The scan's walk stops at its budget (``pickle_too_complex``); its partial tree cannot say whether the
file holds model weights, so the state layer leaves ``has_weights`` unknown (:func:`ckptaudit.stages.state.analyse_unit`)
rather than call an intact 200,000-tensor checkpoint empty.  The load test has by then loaded every such file
under ``weights_only=True`` and counted the tensors it gave back (:mod:`ckptaudit.stages.load.loaded_object`).  When every
file of the unit loaded and none held a tensor — a pickle of 20 million integers, or of shared lists with
2**35 paths — the unit holds no weights: ``missing_model_weights``, the same finding a walk that finished
would have made.  A file that was not loaded, or whose count ran past its budget, leaves the question open.
"""

from __future__ import annotations

import json
from typing import Dict, Iterable, List

from .components.findings import missing_weights
from .formats.pickles import too_complex


def _cut(scan_row: dict) -> bool:
    return too_complex(json.loads(scan_row.get("findings_json") or "[]"))


def _held(rows: List[dict]) -> str:
    """Words for what the loaded files held instead, for the finding's ``keys``."""
    words = []
    for r in rows:
        k = r.get("n_top_level_keys")
        what = "an object that is not a dict" if k is None or k < 0 else f"a dict of {k} keys"
        words.append(f"{r['file']}: {what} with no tensor (torch.load, weights_only=True)")
    return "; ".join(words)


def findings(units: Iterable[str], scan_rows: Dict[str, dict], state_rows: Dict[str, dict],
             load_rows: Dict[str, List[dict]]) -> Dict[str, List[dict]]:
    """{unit: [missing_model_weights]} for each unit whose walk was cut, whose weights the state layer
    left unknown, and whose every loadable file loaded with ``n_tensors == 0``."""
    out: Dict[str, List[dict]] = {}
    for unit in units:
        scan, st = scan_rows.get(unit), state_rows.get(unit) or {}
        if not scan or not _cut(scan) or st.get("has_weights") is not None:
            continue
        rows = [r for r in load_rows.get(unit, []) if r.get("file")]
        if rows and all(r.get("status") == "ok" and r.get("n_tensors") == 0 for r in rows):
            out[unit] = [missing_weights(unit, _held(rows)).to_dict()]
    return out
