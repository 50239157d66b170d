"""``sha256sum`` sidecars: one line ``<64 hex digits><space><space or *><file name>`` per file (GNU coreutils
manual, "md5sum invocation"); a bare digest with no name is accepted for a one-file unit."""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

_LINE = re.compile(r"^\\?([0-9a-fA-F]{64}) [ *](.+)$")


def parse_sidecar(text: str) -> Tuple[Dict[str, str], Optional[str]]:
    """Parse sha256sum output: ({file name: hex}, error or None)."""
    out: Dict[str, str] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _LINE.match(line.rstrip("\r"))
        if not m:
            bare = line.strip()
            if re.fullmatch(r"[0-9a-fA-F]{64}", bare):  # hash only, no name: accepted
                out[""] = bare.lower()
                continue
            return out, f"line {i} is not '<64 hex>  <name>': {line[:80]!r}"
        out[m.group(2)] = m.group(1).lower()
    if not out:
        return out, "empty sidecar"
    return out, None
