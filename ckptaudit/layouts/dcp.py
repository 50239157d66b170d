"""torch.distributed.checkpoint (DCP) folders.

Format facts (torch/distributed/checkpoint/filesystem.py, metadata.py): a
folder with one ``.metadata`` file — a plain pickle of ``Metadata`` whose
``storage_data`` maps each ``MetadataIndex`` to ``_StorageInfo(relative_path,
offset, length)`` — and data files ``__<rank>_<n>.distcp``.  The writer
renames ``.metadata.tmp`` to ``.metadata`` last, so a missing ``.metadata``
means the save never committed.  ``FileSystemReader.read_metadata`` uses plain
``pickle.load``: ``weights_only`` does not protect it (upstream CVE fix added a
restricted unpickler), so ckptaudit only ever walks it statically.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict
from pathlib import Path

from .. import findings as F
from .. import fs
from .base import UnitScan, prune

DISTCP = re.compile(r"^__(\d+)_(\d+)\.distcp$")

# Classes a DCP .metadata pickle legitimately names (torch 2.x
# torch/distributed/checkpoint/metadata.py and filesystem.py; layout and
# memory-format helpers from torch/serialization.py).  Allowed for .metadata
# only; still never unpickled.
DCP_METADATA_GLOBALS = [
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.distributed.checkpoint.planner.LoadItemType",
    "torch.distributed.checkpoint.planner.WriteItemType",
    "torch.serialization._get_layout",
    "torch.Size",
    "torch.strided",
    "torch.distributed.checkpoint.metadata.StorageMeta",
]


class DCP:
    name = "dcp"

    def claim_dir(self, path: Path) -> bool:
        try:
            names = fs.listdir(path)
        except OSError:
            return False
        return ".metadata" in names or ".metadata.tmp" in names or any(DISTCP.match(n) for n in names)

    def scan(self, run_dir: Path, unit: dict, cfg: dict) -> UnitScan:
        from .. import security
        from ..pickle_walk import walk

        scan = UnitScan(unit["unit"], self.name)
        folder = run_dir / unit["unit"]
        names = sorted(fs.listdir(folder))
        data_files = [n for n in names if DISTCP.match(n)]
        scan.facts["data_files"] = data_files
        scan.facts["ranks"] = sorted({int(DISTCP.match(n).group(1)) for n in data_files})
        rel = lambda n: f"{unit['unit']}/{n}" if unit["unit"] != "." else n  # noqa: E731
        if ".metadata" not in names:
            tmp = " (a .metadata.tmp is left over: the final rename never happened)" if ".metadata.tmp" in names else ""
            scan.add(F.make("dcp_metadata_missing", path=unit["unit"], n_files=len(data_files), tmp_text=tmp))
            return scan
        mpath = folder / ".metadata"
        scan.files_checked.append(rel(".metadata"))
        data = mpath.read_bytes()
        t0 = time.perf_counter()
        res = walk(data)
        scan.walk_seconds += time.perf_counter() - t0
        scan.pickle_bytes += len(data)
        allowed = list(cfg.get("security", {}).get("allow_globals", [])) + DCP_METADATA_GLOBALS
        every = security.streams(data, res)  # read_metadata unpickles one stream; a loop would run them all
        verdicts, sec = security.scan(every, path=rel(".metadata"), member=".metadata", extra_allowed=allowed)
        scan.add(sec)
        scan.imports.extend({"file": rel(".metadata"), "member": ".metadata", **asdict(v)} for v in verdicts)
        if any(f.severity == "error" for f in sec):
            return scan  # never interpret a pickle that imports something it should not
        if res.error:
            scan.add(F.make("dcp_metadata_unreadable", path=rel(".metadata"), why=res.error))
            return scan
        meta = _state(res.obj)
        sdm = _state(meta.get("state_dict_metadata")) if isinstance(meta, dict) else {}
        storage = meta.get("storage_data") if isinstance(meta, dict) else None
        if not isinstance(sdm, dict) or not isinstance(storage, dict):
            scan.add(F.make("dcp_metadata_unreadable", path=rel(".metadata"),
                            why="no state_dict_metadata/storage_data in the Metadata object"))
            return scan
        # tensors (shape/dtype) from state_dict_metadata
        tree = {}
        for fqn, md in sdm.items():
            st = _state(md)
            if isinstance(st, dict) and "size" in st:
                dname = _dtype_name(st.get("properties"))
                shape = list(st["size"]) if isinstance(st["size"], (list, tuple)) else []
                tree[str(fqn)] = {"__tensor__": dname, "shape": shape}
            else:
                tree[str(fqn)] = {"__bytes_item__": True}
        _read_small_bytes_items(folder, storage, tree)
        scan.tree["root"] = _nest(tree)
        # every storage item's file is present and long enough
        need = {}
        for idx, info in storage.items():
            sinfo = _state(info)
            if not isinstance(sinfo, dict):
                continue
            relp = str(sinfo.get("relative_path"))
            end = int(sinfo.get("offset", 0)) + int(sinfo.get("length", 0))
            fqn = _fqn(idx)
            cur = need.get(relp)
            if cur is None or end > cur[0]:
                need[relp] = (end, fqn, (cur[2] + 1) if cur else 1)
            else:
                need[relp] = (cur[0], cur[1], cur[2] + 1)
        for relp, (end, fqn, n_items) in sorted(need.items()):
            p = folder / relp
            m = DISTCP.match(relp)
            rank = m.group(1) if m else "?"
            if not p.exists():
                scan.add(F.make("dcp_shard_missing", path=unit["unit"], file=relp, n_items=n_items, rank=rank))
                continue
            size = p.stat().st_size
            scan.files_checked.append(rel(relp))
            if size < end:
                scan.add(F.make("dcp_shard_too_short", path=unit["unit"], file=relp, actual=size, expected=end,
                                item=fqn))
        if ".metadata.tmp" in names:
            scan.add(F.make("unit_in_progress", path=rel(".metadata.tmp"),
                            why="a .metadata.tmp is left over from a save that did not finish"))
        scan.facts["n_items"] = len(storage)
        return scan


def _read_small_bytes_items(folder: Path, storage: dict, tree: dict, limit: int = 1 << 16) -> None:
    """Values of small non-tensor items (``step``, ``epoch``…).

    DCP writes each non-tensor value as a ``torch.save`` blob at
    (offset, length) in a data file (filesystem.py ``_write_item``); the blob's
    ``data.pkl`` is walked statically like any other pickle.  Only blobs under
    ``limit`` bytes whose pickle imports nothing are interpreted.
    """
    import io
    import zipfile

    from ..pickle_walk import walk

    for idx, info in storage.items():
        sinfo = _state(info)
        if not isinstance(sinfo, dict):
            continue
        fqn = _fqn(idx)
        if fqn not in tree or "__bytes_item__" not in tree[fqn]:
            continue
        length = int(sinfo.get("length", 0))
        if not 0 < length <= limit:
            continue
        try:
            with fs.open_binary(folder / str(sinfo.get("relative_path")), exact=True) as fh:
                fh.seek(int(sinfo.get("offset", 0)))
                blob = fh.read(length)
            with zipfile.ZipFile(io.BytesIO(blob)) as zf:
                pkl = next(n for n in zf.namelist() if n.endswith("data.pkl"))
                data = zf.read(pkl)
        except (OSError, zipfile.BadZipFile, StopIteration, ValueError):
            continue
        res = walk(data)
        if res.error is None and not res.globals and isinstance(res.obj, (int, float, str, bool)):
            tree[fqn] = res.obj


def _dtype_name(props) -> str:
    """The dtype of a walked ``TensorProperties``: a dataclass field ``dtype``, or the first item of
    the tuple its ``__getstate__`` returns (torch/distributed/checkpoint/metadata.py:
    ``(dtype, layout, requires_grad, memory_format, pin_memory)``)."""
    from ..pickle_walk import GlobalRef, Instance

    dtype = None
    if isinstance(props, Instance) and isinstance(props.state, tuple) and props.state \
            and isinstance(props.state[0], GlobalRef):
        dtype = props.state[0]
    else:
        st = _state(props)
        dtype = st.get("dtype") if isinstance(st, dict) else None
    return getattr(dtype, "name", None) or str(dtype)


def _fqn(idx) -> str:
    """The fully qualified name of a walked ``MetadataIndex`` (state or positional args)."""
    item = _state(idx)
    if isinstance(item, dict):
        if "fqn" in item:
            return str(item["fqn"])
        args = item.get("args")
        if isinstance(args, list) and args:
            return str(args[0])
    return str(idx)


def _state(obj):
    """The attribute dict of a walked dataclass instance (or the object itself)."""
    from ..pickle_walk import Instance

    if isinstance(obj, Instance):
        st = obj.state
        if isinstance(st, tuple) and len(st) == 2 and isinstance(st[1], dict):  # (dict, slots)
            st = {**(st[0] or {}), **st[1]}
        if isinstance(st, dict):
            return st
        if obj.args:
            return {"args": list(obj.args)}
        return {}
    return obj


def _nest(flat: dict) -> dict:
    """{"model.wte.weight": x} -> {"model": {"wte.weight": x}} on the first dot only."""
    out: dict = {}
    for k, v in flat.items():
        head, _, rest = k.partition(".")
        if rest and head in ("model", "optim", "optimizer", "scheduler", "lr_scheduler"):
            out.setdefault(head, {})[rest] = v
        else:
            out[k] = v
    return out


ADAPTER = DCP()
del prune
