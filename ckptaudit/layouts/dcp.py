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

import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, Optional, Tuple

from .. import confine
from .. import findings as F
from .. import fs
from . import dcp_bytes, dcp_crc, leftovers
from .adapter import folder_names
from .base import UnitScan, prune, walk_problem

DISTCP = re.compile(r"^__(\d+)_(\d+)\.distcp$")
# cap on .metadata: ~150 bytes per chunk entry, so 1 GiB is millions of shards; a 4 GiB sparse one is not read
MAX_METADATA_BYTES = 1 << 30

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
    # Megatron-Core's cached save plans (``all_local_plans``): torch's planner.py dataclasses, data (security_tiers)
    "torch.distributed.checkpoint.planner.SavePlan",
    "torch.distributed.checkpoint.planner.WriteItem",
    "torch.distributed.checkpoint.planner.TensorWriteData",
    "torch.distributed.checkpoint.planner.BytesIOWriteData",
    "torch.serialization._get_layout",
    "torch.Size",
    "torch.strided",
    "torch.distributed.checkpoint.metadata.StorageMeta",
]


def _judged_metadata(data: bytes, shown: str, cfg: dict, scan: UnitScan):
    """The static walk of ``.metadata`` (``shown``: its path in the run), its imports judged into ``scan``
    (every stream: ``read_metadata`` unpickles one, a loop would run them all): ``(walk, refused)``.  The walk is
    None, with the finding added, when it cannot be read (a walk over budget, a bad pickle); ``refused`` is True
    when the pickle imports something it should not: the unit is then unusable for security, and the walk's
    storage facts (names, offsets, lengths: read statically, nothing executed) still serve the file-layer checks."""
    from .. import security
    from ..pickle_walk import walk

    t0 = time.perf_counter()
    res = walk(data)
    scan.walk_seconds += time.perf_counter() - t0
    scan.pickle_bytes += len(data)
    allowed = list(cfg.get("security", {}).get("allow_globals", [])) + DCP_METADATA_GLOBALS
    verdicts, sec = security.scan(security.streams(data, res), path=shown, member=".metadata",
                                  extra_allowed=allowed)
    scan.add(sec)
    scan.imports.extend({"file": shown, "member": ".metadata", **asdict(v)} for v in verdicts)
    refused = any(f.severity == "error" for f in sec)
    if res.budget_exhausted:
        scan.add(walk_problem(res, shown, ".metadata"))
        return None, refused
    if res.error:
        if not refused:  # a refused pickle is reported as such; its shape says nothing more
            scan.add(F.make("dcp_metadata_unreadable", path=shown, why=res.error))
        return None, refused
    return res, refused


