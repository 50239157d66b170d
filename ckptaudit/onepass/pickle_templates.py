"""One static walk per shape of data.pkl in a hash job: the floating tensors' places, shared by same-shape files.

A run's checkpoints of one model come from one ``torch.save`` call site: their data.pkl files hold the same
opcodes, byte for byte, except for the numbers stored as literal operands (the step, the loss, a learning rate).
The hash stage plans each torch zip's value ranges from a static walk of its data.pkl (:func:`.plan._plan_values`:
2.2 ms for the 3,100 opcodes of issue 45's small unit, a third of the hash job's cost per unit).
:class:`PickleTemplates` walks one data.pkl of each shape and hands its floating tensors' places (storage key,
byte offset in the storage, bytes, dtype) to each later data.pkl that *matches* it: the same length, and equal
byte for byte outside the operands of ``BININT``, ``BININT1``, ``BININT2`` and ``BINFLOAT``
(:func:`ckptaudit.pickle_walk.number_operands.free_bytes`: the two decode to the same opcodes at the same offsets).

Sound whatever the match says, by the way the places are used: a plan only names the byte ranges over which the
pass computes value statistics.  The state stage takes a statistic for a tensor only where that tensor's own
``(offset, nbytes, dtype)`` — from the scan stage's walk of that very file — finds one
(:meth:`ckptaudit.onepass.facts.ByteFacts.values_of`), and reads the bytes of any tensor that finds none
(:func:`ckptaudit.stages.state.value_stats`).  A matching file whose differing numbers shape its tensors (a
crafted file, or a model whose sizes change in place) costs those tensors a second read of their bytes, never a
statistic of other bytes.  Memory: at most :data:`PickleTemplates.HELD` templates of at most
:data:`PickleTemplates.MAX_PICKLE_BYTES` each (two bytes per pickle byte, plus one place per floating tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple

from ..pickle_walk.number_operands import changed_numbers, free_bytes
from ..pickle_walk.templates import TemplateShelf

#: The floating tensors' places in a data.pkl: (storage keys, byte offsets in the storages, bytes, dtype codes)
#: — the keys a list of ``str``, the rest ``array('q')`` — and whether the walk that found them ended cleanly.
FloatViews = Tuple[list, object, object, object]


@dataclass
class _Template:
    raw: object  # numpy uint8 array: the data.pkl's bytes
    owner: object  # free_bytes(): at a literal number's operand bytes its opcode's offset, else -1
    views: FloatViews


class PickleTemplates(TemplateShelf):
    """The data.pkl shapes one hash job has walked, each as its floating tensors' places; ``zip_layouts``: the
    zip layouts it has parsed (:class:`.zip_layouts.ZipLayouts`), shared the same way."""

    HELD = 8

    def __init__(self) -> None:
        from .zip_layouts import ZipLayouts

        super().__init__()
        self.zip_layouts = ZipLayouts()

    def views_of(self, pkl: bytes, walk: Callable[[bytes], Tuple[FloatViews, bool]]) -> FloatViews:
        """The floating tensors' places of data.pkl ``pkl``: a matching template's, else ``walk(pkl)``'s (a
        ``(views, clean)`` pair; a clean walk's shape is kept for the files after it)."""
        import numpy as np

        if len(pkl) > self.MAX_PICKLE_BYTES:
            return walk(pkl)[0]
        u = np.frombuffer(pkl, np.uint8)
        for t in self.held():
            if changed_numbers(t.raw, t.owner, u) is not None:
                self.hit()
                return t.views
        views, clean = walk(pkl)
        owner = free_bytes(pkl) if clean else None
        self.walked(None if owner is None else _Template(u.copy(), owner, views))
        return views
