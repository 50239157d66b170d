"""The pickle memo of one walk: a list while its slots are filled 0, 1, 2, … in order, else a dict.

CPython's pickler numbers memo slots from 0 in the order it stores them (``BINPUT``/``LONG_BINPUT`` with
``len(memo)`` as the slot, protocol 4's ``MEMOIZE`` implicitly; Lib/pickle.py ``Pickler.memoize``), and
``torch.save`` pickles with it, memoising nearly every object: a ``torch.save`` of 100,000 tensors leaves
~700,000 slots.  As a dict those cost an entry plus an ``int`` key object each (~60 MB at 100,000 tensors,
issue 22); as a list, 8 bytes a slot.  A slot written out of order (a hand-made pickle, ``PUT`` with any
key) turns this memo into a dict with the same contents, so the walk sees the same mapping either way.

It reads back only a handful of those slots, though, and what the others hold (each rebuild's argument tuple,
persistent id, shape and stride) would stay alive for the whole walk: ~200 MiB at 300,000 tensors (issue 45).
A memo told the slots its stream reads (``reads``, :func:`ckptaudit.pickle_walk.opcodes.memo_reads`) keeps
:data:`UNREAD` in every other slot, so what only such a slot held is freed as the walk goes on.
"""

from __future__ import annotations

from typing import AbstractSet, Any, Dict, Iterator, List, Optional, Tuple

#: What :meth:`Memo.put` returns for a slot that held nothing.
EMPTY = object()


class _Unread:
    """What a slot that no opcode of the stream reads holds instead of its object (``<unread>`` in a trick's text)."""

    __slots__ = ()


_Unread.__name__ = "unread"
#: The one value of every slot its stream never reads, when the memo was told which it reads.
UNREAD = _Unread()


class Memo:
    """A mapping of memo slot → object with ``in``, ``[]``, ``get``, ``put``, ``len`` and ``items`` (the walk's
    uses)."""

    __slots__ = ("_list", "_dict", "_reads")

    def __init__(self, reads: Optional[AbstractSet[Any]] = None) -> None:
        """``reads``: the slots the stream ever reads (every other slot then holds :data:`UNREAD`), or None to
        keep every object."""
        self._list: Optional[List[Any]] = []
        self._dict: Optional[Dict[Any, Any]] = None
        self._reads = reads

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._reads is not None and key not in self._reads:
            value = UNREAD
        lst = self._list
        if lst is not None:
            if type(key) is int and 0 <= key <= len(lst):
                if key == len(lst):
                    lst.append(value)
                else:
                    lst[key] = value
                return
            self._dict, self._list = dict(enumerate(lst)), None
        self._dict[key] = value  # type: ignore[index]

    def __getitem__(self, key: Any) -> Any:
        lst = self._list
        if lst is not None:
            if type(key) is int and 0 <= key < len(lst):
                return lst[key]
            raise KeyError(key)
        return self._dict[key]  # type: ignore[index]

    def put(self, key: Any, value: Any) -> Any:
        """``self[key] = value``; returns what the slot held before, or :data:`EMPTY` (one call per
        ``BINPUT``/``MEMOIZE``: the walk checks for a rebound slot on every one).  A slot no opcode reads returns
        :data:`UNREAD` for what it held."""
        if self._reads is not None and key not in self._reads:
            value = UNREAD
        lst = self._list
        if lst is not None and type(key) is int:
            n = len(lst)
            if key == n:
                lst.append(value)
                return EMPTY
            if 0 <= key < n:
                old = lst[key]
                lst[key] = value
                return old
        old = self.get(key, EMPTY)
        self[key] = value
        return old

    def get(self, key: Any, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: Any) -> bool:
        return self.get(key, EMPTY) is not EMPTY

    def __len__(self) -> int:
        return len(self._list) if self._list is not None else len(self._dict)  # type: ignore[arg-type]

    def items(self) -> Iterator[Tuple[Any, Any]]:
        return iter(enumerate(self._list)) if self._list is not None else iter(self._dict.items())  # type: ignore[union-attr]