def read_metadata(folder: Path, shown: str, cfg: dict, kept=None) -> Tuple[Optional[dict], Optional[dict], str]:
    """``(state_dict_metadata, storage_data, problem)`` of the DCP folder ``folder``, from a static walk of its
    ``.metadata`` judged as the audit judges it (``shown``: its path in words); ``(None, None, why)`` when it
    is missing, unreadable, or imports what it should not (never interpreted then).  Nothing is unpickled.
    ``kept``: bytes of a remote object already read (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
    try:
        data = fs.read_bounded(folder / ".metadata", MAX_METADATA_BYTES, kept=kept)
    except OSError as e:
        return None, None, f".metadata cannot be read: {type(e).__name__}: {e}"
    scan = UnitScan(shown, "dcp")
    res, refused = _judged_metadata(data, shown, cfg, scan)
    if res is None or refused:  # never interpreted for a load: a refused .metadata is not read back
        return None, None, "; ".join(f.message for f in scan.findings[:3]) or ".metadata cannot be interpreted"
    meta = state_fields(res.obj)
    sdm = state_fields(meta.get("state_dict_metadata")) if isinstance(meta, dict) else None
    storage = meta.get("storage_data") if isinstance(meta, dict) else None
    if not isinstance(sdm, dict) or not isinstance(storage, dict):
        return None, None, "no state_dict_metadata/storage_data in the Metadata object"
    return sdm, storage, ""


class DCP:
    """A DCP folder as one unit, of layout ``name``; with ``folder_name`` (a regular expression, full match),
    only a folder so named: a producer that saves DCP folders under a naming of its own gets its own layout
    (its producer module says which), scanned the same way."""

    def __init__(self, name: str = "dcp", folder_name: Optional[str] = None):
        self.name = name
        self._folder = re.compile(folder_name) if folder_name else None

    def claim_dir(self, path: Path) -> bool:
        if self._folder is not None and not self._folder.fullmatch(path.name):
            return False
        return self.claims_names(folder_names(path) or [])

    def claims_names(self, names) -> bool:
        """A folder holding ``names`` is a DCP save (committed or not)."""
        return ".metadata" in names or ".metadata.tmp" in names or any(DISTCP.match(n) for n in names)

    def state_tree(self, flat: dict, paths: dict) -> dict:
        """The unit's tree from its items ``{fqn: description}`` and their nesting ``paths`` (:func:`_nest`)."""
        return _nest(flat, paths)

    def reads_records(self, rel: str) -> bool:
        """Whether the scan reads ``rel`` by zip record (so the hash stage's pass plans it): every file, a data
        file too (the CRC-32 of each record of each item's ``torch.save`` blob: :mod:`.dcp_crc`)."""
        return True

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        kept = None if byte_facts is None else byte_facts.kept  # every read answers from the pass's bytes first
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
        try:
            data = fs.read_bounded(mpath, MAX_METADATA_BYTES, kept=kept)
        except OSError as e:
            scan.add(F.make("dcp_metadata_unreadable", path=rel(".metadata"), why=f"{type(e).__name__}: {e}"))
            return scan
        # a refused .metadata (security) still gives the file layer its facts: every layer runs on every unit
        res, refused = _judged_metadata(data, rel(".metadata"), cfg, scan)
        if res is None:
            return scan
        meta = state_fields(res.obj)
        sdm = state_fields(meta.get("state_dict_metadata")) if isinstance(meta, dict) else {}
        storage = meta.get("storage_data") if isinstance(meta, dict) else None
        if not isinstance(sdm, dict) or not isinstance(storage, dict):
            if not refused:  # a pickle that is only a payload has no storage facts to check
                scan.add(F.make("dcp_metadata_unreadable", path=rel(".metadata"),
                                why="no state_dict_metadata/storage_data in the Metadata object"))
            return scan
        # every storage path must stay inside the run (``..``, absolute, through a linked folder): dcp.load
        # joins it to the checkpoint folder; one that leaves the run is named and never opened
        outside = _paths_outside(run_dir, unit["unit"], storage)
        for relp, where in sorted(outside.items())[:10]:
            scan.add(confine.path_outside_run(rel(".metadata"), relp, where,
                                              "dcp.load would read tensors from there"))
        if outside:
            return scan
        tree = _tensor_tree(sdm)
        paths = meta.get("planner_data") if isinstance(meta, dict) else None
        # every non-tensor item is a torch.save blob that dcp.load unpickles with weights_only=False
        dcp_bytes.scan_bytes_items(folder, storage, tree, scan, list(cfg.get("security", {}).get("allow_globals", [])),
                                   rel, state_fields, item_fqn, _count, _inside, kept=kept)
        scan.tree["root"] = self.state_tree(tree, paths if isinstance(paths, dict) else {})
        need, bad = _shard_ends(storage)
        if bad is not None:
            idx, sinfo = bad
            scan.add(F.make("dcp_metadata_unreadable", path=rel(".metadata"),
                            why=f"storage item {_short(item_fqn(idx))} has relative_path "
                                f"{_short(str(sinfo.get('relative_path')))}, offset "
                                f"{_short(sinfo.get('offset'))} and length {_short(sinfo.get('length'))}, "
                                f"not a path inside the checkpoint folder and two non-negative integers"))
            return scan
        check_shards(folder, unit["unit"], need, scan, rel)
        # each item's torch.save blob: its records' CRC-32s, computed by the hash stage's one pass
        dcp_crc.check_chunk_crcs(folder, storage, scan, byte_facts, rel, state_fields, item_fqn, _count, _inside)
        if ".metadata.tmp" in names:
            scan.add(leftovers.in_progress(rel(".metadata.tmp"),
                                           "a .metadata.tmp is left over from a save that did not finish"))
        scan.facts["n_items"] = len(storage)
        return scan


