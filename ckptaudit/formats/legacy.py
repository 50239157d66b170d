"""Check a legacy (pre-1.6, non-zip) torch.save file from its bytes.

Layout (torch/serialization.py ``_legacy_save`` / ``_legacy_load``), all
back to back from offset 0:

1. ``pickle(MAGIC_NUMBER)`` (``0x1950A86A20F9469CFC6C``),
2. ``pickle(PROTOCOL_VERSION)`` (1001),
3. ``pickle(sys_info)`` (``protocol_version``, ``little_endian``, ``type_sizes``),
4. ``pickle(obj)`` with persistent ids
   ``('storage', storage_type, key, location, numel, view_metadata)``,
5. ``pickle(sorted storage keys)``,
6. for each key in that order: 8-byte little-endian element count, then
   ``count * element_size`` raw bytes (c10 ``THPStorage_writeFileRaw``).

Pickle ends are found with :func:`pickletools.genops` (opcode decoding only)
and the object pickle is interpreted by :func:`ckptaudit.pickle_walk.walk`;
nothing is ever unpickled.  Memory: the object and key pickles are read
(capped at :data:`MAX_PICKLE_BYTES`); storage bytes are never read, only
their 8-byte count prefixes.
"""

from __future__ import annotations

import pickletools
import struct
from typing import Any, List, Optional, Tuple

from .. import findings, fs
from ..findings import Finding
from ..pickle_walk import WalkResult, walk
from . import pickles
from .sniff import TORCH_LEGACY_PROTOCOL_VERSION, generic_findings, legacy_magic_mismatch, sniff

#: Largest object/key pickle read into memory, bytes.
MAX_PICKLE_BYTES = 256 << 20
_PICKLE_NAMES = ("magic-number pickle", "protocol-version pickle", "sys-info pickle", "object pickle",
                 "storage-key pickle")


def _pickle_end(f, start: int) -> Tuple[Optional[int], int, str]:
    """Where the pickle starting at ``start`` ends: ``(end, n_ops, error)``.

    ``end`` is the offset after STOP, or None when the bytes run out (or are
    not a pickle) before it; ``error`` then says why.  Decodes opcodes only.
    """
    f.seek(start)
    n = 0
    try:
        for op, _arg, pos in pickletools.genops(f):
            n += 1
            if op.name == "STOP":
                return pos + 1, n, ""
    except Exception as e:  # genops raises ValueError/others on cut or garbage bytes
        return None, n, str(e) or type(e).__name__
    return None, n, "no STOP opcode"


def _cut_in_pickles(i: int, pname: str, pos: int, size: int, n_ops: int, err: str,
                    res: Optional[WalkResult]) -> str:
    """Where a legacy file cut inside (or right before) its pickle ``i`` (``pname``, from byte ``pos``) ends,
    and what the object pickle's part that is there says of the storages that are missing."""
    if pos >= size:
        why = f"the file ends right after pickle {i} of 5, before the {pname}"
    else:
        why = (f"the cut falls inside the {pname} (pickle {i + 1} of 5, starting at byte {pos}) "
               f"after {n_ops} opcodes ({err})")
    known = _known_storage_bytes(res)
    if known:
        why += (f"; no storage bytes are present (the part of the object pickle that is there "
                f"names {known[0]} storages, at least {known[1]} bytes)")
    return why


