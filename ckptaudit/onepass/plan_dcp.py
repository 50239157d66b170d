"""The plan of a torch.distributed.checkpoint (DCP) data file: the zip records of every ``torch.save`` blob in it.

With DCP's default ``SerializationFormat.TORCH_SAVE`` a ``__<rank>_<n>.distcp`` file is the ``torch.save`` zips
of its items back to back (torch ``distributed/checkpoint/filesystem.py``, ``_write_item``), each at the byte
range the folder's ``.metadata`` gives it (``_StorageInfo(relative_path, offset, length)``).  A file of many
zips is not one zip (its last blob's end record counts from that blob's start), so the single-zip plan
(:func:`ckptaudit.onepass.plan._plan_zip`) finds nothing there; :func:`ckptaudit.onepass.plan.plan_file` plans
it with :func:`distcp_ranges`.  That takes each blob's range from ``.metadata`` (walked statically, never
unpickled, once per unit: :func:`unit_places`, handed to the plan of each of its files), reads each blob's end
record, central directory and local headers (:func:`ckptaudit.formats.zip.blob.blob_records`: small reads, no tensor byte) and gives the
pass every stored record with a recorded CRC-32 (member ``"<blob offset>:<name>"``, unique in the file) and the
blobs' ``data/`` records as tensor data.  The DCP scan (:mod:`ckptaudit.layouts.dcp_crc`) compares the CRCs
the pass computed.
"""

from __future__ import annotations

import re
from array import array
from typing import Dict, Iterable, Optional, Tuple

from .. import fs

#: A DCP data file's name (``FileSystemWriter``: ``__{rank}_{n}.distcp``).
DISTCP = re.compile(r"^__(\d+)_(\d+)\.distcp$")
#: Largest ``.metadata`` walked (bytes; :data:`ckptaudit.layouts.dcp.MAX_METADATA_BYTES`).
MAX_METADATA_BYTES = 1 << 30


def is_distcp(path) -> bool:
    """Whether ``path``'s name is a DCP data file's."""
    return bool(DISTCP.match(fs.fspath(path).replace("\\", "/").rpartition("/")[2]))


def folder_places(folder) -> Dict[str, "object"]:
    """{``relative_path``: ``(n, 2)`` int64 array of ``[offset, length]`` of each item's blob in that data
    file, unique, ascending} of the DCP folder ``folder`` (a local path or a remote URL), from its
    ``.metadata`` (empty when it is missing, cannot be interpreted, or imports what it should not); read and
    walked at each call (:func:`unit_places` does it once for a unit's files); memory: 16 bytes per item.  The
    pickle is walked statically (:func:`ckptaudit.pickle_walk.walk`), never unpickled; only ``storage_data``'s offsets
    and lengths are taken, to read ranges of the data file they name: whether its imports are allowed is the
    scan's judgement (:func:`ckptaudit.layouts.dcp._judged_metadata`); a folder refused for security is planned
    the same, so that its records' CRC-32s are still compared (a refusal never hides the file layer)."""
    import numpy as np

    from ..pickle_walk import walk
    from ..pickle_walk.model import instance_fields

    meta_path = fs.path(fs.fspath(folder)) / ".metadata"
    try:
        if fs.version(meta_path)[0] > MAX_METADATA_BYTES:
            return {}
        res = walk(fs.read_bounded(meta_path, MAX_METADATA_BYTES))
    except (OSError, ValueError):
        return {}
    meta = instance_fields(res.obj) if res.error is None and not res.budget_exhausted else None
    storage = meta.get("storage_data") if isinstance(meta, dict) else None
    if not isinstance(storage, dict):
        return {}
    cols: Dict[str, array] = {}
    for info in storage.values():
        s = instance_fields(info)
        if not isinstance(s, dict):
            continue
        relp, off, n = s.get("relative_path"), s.get("offset"), s.get("length")
        if isinstance(relp, str) and "/" not in relp and type(off) is int and type(n) is int and off >= 0 and n > 0:
            cols.setdefault(relp, array("q")).extend((off, n))
    del res, meta, storage
    return {relp: np.unique(np.frombuffer(a, np.int64).reshape(-1, 2), axis=0) for relp, a in cols.items()}