def _paths_outside(run_dir: Path, unit: str, storage: dict) -> Dict[str, str]:
    """{storage ``relative_path``: where it leads} for each path that resolves outside the run."""
    outside: Dict[str, str] = {}
    for info in storage.values():
        sinfo = state_fields(info)
        relp = sinfo.get("relative_path") if isinstance(sinfo, dict) else None
        if isinstance(relp, str) and relp and "\0" not in relp and relp not in outside:
            if where := confine.resolved_outside(run_dir, relp, unit):
                outside[relp] = where
    return outside


def _tensor_tree(sdm: dict) -> Dict[str, dict]:
    """{fqn: {"__tensor__": dtype, "shape": […]}} of the tensors in ``state_dict_metadata``; other items are
    ``{"__bytes_item__": True}``."""
    tree: Dict[str, dict] = {}
    for fqn, md in sdm.items():
        st = state_fields(md)
        if isinstance(st, dict) and "size" in st:
            shape = list(st["size"]) if isinstance(st["size"], (list, tuple)) else []
            tree[str(fqn)] = {"__tensor__": dtype_name(st.get("properties")), "shape": shape}
        else:
            tree[str(fqn)] = {"__bytes_item__": True}
    return tree


def _shard_ends(storage: dict) -> Tuple[Dict[str, tuple], Optional[tuple]]:
    """({data file: (bytes its items reach, the item reaching furthest, how many items)}, None), or ``(…, (index,
    storage info))`` of the first item whose path is not inside the folder or whose offset/length are no counts."""
    need: Dict[str, tuple] = {}
    for idx, info in storage.items():
        sinfo = state_fields(info)
        if not isinstance(sinfo, dict):
            continue
        relp = str(sinfo.get("relative_path"))
        offset, length = _count(sinfo.get("offset", 0)), _count(sinfo.get("length", 0))
        if offset is None or length is None or not _inside(relp):
            return need, (idx, sinfo)
        end = offset + length
        cur = need.get(relp)
        if cur is None or end > cur[0]:
            need[relp] = (end, item_fqn(idx), (cur[2] + 1) if cur else 1)
        else:
            need[relp] = (cur[0], cur[1], cur[2] + 1)
    return need, None


def check_shards(folder, unit: str, need: Dict[str, tuple], scan: UnitScan, rel) -> None:
    """Every data file the metadata's items name is present (``dcp_shard_missing``) and holds the bytes its items
    reach (``dcp_shard_too_short``: a rank's write cut short); ``need`` from :func:`_shard_ends`."""
    for relp, (end, fqn, n_items) in sorted(need.items()):
        p = folder / relp
        m = DISTCP.match(relp)
        rank = m.group(1) if m else "?"
        if not p.exists():
            scan.add(F.make("dcp_shard_missing", path=unit, file=relp, n_items=n_items, rank=rank))
            continue
        size = p.stat().st_size
        scan.files_checked.append(rel(relp))
        if size < end:
            scan.add(F.make("dcp_shard_too_short", path=unit, file=relp, actual=size, expected=end, item=fqn))


def _inside(relp: str) -> bool:
    """A ``relative_path`` that stays inside the checkpoint folder (FileSystemWriter writes
    ``__{rank}_{i}.distcp``; other writers may use sub-folders, never ``..`` or an absolute path)."""
    parts = relp.replace("\\", "/").split("/")
    return bool(relp) and not relp.startswith("/") and ".." not in parts and "\0" not in relp


def _count(v) -> Optional[int]:
    """``v`` as a byte offset or length: a non-negative int (bools are not), else None."""
    return v if type(v) is int and v >= 0 else None


def _short(v, limit: int = 60) -> str:
    from ..pickle_walk import short_repr

    return short_repr(v, limit)


def dtype_name(props) -> str:
    """The dtype of a walked ``TensorProperties``: a dataclass field ``dtype``, or the first item of
    the tuple its ``__getstate__`` returns (torch/distributed/checkpoint/metadata.py:
    ``(dtype, layout, requires_grad, memory_format, pin_memory)``)."""
    from ..pickle_walk import GlobalRef, Instance

    dtype = None
    if isinstance(props, Instance) and isinstance(props.state, tuple) and props.state \
            and isinstance(props.state[0], GlobalRef):
        dtype = props.state[0]
    else:
        st = state_fields(props)
        dtype = st.get("dtype") if isinstance(st, dict) else None
    return getattr(dtype, "name", None) or str(dtype)


