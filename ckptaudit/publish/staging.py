"""Staging: a CPU copy of a training state, taken before a background publish so training may change the original.

:func:`stage` copies every tensor storage reachable from the state into CPU memory (pinned
when the source is on an accelerator, so the device-to-host copy runs at full speed) and
deep-copies everything else, so the copy shares nothing with the state training mutates
(an optimizer's ``state_dict()`` hands out its live moment tensors and per-parameter dicts).
Views keep their sharing (one staged storage per source storage, as ``torch.save`` writes
one record per storage), ``nn.Parameter`` stays a Parameter, ``requires_grad`` is kept.

The file a background publish writes is the one a blocking publish would write: a staged
copy of an accelerator storage is tagged with the source's location (``cuda:0`` …) through
``torch.serialization.register_package``, so ``torch.load`` puts it back there.

The copy runs on torch's intra-op thread pool.  A process forked after a staging must call
``torch.set_num_threads(1)`` before it stages (GNU OpenMP's pool does not survive ``fork``;
DataLoader workers do the same).

Memory: one copy of the state's tensor bytes, in :class:`StagingCache`, reused by the next
staging of a state of the same shapes (so a steady training loop pays a ``memcpy``, not page
faults of fresh memory) until :meth:`StagingCache.release`.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

#: staged CPU storage ``data_ptr`` → the source's location tag (``"cuda:0"``), read by the
#: tagger :func:`_staged_location` that :func:`_register_tagger` puts ahead of torch's own.
_LOCATIONS: Dict[int, str] = {}
_TAGGER_REGISTERED: List[bool] = []


def _staged_location(storage) -> Any:
    if storage.device.type != "cpu" or not _LOCATIONS:
        return None
    return _LOCATIONS.get(storage.data_ptr())


def _no_restore(storage, location):  # torch's own deserializers restore the location
    return None


def _register_tagger() -> None:
    if not _TAGGER_REGISTERED:
        import torch.serialization

        torch.serialization.register_package(5, _staged_location, _no_restore)  # before torch's cpu tagger (10)
        _TAGGER_REGISTERED.append(True)


class StagingCache:
    """CPU storages kept from one staging to the next (one copy of the state's tensor bytes).

    ``take(nbytes, pinned)`` hands back the storage that held the same position last time
    if its size and pinning match, else a new one.  Not thread-safe: one staging at a time
    (a background publish waits for the previous one before it stages)."""

    def __init__(self) -> None:
        self._storages: List[Any] = []
        self._next: List[Any] = []

    def begin(self) -> None:
        self._next = []

    def take(self, nbytes: int, pinned: bool):
        import torch

        i = len(self._next)
        s = self._storages[i] if i < len(self._storages) else None
        if s is None or s.nbytes() != nbytes or s.is_pinned() != pinned:
            s = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned).untyped_storage()
        self._next.append(s)
        return s

    def end(self) -> None:
        self._storages, self._next = self._next, []

    @property
    def nbytes(self) -> int:
        """Bytes of CPU memory the cache holds."""
        return sum(s.nbytes() for s in self._storages)

    def release(self) -> None:
        """Drop the staged storages (the next staging allocates afresh)."""
        for s in self._storages:
            _LOCATIONS.pop(s.data_ptr(), None)
        self._storages = []


def stage(obj: Any, cache: StagingCache) -> Tuple[Any, int]:
    """A copy of ``obj`` whose tensors live in CPU memory from ``cache``; returns it and the
    bytes of tensor storage copied.  Dicts, lists, tuples and sets are walked for tensors;
    anything else is ``copy.deepcopy``-ed (a tensor hidden in an object is then deep-copied
    on its own device).  Sparse, quantized and subclassed tensors are deep-copied as well.

    The caller must not change the state during the call (it copies the bytes as they are
    now); afterwards the state is free.  Raises what ``copy.deepcopy`` raises for an object
    that cannot be copied (``TypeError``), and ``RuntimeError`` when CPU memory for the copy
    cannot be allocated."""
    import torch

    _register_tagger()
    cache.begin()
    memo: Dict[int, Any] = {}
    storages: Dict[Tuple[str, int, int], Any] = {}
    copied = 0
    for t in _tensors(obj, torch.Tensor):
        if id(t) in memo or not _plain(t, torch):
            continue
        src = t.untyped_storage()
        key = (str(src.device), src.data_ptr(), src.nbytes())
        dst = storages.get(key)
        if dst is None:
            dst = cache.take(src.nbytes(), pinned=src.device.type not in ("cpu", "meta") and torch.cuda.is_available())
            dst.copy_(src)
            copied += src.nbytes()
            storages[key] = dst
            if src.device.type != "cpu":
                _LOCATIONS[dst.data_ptr()] = torch.serialization.location_tag(src)
            else:
                _LOCATIONS.pop(dst.data_ptr(), None)
        out = torch.empty((), dtype=t.dtype).set_(dst, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
        elif t.requires_grad:
            out.requires_grad_(True)
        memo[id(t)] = out
    cache.end()
    memo[id(memo)] = list(memo.values())  # deepcopy's keep-alive list, as copy.deepcopy makes it
    return copy.deepcopy(obj, memo), copied


def _plain(t, torch) -> bool:
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided and not t.is_quantized
            and t.device.type != "meta")


def _tensors(obj: Any, tensor_type) -> List[Any]:
    """Every tensor inside dicts, lists, tuples and sets of ``obj`` (depth first; no cycles)."""
    out, stack, seen = [], [obj], set()
    while stack:
        x = stack.pop()
        if isinstance(x, tensor_type):
            out.append(x)
        elif isinstance(x, (dict, list, tuple, set, frozenset)) and id(x) not in seen:
            seen.add(id(x))
            items = list(x.values()) + list(x.keys()) if isinstance(x, dict) else list(x)
            stack.extend(reversed(items))
    return out
