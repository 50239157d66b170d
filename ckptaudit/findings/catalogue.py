"""The catalogue assembled: every layer's entries, keyed by kind."""

from __future__ import annotations

from typing import Dict, List

from . import file, security, state, structure
from .model import Kind

_ENTRIES: List[Kind] = [*file.ENTRIES, *structure.ENTRIES, *state.ENTRIES, *security.ENTRIES]

CATALOGUE: Dict[str, Kind] = {e.kind: e for e in _ENTRIES}

assert len(CATALOGUE) == len(_ENTRIES), "a kind is declared twice"
