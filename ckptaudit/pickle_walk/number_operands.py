"""The literal numbers of a pickle as operands, and when two pickles differ only in them.

``BININT``, ``BININT1``, ``BININT2`` and ``BINFLOAT`` carry their number as a fixed-width operand (operand layout
from ``Lib/pickletools.py``): two pickles of the same length that differ only inside such operands decode to the
same opcodes at the same offsets.  :func:`free_bytes` marks those operands; :func:`changed_numbers` is the match
rule every template of :mod:`.templates` and :mod:`ckptaudit.onepass.pickle_templates` uses.
"""

from __future__ import annotations

import io
import pickletools
from typing import Any, List, Optional

#: opcode name → (its operand's struct format, bytes)
FREE = {"BININT": ("<i", 4), "BININT1": ("<B", 1), "BININT2": ("<H", 2), "BINFLOAT": (">d", 8)}
_MEMO_PUTS = ("PUT", "BINPUT", "LONG_BINPUT")


def free_bytes(pkl: bytes) -> Optional[Any]:
    """A numpy int32 array over ``pkl``: at each byte of a ``BININT``/``BININT1``/``BININT2``/``BINFLOAT`` operand
    the offset of its opcode, -1 elsewhere; None when the opcodes cannot be decoded to a ``STOP`` or a memo slot is
    bound twice (``PUT``/``BINPUT``/``LONG_BINPUT``/``MEMOIZE``)."""
    import numpy as np

    from .opcodes import genops

    owner = np.full(len(pkl), -1, dtype=np.int32)
    slots, memoized = set(), 0
    try:
        for op, arg, pos in genops(pkl, io.BytesIO(pkl)):
            free = FREE.get(op.name)
            if free:
                owner[pos + 1:pos + 1 + free[1]] = pos
            elif op.name in _MEMO_PUTS:
                if arg in slots:
                    return None
                slots.add(arg)
            elif op.name == "MEMOIZE":
                memoized += 1
    except ValueError:
        return None
    if memoized and slots:  # MEMOIZE takes the memo's size as its slot: mixed with PUTs they may meet
        return None
    return owner


def changed_numbers(raw: Any, owner: Any, u: Any) -> Optional[List[int]]:
    """The opcode offsets of the literal numbers in which pickle ``u`` (numpy uint8) differs from ``raw`` (its
    :func:`free_bytes` ``owner``), in order; None when ``u`` does not match ``raw`` (another length, or a byte
    outside those numbers' operands differs): the match rule of every template."""
    import numpy as np

    if raw.size != u.size:
        return None
    owners = owner[np.flatnonzero(u != raw)]
    if (owners < 0).any():
        return None
    return np.unique(owners).tolist()


#: opcode byte → (struct format, bytes) of the literal numbers of :data:`FREE`
FREE_AT = {ord(op.code): FREE[op.name] for op in pickletools.opcodes if op.name in FREE}
