"""Tricks that hide what a pickle loads: the one builder of ``pickle_obfuscation``, and two layout checks that find them.

:func:`ckptaudit.security.scan` reports the static walk's tricks (computed ``STACK_GLOBAL``, memo
rebinding, ``EXT`` codes, nested pickles, hidden streams) through :func:`obfuscation`; the shared file
scanner (:func:`ckptaudit.layouts.base.scan_file`) asks :func:`disguised` (a pickle under a pickle-free
name) and :func:`mixed_archive` (an archive torch and other tools read differently).
"""

from __future__ import annotations

from typing import Any, List, Sequence

from .. import findings
from ..findings import Finding

#: Sniff kinds (:mod:`ckptaudit.formats.sniff`) whose bytes are, or hold, a pickle.
PICKLE_KINDS = ("torch_zip", "torch_legacy", "pickle", "zip")


def obfuscation(path: str, member: str, why: str, **extra: Any) -> Finding:
    """``pickle_obfuscation``: the pickle in ``member`` of ``path`` hides what it imports (``why``);
    ``extra`` is kept in the detail (``tricks``: the walk's list)."""
    return findings.make("pickle_obfuscation", path=path, member=member, why=why, **extra)


def disguised(display: str, kind: str) -> List[Finding]:
    """A file named like a pickle-free format (safetensors, npy/npz) whose bytes are a pickle (sniff ``kind``):
    loaders that dispatch on content (``torch.load`` on anything) would unpickle it although its name says
    it is safe.  ``[pickle_obfuscation]`` or ``[]``."""
    if display.lower().endswith((".safetensors", ".npy", ".npz")) and kind in PICKLE_KINDS:
        return [obfuscation(display, display,
                            f"it is named like a pickle-free format but its bytes are a {kind.replace('_', ' ')}")]
    return []


def mixed_archive(display: str, names: Sequence[str]) -> List[Finding]:
    """A zip whose records ``names`` mix record folders or hold several data.pkl: torch reads one, other
    tools another.  ``[pickle_obfuscation]`` or ``[]``."""
    prefixes = sorted({n.split("/", 1)[0] for n in names if "/" in n})
    pkls = sorted(n for n in names if n.endswith("data.pkl"))
    if len(prefixes) > 1 or len(pkls) > 1:
        return [obfuscation(display, ", ".join(pkls) or "(none)",
                            f"the archive mixes record folders {prefixes} or holds several data.pkl "
                            f"({len(pkls)}); torch reads one and other tools another")]
    return []
