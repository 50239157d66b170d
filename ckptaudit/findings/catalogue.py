"""The catalogue assembled: every layer's entries, keyed by kind."""

from __future__ import annotations

from typing import Dict, List

from . import file, security, state, structure, verification
from .model import Kind

#: Every finding kind, in the order of the catalogue (file, structure, state, security layers).
KINDS_IN_ORDER: List[Kind] = [*file.ENTRIES, *verification.ENTRIES, *structure.ENTRIES, *state.ENTRIES,
                              *security.ENTRIES]

CATALOGUE: Dict[str, Kind] = {e.kind: e for e in KINDS_IN_ORDER}

assert len(CATALOGUE) == len(KINDS_IN_ORDER), "a kind is declared twice"