def check_legacy(path, *, display: Optional[str] = None, kept=None) -> Tuple[Optional[WalkResult], List[Finding]]:
    """Audit a legacy torch.save file at ``path``.

    Returns ``(walk_result, findings)``; ``walk_result`` is the static walk of
    the object pickle (partial, with ``error`` set, when the file is cut inside
    it) or None when the file does not get that far.  Kinds:
    ``legacy_magic_mismatch``, ``truncated_legacy_pickle`` (which pickle or
    which storage the cut is in, bytes missing when known, storages intact),
    ``pickle_unreadable`` (a pickle that is complete but wrong), plus the
    sniff-level kinds when the file is not legacy torch at all.  The findings name
    ``display`` (default: ``path``).  ``kept``: bytes of a remote object already read
    (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory.  Never raises on bad content.
    """
    path = fs.fspath(path)
    shown = path if display is None else display
    s = sniff(path, kept=kept)
    size = s.size_bytes
    if s.kind != "torch_legacy":
        return None, generic_findings(s, shown) or [legacy_magic_mismatch(shown, f"absent (the file is {s.kind!r})")]

    def cut(why: str, **extra: Any) -> Finding:
        return _truncated(shown, size, why, **extra)

    with fs.open_binary(path, kept=kept) as f:
        ends: List[int] = []
        pos = 0
        res: Optional[WalkResult] = None
        for i, pname in enumerate(_PICKLE_NAMES):
            end, n_ops, err = _pickle_end(f, pos)
            if i == 3:
                data = _read(f, pos, (end if end is not None else size) - pos)
                res = walk(data) if data is not None else None
            if end is None:
                return res, [cut(_cut_in_pickles(i, pname, pos, size, n_ops, err, res), pickle=pname, offset=pos,
                                 bytes_missing=None)]
            ends.append(end)
            if i == 1:
                pv = _first_value(f, pos)
                if pv != TORCH_LEGACY_PROTOCOL_VERSION:
                    return None, [pickles.unreadable(
                        shown, pname, f"it holds {pv!r}; torch expects {TORCH_LEGACY_PROTOCOL_VERSION}")]
            pos = end
        keys_data = _read(f, ends[3], ends[4] - ends[3])
    keys_res = walk(keys_data, persistent="raw") if keys_data is not None else None
    keys = keys_res.obj if keys_res is not None and not keys_res.error else None
    if not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        return res, [pickles.unreadable(shown, "storage-key pickle",
                                        f"it is not a list of storage keys ({type(keys).__name__})")]
    if res is None or res.error:
        return res, [pickles.unreadable(shown, "object pickle",
                                        res.error if res is not None else "larger than the read limit")]
    with fs.open_binary(path, kept=kept) as f:
        return res, _check_storages(f, shown, size, res, keys, ends[4])


def _truncated(display: str, size: int, why: str, **extra: Any) -> Finding:
    """``truncated_legacy_pickle``: the file ends at ``size`` bytes, inside what ``why`` names.  Decided by
    :func:`check_legacy` (a cut inside one of the five pickles) and :func:`_check_storages` (inside a storage)."""
    return findings.make("truncated_legacy_pickle", path=display, size_bytes=size, why=why, **extra)


def _check_storages(f, display: str, size: int, res: WalkResult, keys: List[str], pos: int) -> List[Finding]:
    """Walk the storage records (8-byte element count + raw bytes) that follow the key pickle."""

    def cut(why: str, **extra: Any) -> Finding:
        return _truncated(display, size, why, **extra)

    n = len(keys)
    for idx, key in enumerate(keys):
        ref = res.storages.get(key)
        if ref is None or ref.numel is None or not ref.itemsize:
            return [pickles.unreadable(display, "object pickle",
                                       f"storage key {key!r} of the key list has no usable persistent id")]
        if pos + 8 > size:
            why = (f"the cut falls inside the 8-byte size prefix of storage {key!r} ({idx + 1} of {n}); "
                   f"{idx} of {n} storages are intact")
            return [cut(why, storage=key, storages_intact=idx, n_storages=n,
                        bytes_missing=_missing(res, keys, idx, pos, size))]
        f.seek(pos)
        numel = struct.unpack("<q", f.read(8))[0]
        if numel != ref.numel:
            return [findings.make("legacy_storage_size_mismatch", path=display, storage=key, found=numel,
                                  expected=ref.numel, dtype=ref.dtype, offset=pos)]
        nbytes = numel * ref.itemsize
        if pos + 8 + nbytes > size:
            have = size - pos - 8
            missing = _missing(res, keys, idx, pos, size)
            why = (f"the cut falls inside storage {key!r} ({idx + 1} of {n}, {ref.dtype} x {numel}: "
                   f"{have} of its {nbytes} bytes present); {idx} of {n} storages are intact and "
                   f"{missing} bytes are missing")
            return [cut(why, storage=key, storages_intact=idx, n_storages=n, bytes_missing=missing)]
        pos += 8 + nbytes
    return []


def _missing(res: WalkResult, keys: List[str], idx: int, pos: int, size: int) -> int:
    """Bytes between EOF and where the last storage would end (from ``keys[idx]`` at ``pos``)."""
    total = pos
    for k in keys[idx:]:
        ref = res.storages.get(k)
        total += 8 + (ref.nbytes or 0 if ref is not None else 0)
    return max(0, total - size)


def _known_storage_bytes(res: Optional[WalkResult]) -> Optional[Tuple[int, int]]:
    if res is None or not res.storages:
        return None
    return len(res.storages), sum((r.nbytes or 0) for r in res.storages.values())


def _read(f, off: int, n: int) -> Optional[bytes]:
    if n > MAX_PICKLE_BYTES:
        return None
    f.seek(off)
    return f.read(max(0, n))


def _first_value(f, start: int) -> Any:
    data = _read(f, start, 64)
    r = walk(data or b"", persistent="raw")
    return r.obj if not r.error else None