def unit_places(paths: Iterable) -> Dict[str, Dict[str, "object"]]:
    """{``fs.fspath`` of each local DCP data file among ``paths``: :func:`folder_places` of its folder}, each
    folder's ``.metadata`` walked once (a unit's files share it; a remote one is not planned, so not read)."""
    out: Dict[str, Dict[str, "object"]] = {}
    by_folder: Dict[str, Dict[str, "object"]] = {}
    for p in paths:
        if is_distcp(p) and not fs.is_remote(p):
            folder = fs.fspath(p).replace("\\", "/").rpartition("/")[0] or "."
            if folder not in by_folder:
                by_folder[folder] = folder_places(folder)
            out[fs.fspath(p)] = by_folder[folder]
    return out


def distcp_ranges(fh, path, places_here: Optional[Dict[str, "object"]] = None
                  ) -> Optional[Tuple["object", "object", "object"]]:
    """``(crc_member, crc_range, tensor_data_range)`` (the :class:`~.plan.Plan` columns) of DCP data file ``path``
    read through ``fh`` (an :class:`ckptaudit.formats.zip.reader.ArchiveFile` over it): every stored record with
    a recorded CRC-32 of every blob ``.metadata`` places in it, ascending, and the blobs' ``<prefix>/data/<key>``
    records; None when ``.metadata`` places nothing there.  ``places_here``: :func:`folder_places` of its folder
    when the caller walked it already (:func:`unit_places`), else walked here.  Blobs that are no consistent zip
    (another serialization format, a damaged blob) add nothing: the scan then checks them as before."""
    import numpy as np
    import pyarrow as pa

    from ..formats.zip.blob import blob_records

    folder, _, name = fs.fspath(path).replace("\\", "/").rpartition("/")
    places = (folder_places(folder or ".") if places_here is None else places_here).get(name)
    if places is None or not len(places):
        return None
    names, ends = bytearray(), array("q")  # the member names as one UTF-8 buffer and their end offsets
    crc_off, crc_len, td_off, td_len = array("q"), array("q"), array("q"), array("q")
    for off, n in places.tolist():
        rec = blob_records(fh, off, n)
        for i in range(len(rec) if rec is not None else 0):
            at, k = rec.data_offset[i], rec.length[i]
            parts = rec.names[i].split("/")
            if len(parts) == 3 and parts[1] == "data":
                td_off.append(at)
                td_len.append(k)
            if rec.crc[i] == 0 and k > 0:
                continue  # no CRC recorded (compute_crc32=False)
            names += f"{off}:{rec.names[i]}".encode()
            ends.append(len(names))
            crc_off.append(at)
            crc_len.append(k)
    offsets = np.r_[0, np.frombuffer(ends, np.int64)].astype(np.int32) if len(ends) else np.zeros(1, np.int32)
    member = pa.StringArray.from_buffers(len(ends), pa.py_buffer(offsets), pa.py_buffer(bytes(names)))
    rows, td = _rows(crc_off, crc_len), _rows(td_off, td_len)
    order = np.lexsort((rows[:, 1], rows[:, 0]))
    return member.take(pa.array(order)), np.ascontiguousarray(rows[order]), \
        np.ascontiguousarray(td[np.lexsort((td[:, 1], td[:, 0]))])


def _rows(offs: array, lens: array):
    """An ``(n, 2)`` int64 array of ``[offset, length]``."""
    import numpy as np

    if not len(offs):
        return np.zeros((0, 2), np.int64)
    return np.stack([np.frombuffer(offs, np.int64), np.frombuffer(lens, np.int64)], axis=1)
