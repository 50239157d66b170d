"""Megatron-Core ``torch_dist`` iteration folders: a DCP save plus Megatron's common state, judged as one unit.

An ``iter_<N:07d>`` (or ``release``) folder holding a DCP save (``.metadata``, ``__<rank>_<n>.distcp``) beside
Megatron-Core's own files (``common.pt`` and/or ``metadata.json``) is claimed here before the plain DCP
adapter (a save of the newer layout killed before both markers is judged as a plain DCP folder: it has no
``.metadata`` either).  The DCP checks run as for
every DCP folder (:class:`ckptaudit.layouts.dcp.DCP`); then the common state is read statically (``common.pt``
by the shared file scanner, or the ``common_state/shard_0_1`` item of the DCP files, walked, never unpickled),
its absence is ``megatron_common_state_missing``, and the unit's tree is the state ``dist_checkpointing.load``
returns (:func:`ckptaudit.producers.megatron.merged_state`).  Format facts: :mod:`ckptaudit.producers.megatron`.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import findings as F
from .. import fs
from ..producers import megatron as M
from .adapter import folder_names
from .base import UnitScan, describe, scan_file
from .dcp import DCP, MAX_METADATA_BYTES, read_metadata
from .megatron import ITER_RE

#: ``metadata.json`` read, at most (it is a few hundred bytes: backend and version)
MAX_CONFIG_BYTES = 1 << 16


class MegatronDist(DCP):
    def __init__(self) -> None:
        super().__init__("megatron-dist")

    def claim_dir(self, path: Path) -> bool:
        if not ITER_RE.match(path.name):
            return False
        names = folder_names(path) or []
        if not self.claims_names(names):
            return False
        return any(n in names for n in M.CORE_MARKERS)

    def state_tree(self, flat: dict, paths: dict) -> dict:
        """The DCP items as they are stored, by their sharded keys (merged with the common state in :meth:`scan`)."""
        return dict(flat)

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = super().scan(run_dir, unit, cfg, byte_facts)
        kept = None if byte_facts is None else byte_facts.kept  # every read answers from the pass's bytes first
        folder = run_dir / unit["unit"]
        rel = lambda n: f"{unit['unit']}/{n}" if unit["unit"] != "." else n  # noqa: E731
        names = set(fs.listdir(folder))
        flat = scan.tree.pop("root", None)
        common, where = None, ""
        if "common.pt" in names:
            info = scan_file(run_dir, rel("common.pt"), unit["unit"], scan, cfg, tree_key="common.pt",
                             byte_facts=byte_facts)
            common, where = scan.tree.pop("common.pt", None), "common.pt"
            if common is None and info.get("obj") is not None:
                common = describe(scan, rel("common.pt"), info["obj"], {})
        elif ".metadata" in names:
            common, where = _common_item(folder, rel(".metadata"), cfg, scan, kept)
            if where is None:
                scan.add(F.make("megatron_common_state_missing", path=unit["unit"]))
        scan.facts["common_state"] = where or None
        scan.facts["checkpointing_config"] = _config(folder / "metadata.json", kept) if "metadata.json" in names \
            else None
        if isinstance(flat, dict):
            scan.tree["root"] = M.merged_state(flat, common)
        return scan


def _config(path: Path, kept=None):
    """``metadata.json`` (``{"sharded_backend": "torch_dist", "sharded_backend_version": 1, …}``), or None when
    it cannot be read as a JSON object (``kept``: bytes of remote objects already read, answered from memory)."""
    try:
        v = json.loads(fs.read_bounded(path, MAX_CONFIG_BYTES, kept=kept))
    except (OSError, ValueError):
        return None
    return v if isinstance(v, dict) else None


def _common_item(folder: Path, shown: str, cfg: dict, scan: UnitScan, kept=None):
    """``(pruned tree, where)`` of the ``common_state`` ShardedObject of a save without ``common.pt``: its
    ``torch.save`` blob's pickle walked statically (its imports were judged by the DCP scan); ``(None, None)``
    when ``.metadata`` lists no such item, ``(None, item)`` when it cannot be read.  ``kept``: bytes of remote
    objects already read (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
    from ..pickle_walk import walk
    from .dcp import item_fqn, state_fields
    from .dcp_bytes import pickle_of, read_item

    sdm, storage, _ = read_metadata(folder, shown, cfg, kept)
    if storage is None:
        return None, ""  # refused or unreadable: the DCP scan said so
    for idx, info in storage.items():
        if item_fqn(idx) != M.COMMON_STATE_ITEM:
            continue
        s = state_fields(info)
        off, n, relp = s.get("offset"), s.get("length"), s.get("relative_path")
        if type(off) is not int or type(n) is not int or not isinstance(relp, str) or "/" in relp \
                or n > MAX_METADATA_BYTES:
            return None, M.COMMON_STATE_ITEM
        blob = read_item(folder / relp, off, n, kept)
        data = pickle_of(blob) if blob else b""
        res = walk(data) if data else None
        if res is None or res.error or res.budget_exhausted:
            return None, M.COMMON_STATE_ITEM
        obj = res.obj[0] if isinstance(res.obj, list) and res.obj else res.obj  # load_common_state_dict: [0]
        return describe(scan, shown, obj, {}), M.COMMON_STATE_ITEM
    return None, None


ADAPTER = MegatronDist()
