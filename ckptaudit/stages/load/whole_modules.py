"""Whole modules pickled as objects: a file that ``weights_only`` refuses by design, not because it is damaged.

A loop that calls ``torch.save(model)`` (or saves ``{"model": model, ...}``, as ultralytics does) pickles the
``torch.nn.Module`` object itself: its class and every submodule's class are globals of the pickle, which
``torch.load(weights_only=True)`` refuses ("Unsupported global").  The bytes may be intact (the hash stage's
CRC32 of every zip record, the static walk of the whole pickle); what loading them takes is
``torch.load(..., weights_only=False)``, which imports those classes and runs their code.  So the load test's
refusal of such a file is not ``load_failed`` but :func:`refusal`: a security note that names the classes and
keeps the unit usable for the resume that loads it that way.  The weights are the module's tensors, found by
structure (:func:`ckptaudit.recognise.is_module`).
"""

from __future__ import annotations

import json
from typing import Dict, List

from ... import findings as F
from ... import recognise as R

#: The refusals of ``torch.load(weights_only=True)`` that a whole-module pickle causes (torch/serialization.py,
#: torch/_weights_only_unpickler.py in torch 2.x).
REFUSALS = ("Unsupported global", "Weights only load failed")
#: The scan tree's key of a file unit's one file (:mod:`ckptaudit.layouts`).
ROOT = "root"


def modules_by_file(scan_row: dict) -> Dict[str, List[str]]:
    """{tree file key: the module classes pickled whole in it} of a unit's scan row (its ``tree_json``)."""
    try:
        tree = json.loads(scan_row.get("tree_json") or "{}")
    except ValueError:
        return {}
    out: Dict[str, List[str]] = {}
    for fkey, sub in (tree.items() if isinstance(tree, dict) else ()):
        classes = [c for n in R.find({fkey: sub}).of("weights") if R.is_module(n.node)
                   for c in R.module_classes(n.node)]
        if classes:
            out[fkey] = list(dict.fromkeys(classes))
    return out


def classes_in(file: str, by_file: Dict[str, List[str]]) -> List[str]:
    """The module classes pickled whole in run-relative ``file`` (``by_file`` keys are the scan tree's: the
    file's path inside its folder unit, or ``"root"``, the one file of a file unit)."""
    for key, classes in by_file.items():
        if key == ROOT or file == key or file.endswith("/" + key):
            return classes
    return []


def refusal(path: str, classes: List[str], error_message: str):
    """``whole_module_pickle`` for ``path`` when ``torch.load(weights_only=True)`` refused it
    (``error_message``) and it pickles the module ``classes`` whole; None for any other failure."""
    if not classes or not any(r in error_message for r in REFUSALS):
        return None
    shown = ", ".join(classes[:6]) + (f" and {len(classes) - 6} more" if len(classes) > 6 else "")
    return F.make("whole_module_pickle", path=path, classes=shown, n_classes=len(classes), top=classes[0])


def in_verdict(verdict: dict, unit: str) -> bool:
    """Whether ``unit`` of ``verdict`` holds a file that pickles whole modules (a ``whole_module_pickle``
    finding): the reader cannot load it with ``weights_only=True``, and says so instead of failing."""
    return any(f.get("kind") == "whole_module_pickle" for u in verdict.get("units") or [] if u.get("unit") == unit
               for f in u.get("findings") or [])
