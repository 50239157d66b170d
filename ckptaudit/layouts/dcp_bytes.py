"""DCP's non-tensor items: a ``torch.save`` blob each, inside a data file, unpickled on resume without an allowlist.

``torch.distributed.checkpoint`` writes every value of a state_dict that is not a tensor (a step counter, a dict
of scalars, any object) with ``torch.save`` into a byte range of a ``.distcp`` file (torch
distributed/checkpoint/filesystem.py ``_write_item``), listed in ``.metadata`` as a ``BytesStorageMetadata``
item with its ``relative_path``, ``offset`` and ``length``.  ``dcp.load`` reads it back through
``DefaultLoadPlanner.load_bytes`` (default_planner.py): ``torch.load(value, weights_only=False)``.  So whatever
a blob's pickle imports is imported and called on resume: each blob's ``data.pkl`` (or the blob itself, when it
is no zip: ``torch.load`` then unpickles it as a legacy file) is walked statically and judged as an
unrestricted load (:data:`DCP_LOAD_BYTES`); a small blob that holds a plain scalar gives the tree its value
(``step``, ``epoch``…).

Bounds: at most :data:`MAX_ITEMS` items and :data:`ckptaudit.layouts.scan_file.SWEEP_BYTES` of blob bytes per
unit are read; a larger item is named in a warning (``dcp_bytes_item_not_scanned``).  A data file that is no
regular file (a FIFO) is never opened (the structure check names it).
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import asdict
from pathlib import Path
from typing import Callable, List, Optional

from .. import findings as F
from .. import fs
from ..security.resume import ResumeLoad
from .result import UnitScan

__all__ = ["DCP_LOAD_BYTES", "MAX_ITEMS", "VALUE_BYTES", "scan_bytes_items", "read_item", "pickle_of"]

DCP_LOAD_BYTES = ResumeLoad("torch.distributed.checkpoint DefaultLoadPlanner.load_bytes: "
                            "torch.load(weights_only=False)", weights_only=False)
#: Non-tensor items of one unit read, at most.
MAX_ITEMS = 10_000
#: Blobs up to this size whose pickle imports nothing and holds a scalar give the tree its value.
VALUE_BYTES = 1 << 16


def scan_bytes_items(folder: Path, storage: dict, tree: dict, scan: UnitScan, allowed: List[str],
                     rel: Callable[[str], str], state: Callable, fqn_of: Callable, count: Callable,
                     inside: Callable[[str], bool], kept=None) -> None:
    """Walk and judge the pickle of every non-tensor item (``tree[fqn]`` marked ``__bytes_item__``) of a DCP
    unit in ``folder``; add findings and import rows to ``scan``; put plain scalar values into ``tree``.
    ``storage`` is the Metadata's ``storage_data`` ({MetadataIndex: _StorageInfo}); ``state``, ``fqn_of``,
    ``count`` and ``inside`` read its fields (:mod:`ckptaudit.layouts.dcp`); ``rel`` names a file of the unit
    as the findings do; ``kept``: bytes of remote objects already read (:class:`ckptaudit.fs.kept.KeptBytes`),
    answered from memory."""
    from .. import security
    from ..pickle_walk import walk
    from .scan_file import SWEEP_BYTES

    budget, n, skipped = SWEEP_BYTES, 0, []
    for idx, info in storage.items():
        sinfo = state(info)
        fqn = fqn_of(idx)
        if not isinstance(sinfo, dict) or not isinstance(tree.get(fqn), dict) or "__bytes_item__" not in tree[fqn]:
            continue  # a tensor, or an item already read (two storage entries naming one fqn)
        length, offset = count(sinfo.get("length", 0)), count(sinfo.get("offset", 0))
        relp = str(sinfo.get("relative_path"))
        if length is None or offset is None or not length or not inside(relp):
            continue  # the structure check names the bad entry
        n += 1
        if n > MAX_ITEMS or length > budget:
            skipped.append(fqn)
            continue
        blob = read_item(folder / relp, offset, length, kept)
        if blob is None:
            continue
        budget -= len(blob)
        data = pickle_of(blob)
        if not data:
            continue
        res = walk(data)
        scan.pickle_bytes += len(data)
        member = f"{relp}[{offset}:{offset + length}] ({fqn})"
        verdicts, sec = security.scan(security.streams(data, res), path=rel(relp), member=member,
                                      extra_allowed=allowed, resume=DCP_LOAD_BYTES)
        scan.add(sec)
        scan.imports.extend({"file": rel(relp), "member": member, **asdict(v)} for v in verdicts)
        if (length <= VALUE_BYTES and res.error is None and not res.globals and not sec
                and isinstance(res.obj, (int, float, str, bool))):
            tree[fqn] = res.obj
    if skipped:
        scan.add(F.make("dcp_bytes_item_not_scanned", path=rel(".metadata"), n=len(skipped),
                        examples=", ".join(repr(x) for x in skipped[:3]), max_items=MAX_ITEMS,
                        max_mib=SWEEP_BYTES >> 20))


def read_item(path: Path, offset: int, length: int, kept=None) -> Optional[bytes]:
    """``length`` bytes of the rank file ``path`` from ``offset`` (answered from ``kept`` first, the bytes of a
    remote object already read); None when it is gone (``dcp_shard_missing``) or no regular file (a FIFO would
    block the open: its size check names it; a link leaving the run was refused before)."""
    try:
        if not fs.is_remote(path) and not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with fs.open_binary(path, exact=True, kept=kept) as fh:
            fh.seek(offset)
            return fh.read(length)
    except OSError:
        return None


def pickle_of(blob: bytes) -> bytes:
    """The pickle ``torch.load`` would unpickle from ``blob``: its zip's ``data.pkl`` (stored, as ``torch.save``
    writes it; else read with :mod:`zipfile`), or the blob itself when it is no zip (a legacy file)."""
    if not blob.startswith(b"PK\x03\x04"):
        return blob
    data = _stored_member(blob, "data.pkl", len(blob))
    if data is not None:
        return data
    import io
    import zipfile

    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            name = next((i for i in z.namelist() if i.endswith("data.pkl")), None)
            return z.read(name) if name else b""
    except Exception:  # noqa: BLE001 - zipfile raises NotImplementedError, RuntimeError, EOFError, zlib.error…
        return b""


def _stored_member(blob: bytes, suffix: str, limit: int) -> Optional[bytes]:
    """The bytes of the first member of the small zip ``blob`` whose name ends with ``suffix``, read through
    its central directory (APPNOTE 4.3.12/4.3.16), or None.

    Only stored (method 0) members, which is how ``torch.save`` writes every record.  The "version needed
    to extract" field is not checked: torch's reader (miniz) ignores it, and Python's ``zipfile`` raising
    ``NotImplementedError`` for a forged 7.0 must not hide a value torch itself reads.
    """
    eocd = blob.rfind(b"PK\x05\x06")
    if eocd < 0 or eocd + 22 > len(blob):
        return None
    n, cd_size, cd_off = struct.unpack_from("<HII", blob, eocd + 10)
    pos = cd_off
    for _ in range(n):
        if blob[pos:pos + 4] != b"PK\x01\x02" or pos + 46 > len(blob):
            return None
        method, = struct.unpack_from("<H", blob, pos + 10)
        csize, usize, nlen, xlen, clen = struct.unpack_from("<IIHHH", blob, pos + 20)
        lho, = struct.unpack_from("<I", blob, pos + 42)
        name = blob[pos + 46: pos + 46 + nlen]
        pos += 46 + nlen + xlen + clen
        if not name.endswith(suffix.encode()):
            continue
        if method != 0 or csize != usize or usize > limit or blob[lho:lho + 4] != b"PK\x03\x04":
            return None
        lnlen, lxlen = struct.unpack_from("<HH", blob, lho + 26)
        start = lho + 30 + lnlen + lxlen
        data = blob[start:start + usize]
        return data if len(data) == usize else None
    return None