def item_fqn(idx) -> str:
    """The fully qualified name of a walked ``MetadataIndex`` (state or positional args)."""
    item = state_fields(idx)
    if isinstance(item, dict):
        if "fqn" in item:
            return str(item["fqn"])
        args = item.get("args")
        if isinstance(args, list) and args:
            return str(args[0])
    return str(idx)


def state_fields(obj):
    """The attribute dict of a walked dataclass instance (or the object itself):
    :func:`ckptaudit.pickle_walk.model.instance_fields`."""
    from ..pickle_walk.model import instance_fields

    return instance_fields(obj)


def _nest(flat: dict, paths: dict) -> dict:
    """The saved state dict's nesting, rebuilt from its flat items (``{fqn: tree node}``).

    ``paths`` is the Metadata's ``planner_data``: ``{fqn: the key path it was flattened from}``, which
    ``DefaultSavePlanner`` records when it flattens the state dict (torch 2.13
    ``distributed/checkpoint/default_planner.py`` :110 and :150-152, ``_nested_dict.flatten_state_dict``) and
    from which DCP itself rebuilds the nested dict (``_EmptyStateDictLoadPlanner.set_up_planner``, :469-470:
    ``set_element(state_dict, metadata.planner_data[k], v)``; an int in a path is a list index).  So
    ``train_state.step`` saved as ``{"train_state": {"step": …}}`` comes back nested, while a key that itself
    holds dots (a module's ``layers.0.w1.weight`` at the root) stays one key.  An fqn without a nesting path (a
    writer that flattened its state itself: ``flatten_state_dict=False``, or flat keys given to DCP) is split on
    its first dot when it starts with a usual component name, ``{"model.wte.weight": x} -> {"model": {"wte.weight": x}}``, else kept
    whole; so is an item whose path meets a value where it needs a container."""
    out: dict = {}
    for k, v in flat.items():
        path = paths.get(k)
        if isinstance(path, (list, tuple)) and len(path) > 1 and isinstance(path[0], str) \
                and all(type(p) in (str, int) for p in path) and ".".join(map(str, path)) == k \
                and _set_path(out, list(path), v):
            continue
        head, _, rest = k.partition(".")
        if rest and head in ("model", "optim", "optimizer", "scheduler", "lr_scheduler") \
                and isinstance(out.setdefault(head, {}), dict) and _set_path(out, [head, rest], v):
            continue
        out[k] = v
    return out


def _set_path(out: dict, path: list, v) -> bool:
    """Put ``v`` at ``path`` (str keys, int list indices) in ``out``, creating the containers on the way as DCP's
    ``set_element`` does (torch ``distributed/checkpoint/_traverse.py`` :120-150); False, ``v`` not placed (the
    containers made on the way stay), when the path meets a value of another kind, a list index beyond
    :data:`MAX_LIST_INDEX`, or a taken leaf."""
    node = out
    for part, nxt in zip(path, path[1:]):
        want = dict if type(nxt) is str else list
        if type(nxt) is int and not 0 <= nxt < MAX_LIST_INDEX:
            return False
        if isinstance(node, dict):
            child = node.setdefault(str(part), want())
        else:
            if type(part) is not int or not 0 <= part < MAX_LIST_INDEX:
                return False
            node.extend([None] * (part + 1 - len(node)))
            child = node[part] = node[part] if node[part] is not None else want()
        if not isinstance(child, want) or (want is dict and ("__tensor__" in child or "__bytes_item__" in child)):
            return False
        node = child
    last = path[-1]
    if isinstance(node, dict):
        if str(last) in node:
            return False
        node[str(last)] = v
        return True
    if type(last) is not int or not 0 <= last < MAX_LIST_INDEX:
        return False
    node.extend([None] * (last + 1 - len(node)))
    node[last] = v
    return True


#: Largest list index a ``planner_data`` path may hold (a hostile ``.metadata`` cannot make the tree huge).
MAX_LIST_INDEX = 1 << 16


ADAPTER = DCP()
del prune
