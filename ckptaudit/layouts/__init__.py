"""Layout adapters: one module per checkpoint layout.

Each adapter answers "is this mine?" (``claim_dir`` for folders,
``claim_index`` for index files) and "what is wrong with it?" (``scan``), the
way torch.distributed.checkpoint lets each storage backend answer
``validate_checkpoint_id``.  Adding a layout means adding one module here and
its finding kinds to :mod:`ckptaudit.findings`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import producers
from . import dcp, published, single
from .adapter import IndexAdapter, LayoutAdapter


def _adapter(spec: str) -> Any:
    """The adapter ``"module:ATTR"`` of this package that a producer names (:mod:`ckptaudit.producers`)."""
    module, attr = spec.split(":")
    return getattr(importlib.import_module(f".{module}", __name__), attr)


# Order matters: the first adapter that claims a folder owns it.  A ckptaudit publish folder comes
# first (its manifest says what each file is) unless it holds a framework's own layout; the producers'
# adapters follow in the claim order they state.
DIR_ADAPTERS: List[LayoutAdapter] = [published.ADAPTER, *map(_adapter, producers.FOLDER_ADAPTERS)]
INDEX_ADAPTERS: List[IndexAdapter] = list(map(_adapter, producers.INDEX_ADAPTERS))
BY_NAME: Dict[str, LayoutAdapter] = {a.name: a for a in DIR_ADAPTERS + INDEX_ADAPTERS}

CHECKPOINT_SUFFIXES = (
    ".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pkl", ".pickle", ".npz", ".npy", ".tar", ".model",
)


def is_checkpoint_file(name: str) -> bool:
    """True for names a checkpoint is saved under (by suffix, also ``x.pt.tmp``)."""
    n = name.lower()
    for suffix in (".tmp", ".partial"):
        if n.endswith(suffix):
            n = n[: -len(suffix)]
    return n.endswith(CHECKPOINT_SUFFIXES)


def is_index_file(name: str) -> bool:
    """True for the name of an index that claims shards (``model.safetensors.index.json``)."""
    return any(a.is_index(name) for a in INDEX_ADAPTERS if hasattr(a, "is_index"))


def claim_dir(path: Path) -> Optional[LayoutAdapter]:
    """The adapter that owns folder ``path`` as one unit, or None."""
    for a in DIR_ADAPTERS:
        if a.claim_dir(path):
            return a
    return None


def claims_names(names: List[str]) -> bool:
    """Whether a folder holding ``names`` is a unit by its names alone (what a folder under a path too long to
    open is judged by): a torch.distributed.checkpoint folder's ``.metadata``/``__R_N.distcp``."""
    return dcp.ADAPTER.claims_names(names)


def file_layout(path: Path) -> str:
    """Layout of a single-file unit from its name and first bytes."""
    return single.layout_of(path)


def reads_records(unit: dict, rel: str) -> bool:
    """Whether a later stage reads file ``rel`` of ``unit`` (an inventory row) by zip record or tensor value, so
    the hash stage's one pass plans it for those facts; an adapter without ``reads_records`` reads them all."""
    ask = getattr(adapter_for(unit), "reads_records", None)
    return True if ask is None else bool(ask(rel))


def adapter_for(unit: dict) -> LayoutAdapter:
    """The adapter that scans ``unit`` (an inventory row); a layout no adapter knows is scanned as in progress."""
    if unit["layout"] == "irregular":  # FIFO, device, foreign symlink, folder under a file name: never opened
        return single.IRREGULAR
    if unit["layout"] == "in-progress":  # incl. an object-store save that never completed (no files)
        return single.IN_PROGRESS
    if unit["kind"] == "file":
        return single.ADAPTER
    return BY_NAME.get(unit["layout"], single.IN_PROGRESS)
