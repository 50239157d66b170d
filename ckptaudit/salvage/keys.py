"""The keys salvaged tensors are written under: one per tensor of an output file, unique and reversible.

A tensor's key is its path in the saved object joined with ``.`` (``model.fc.weight``), the key a state_dict
has, so that ``model.load_state_dict`` takes the file as it is.  Joining loses one fact: ``{"a.b": t}`` (a flat
key holding a dot) and ``{"a": {"b": t}}`` (nested) both join to ``a.b``, and two payloads under one key make a
safetensors file that does not open.  Where joined paths collide, each colliding tensor's key is escaped instead:
inside each component ``%`` is written ``%25`` and ``.`` ``%2E`` (so ``a%2Eb`` is the one flat key ``a.b``, and
``a.b`` two components), read back by splitting on ``.`` and un-escaping each part (:func:`unescape`).  A key
that is still not unique (``{0: t}`` and ``{"0": t}``: an int and a str key print alike), or that no
safetensors header can hold (``__metadata__``, text that is not UTF-8), is refused: not written, with one
line.  ``salvage.json`` lists each tensor's ``path`` (components) beside its ``key``.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Tuple

from ..intact.proof import TensorBytes

__all__ = ["assign", "escaped", "unescape"]

#: the one name a safetensors header keeps for itself (safetensors ``docs/source/index.mdx``, "Format")
RESERVED = "__metadata__"


def escaped(parts) -> str:
    """The escaped key of a path: components joined by ``.``, each with ``%`` → ``%25`` and ``.`` → ``%2E``."""
    return ".".join(str(p).replace("%", "%25").replace(".", "%2E") for p in parts)


def unescape(key: str) -> List[str]:
    """The components of an escaped key (the inverse of :func:`escaped` for str components)."""
    return [p.replace("%2E", ".").replace("%25", "%") for p in key.split(".")]


def assign(tensors: List[TensorBytes]) -> List[Tuple[TensorBytes, str]]:
    """Set ``key`` on each of ``tensors`` (those written into one file); returns ``(tensor, why)`` of each refused
    one (its ``key`` stays None).  Plain joined names where they are unique, escaped ones where they collide."""
    plain = [t.name for t in tensors]
    n = Counter(plain)
    keys = [k if n[k] == 1 else escaped(t.parts or (t.name,)) for t, k in zip(tensors, plain)]
    for _ in range(2):  # an escaped key may meet another's plain one: escape that one too
        n = Counter(keys)
        if all(v == 1 for v in n.values()):
            break
        keys = [escaped(t.parts or (t.name,)) if n[k] > 1 else k for t, k in zip(tensors, keys)]
    n = Counter(keys)
    refused = []
    for t, k in zip(tensors, keys):
        why = _unusable(k, n[k])
        if why:
            refused.append((t, why))
        else:
            t.key = k
    return refused


def _unusable(key: str, times: int) -> str:
    if times > 1:
        return f"its key {key!r} is another tensor's too, escaped or not (keys that print alike, e.g. 0 and '0')"
    if key == RESERVED:
        return f"its key {key!r} is the one a safetensors header reserves"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return f"its key {key!r} is not UTF-8 text"
    return ""


def by_file(tensors: List[TensorBytes]) -> Dict[str, List[TensorBytes]]:
    """``{source file: its tensors}`` in the order given."""
    out: Dict[str, List[TensorBytes]] = {}
    for t in tensors:
        out.setdefault(t.file, []).append(t)
    return out
