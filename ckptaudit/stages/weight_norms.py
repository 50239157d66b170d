"""The weights' L2 norms of one unit, kept as columns and written as the state table's ``tensor_norms_json``.

A dict of 1,000,000 names to floats is ~120 MiB of Python objects (issue 45: the state job at 1,000,000
safetensors entries); :class:`WeightNorms` keeps each name's UTF-8 bytes end to end, its norm and its hash in
arrays (~30 bytes a weight) and answers as that dict would: a name set again keeps its first place and takes
the new norm, a dropped name (non-finite values) leaves the dict until set again.
"""

from __future__ import annotations

import io
import json
import math
from array import array
from typing import Dict, Iterator, List, Tuple

__all__ = ["WeightNorms", "norms_json"]


class WeightNorms:
    """``{name: norm}`` of a unit's weights, set and dropped in the order the state layer judges them."""

    def __init__(self) -> None:
        self._names = bytearray()
        self._ends = array("q")
        self._norms = array("d")
        self._hashes = array("q")
        self._drops: List[Tuple[int, str]] = []  # (how many were set before it, name): the names dropped

    def set(self, name: str, norm: float) -> None:
        """``norms[name] = norm``."""
        self._names += name.encode("utf-8", "surrogatepass")
        self._ends.append(len(self._names))
        self._norms.append(norm)
        self._hashes.append(hash(name))

    def drop(self, name: str) -> None:
        """``norms.pop(name, None)``."""
        self._drops.append((len(self._ends), name))

    def items(self) -> Iterator[Tuple[str, float]]:
        """The ``(name, norm)`` pairs the dict would hold, in its order."""
        if self._plain():
            yield from self._set_items()
            return
        yield from self._replayed().items()

    def __bool__(self) -> bool:
        return next(iter(self.items()), None) is not None

    def _set_items(self) -> Iterator[Tuple[str, float]]:
        a = 0
        for i, end in enumerate(self._ends):
            yield self._names[a:end].decode("utf-8", "surrogatepass"), self._norms[i]
            a = end

    def _plain(self) -> bool:
        """Whether every name was set once and none dropped after it was set: the sets in order are the dict."""
        import numpy as np

        if self._drops:
            dropped = {hash(n) for _, n in self._drops}
            if any(h in dropped for h in self._hashes):
                return False
        h = np.sort(np.frombuffer(self._hashes, np.int64)) if len(self._hashes) else np.zeros(0, np.int64)
        return not bool((h[1:] == h[:-1]).any())

    def _replayed(self) -> Dict[str, float]:
        """The dict itself, the sets and drops replayed in their order (a name judged twice: rare)."""
        out: Dict[str, float] = {}
        drops = iter(self._drops)
        nxt = next(drops, None)
        for i, (name, v) in enumerate(self._set_items()):
            while nxt is not None and nxt[0] <= i:
                out.pop(nxt[1], None)
                nxt = next(drops, None)
            out[name] = v
        while nxt is not None:
            out.pop(nxt[1], None)
            nxt = next(drops, None)
        return out


def norms_json(norms) -> str:
    """``json.dumps({name: round(norm, 6)})`` of ``norms`` (a dict or a :class:`WeightNorms`), written entry by
    entry: ``json.dumps`` of a dict builds a chunk per key and value at once (~130 MiB at 1,000,000 weights,
    issue 45) and a rounded copy of the dict before it; this holds the text alone."""
    out = io.StringIO()
    key, sep = json.encoder.encode_basestring_ascii, "{"
    for k, v in norms.items():
        r = round(v, 6)
        out.write(f"{sep}{key(k)}: {float.__repr__(r) if math.isfinite(r) else json.dumps(r)}")
        sep = ", "
    out.write("}" if sep == ", " else "{}")
    return out.getvalue()
