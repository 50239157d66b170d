"""The plug-in points of the layout adapters: what a folder adapter and an index adapter must provide.

Every module in :mod:`ckptaudit.layouts` exports one object that satisfies one of these
Protocols; the registry (:mod:`ckptaudit.layouts`) is typed with them and
``tests/test_layouts.py`` checks each registered adapter against them, so a new layout
fails fast when it misses a method instead of deep inside a stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover - types only
    from ..units import Unit
    from .base import UnitScan


@runtime_checkable
class LayoutAdapter(Protocol):
    """A checkpoint layout that owns folders (or single files) as units.

    ``name`` is the layout's name in the tables (``inventory.layout``); ``claim_dir(path)``
    says whether folder ``path`` is one unit of this layout (it reads names and at most a few
    small files, never a checkpoint's data); ``scan(run_dir, unit, cfg, byte_facts)`` examines the unit's
    bytes (``byte_facts``: the hash stage's :class:`ckptaudit.onepass.facts.ByteFacts`, which answer for the CRC32s
    and NUL runs its pass computed, or None) and returns its :class:`~ckptaudit.layouts.base.UnitScan`
    (findings, tree, facts, tensors) — it raises only for the audit's own bugs, which the stage turns into an
    ``audit_error`` finding.
    """

    name: str

    def claim_dir(self, path: Path) -> bool: ...

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> "UnitScan": ...


@runtime_checkable
class IndexAdapter(LayoutAdapter, Protocol):
    """A layout whose unit is an index file plus the shards it names (``model.safetensors.index.json``).

    ``claim_index(root, d, names)`` returns the units for the index files among ``names`` in folder
    ``d`` of the run rooted at ``root``.
    """

    def claim_index(self, root: Path, d: Path, names: List[str]) -> List["Unit"]: ...


def folder_names(path: Path) -> Optional[List[str]]:
    """The names in folder ``path`` (local or object storage), or None when it cannot be listed:
    what a ``claim_dir`` looks at."""
    from .. import fs

    try:
        return fs.listdir(path)
    except OSError:
        return None


class NeverClaims:
    """Base of the adapters the registry assigns from the inventory (never by ``claim_dir``)."""

    name = ""

    def claim_dir(self, path: Path) -> bool:
        return False
