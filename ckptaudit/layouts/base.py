"""The shared file scanner (scan_file): one file's bytes through its format checker; the face of the scan result and tree.

A scan reads bytes only: sniffing, zip/safetensors/legacy structure, CRCs,
and a static walk of every pickle (:mod:`ckptaudit.pickle_walk`).  Nothing is
unpickled and torch is never imported here.  The result types live in
:mod:`.result`, the described tree in :mod:`.tree`, and the byte-reading steps
of :func:`scan_file` in :mod:`.scan_file`; this module re-exports their names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

from ..security import tricks as security_tricks
from ..formats import pickles
from ..formats.pickles import walk_problem  # noqa: F401 (face: the adapters' walk findings)
from . import archive_pickles, tar_pickles
from .result import TensorRow, UnitScan
from .scan_file import (SWEEP_BYTES, json_tree, safetensors_rows,  # noqa: F401 (face)
                        security_sweep, storages_needed, walk_data_pkl, zip_small_values, zip_tensors)
from .tree import (PRUNE_NODE_BUDGET, SHARED_REPEAT_NODES, SMALL_TENSOR_NUMEL, PruneBudget, ShownValues, cut,  # noqa: F401 (face)
                   decode_small, prune, read_small, small_nbytes)


def describe(scan: "UnitScan", rel: str, obj: Any, values: Union[Dict[int, Any], ShownValues]) -> Any:
    """:func:`prune` of one file's object under a work budget; running out is a ``pickle_too_complex`` finding.
    ``values``: decoded small values by ``id(TensorMeta)``, or a :class:`ShownValues` gathering the tensors shown."""
    budget = PruneBudget()
    tree = prune(obj, values, budget=budget)
    if budget.exhausted:
        scan.add(pickles.tree_too_complex(rel, PRUNE_NODE_BUDGET))
    elif budget.shared_cut:
        scan.add(pickles.tree_shared_cut(rel, budget.shared_cut, SHARED_REPEAT_NODES))
    return tree


# --------------------------------------------------------- single files
def scan_file(run_dir: Path, rel: str, unit: str, scan: UnitScan, cfg: Dict[str, Any],
              extra_allowed: Optional[List[str]] = None, tree_key: Optional[str] = None,
              byte_facts=None) -> Dict[str, Any]:
    """Scan one file of a unit by its bytes; findings and tensors go into ``scan``.  ``byte_facts``: the hash
    stage's (:class:`ckptaudit.onepass.facts.ByteFacts`): the CRC32s and NUL runs its pass computed are not read again,
    and every read of the file answers from the bytes it kept (``byte_facts.kept``) first.

    Returns a dict of what was learnt: ``kind`` (sniffed format), ``obj`` (the
    walked top-level object, or None), ``header`` (safetensors header).
    """
    from ..formats import sniff as sniff_mod

    path = run_dir / rel
    kept = None if byte_facts is None else byte_facts.kept
    scan.files_checked.append(rel)
    allowed = list(cfg.get("security", {}).get("allow_globals", [])) + list(extra_allowed or [])
    s = sniff_mod.sniff(path, kept=kept)
    scan.facts.setdefault("file_kinds", {})[rel] = s.kind
    if tree_key and tree_key != rel:  # the tensors table's ``file`` of a tree key that is not the file's path
        scan.facts.setdefault("tree_files", {})[tree_key] = rel
    generic = sniff_mod.generic_findings(s, rel)
    out: Dict[str, Any] = {"kind": s.kind, "obj": None, "header": None, "size_bytes": s.size_bytes}
    swept = security_sweep(path, rel, s, scan, allowed, kept)
    if swept is not None:
        out["obj"] = swept.obj
        scan.tree[tree_key or rel] = describe(scan, rel, swept.obj, {})
        generic = sniff_mod.as_pickle(generic, s, swept.protocol, rel)
    if s.kind in ("npy", "npz"):  # object arrays hold a pickle, whatever the file layer says of the file
        from .numpy_pickles import scan_numpy

        scan_numpy(path, rel, s.kind, scan, allowed, kept)
    if s.kind == "unknown" and tar_pickles.is_tar(path, kept):  # torch's legacy tar format, or any tar
        tar_pickles.scan_tar(path, rel, scan, allowed, kept)
    scan.add(generic)
    if generic and any(f.severity == "error" for f in generic):
        return out
    scan.add(security_tricks.disguised(rel, s.kind))
    if s.kind in ("torch_zip", "zip"):
        _zip_file(path, rel, unit, scan, allowed, out, tree_key, byte_facts)
    elif s.kind == "torch_legacy":
        _legacy_file(path, rel, unit, scan, out, tree_key, kept)
    elif s.kind == "safetensors":
        _safetensors_file(path, rel, unit, scan, out, tree_key, byte_facts)
    elif s.kind == "json" and swept is None:
        json_tree(path, scan, out, tree_key or rel, kept)
    return out


def _zip_file(path: Path, rel: str, unit: str, scan: UnitScan, allowed: List[str], out: Dict[str, Any],
              tree_key: Optional[str], byte_facts=None) -> None:
    """A torch zip: its zip findings, the security of data.pkl, its storages, tensors and tree."""
    from ..formats import torchzip

    kept = None if byte_facts is None else byte_facts.kept
    walked: Dict[str, Any] = {}

    def tensor_names(data: bytes, n_records: int) -> Mapping[str, List[str]]:  # data.pkl walked once, for the CRCs too
        walked["res"], walked["streams"] = walk_data_pkl(scan, data, n_records,
                                                         None if byte_facts is None else byte_facts.walks)
        return _names_by_storage(walked["res"].tensors)

    rep = torchzip.check_zip(path, display=rel, tensor_names=tensor_names, facts=byte_facts)
    scan.add(rep.findings)
    scan.add(security_tricks.mixed_archive(rel, rep.members.names))
    member = f"{rep.prefix}/data.pkl" if rep.prefix else "data.pkl"
    # a TorchScript archive's pickles are read by torch.jit.load's C++ unpickler, not by torch.load's
    script = archive_pickles.torchscript_of(rep)
    if rep.data_pkl is None:
        if rep.data_pkl_any:  # damaged record: a loader that ignores the CRC still unpickles it
            from .. import security

            archive_pickles.judge(scan, rel, member, security.streams(rep.data_pkl_any), allowed,
                                  prefix=rep.prefix, torchscript=script, data_pkl=True)
        archive_pickles.scan_zip_members(path, rel, scan, allowed, rep, torchscript=script,
                                         done=[member] if rep.data_pkl_any else [], kept=kept)
        return
    res, all_streams = walked.pop("res"), walked.pop("streams")
    archive_pickles.judge(scan, rel, member, all_streams, allowed, prefix=rep.prefix, torchscript=script,
                          data_pkl=True)
    archive_pickles.scan_zip_members(path, rel, scan, allowed, rep, torchscript=script, done=[member], kept=kept)
    # judged and walked: data.pkl's bytes (~80 a tensor) go before the tensors' columns and tree are built
    del all_streams
    rep.data_pkl = rep.data_pkl_any = None
    if res.error:
        scan.add(walk_problem(res, rel, member))
    scan.add(torchzip.check_storages(rep, storages_needed(res), rel))
    zip_tensors(path, rel, unit, scan, rep, res)
    # the tensors are columns now: their (dotted name, TensorMeta) pairs go before the tree (it reaches each
    # TensorMeta through res.obj; issue 45: ~140 bytes a tensor)
    res.tensors = []
    out["obj"] = res.obj
    shown = ShownValues()  # the small tensors the tree shows: their values read, not every small tensor's
    tree = describe(scan, rel, res.obj, shown)
    zip_small_values(path, rep, shown, kept)
    scan.tree[tree_key or rel] = tree


def _legacy_file(path: Path, rel: str, unit: str, scan: UnitScan, out: Dict[str, Any],
                 tree_key: Optional[str], kept=None) -> None:
    """A legacy torch.save file: its findings, tensors and tree (its security came from the sweep)."""
    from ..formats import legacy

    res, fl = legacy.check_legacy(path, display=rel, kept=kept)
    scan.add(fl)
    if res is not None:  # its security findings came from the sweep of all five records
        for name, tm in res.tensors:
            scan.tensors.append(TensorRow(unit, rel, name, tm.dtype, list(tm.shape), tm.numel,
                                          tm.nbytes, tm.storage.key, -1, tm.is_parameter, tm.storage_offset))
        out["obj"] = res.obj
        scan.tree[tree_key or rel] = describe(scan, rel, res.obj, {})


def _safetensors_file(path: Path, rel: str, unit: str, scan: UnitScan, out: Dict[str, Any],
                      tree_key: Optional[str], byte_facts=None) -> None:
    """A safetensors file: its findings, and with a readable header its tensors and tree."""
    from ..formats.safetensors_check import check_safetensors

    header, fl = check_safetensors(path, display=rel, facts=byte_facts)
    scan.add(fl)
    if header is not None:
        tree = safetensors_rows(path, rel, unit, scan, header, None if byte_facts is None else byte_facts.kept)
        out["header"] = header
        out["obj"] = tree
        scan.tree[tree_key or rel] = {"__safetensors__": tree, "__metadata__": header.get("__metadata__")}


class _NamesByStorage(Mapping):
    """{storage key: names of the tensors it holds} of a data.pkl walk's ``tensors``, built on the first lookup:
    only a record that fails its CRC asks, and an intact archive of 300,000 tensors then holds no list per
    storage (issue 45)."""

    def __init__(self, tensors) -> None:
        self._tensors = tensors
        self._by_key: Optional[Dict[str, List[str]]] = None

    def _built(self) -> Dict[str, List[str]]:
        if self._by_key is None:
            self._by_key = {}
            for name, tm in self._tensors:
                self._by_key.setdefault(str(tm.storage.key), []).append(name)
        return self._by_key

    def __getitem__(self, key: str) -> List[str]:
        return self._built()[key]

    def __iter__(self):
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


def _names_by_storage(tensors) -> Mapping:
    """{storage key: names of the tensors it holds} of a data.pkl walk's ``tensors`` (built when first read)."""
    return _NamesByStorage(tensors)


def tensors_in_range(run_dir: Path, rel: str, unit: str, start: int, end: int) -> str:
    """Which tensors of ``rel`` have bytes in [start, end), from a byte-level scan of its metadata (never
    unpickled; no tensor byte read: the caller's pass already checked them)."""
    try:
        from ..fs.read_depth import METADATA_ONLY
        from ..onepass.facts import ByteFacts

        scan = UnitScan(unit, "")
        scan_file(run_dir, rel, unit, scan, {"security": {"allow_globals": []}},
                  byte_facts=ByteFacts(METADATA_ONLY.tensor_bytes))
    except Exception as e:  # noqa: BLE001 - naming tensors is best effort on a damaged file
        return f"the tensors in that range could not be named ({type(e).__name__})"
    hit = [t.name for t in scan.iter_tensors() if t.data_offset >= 0 and t.data_offset < end
           and t.data_offset + max(t.nbytes, 1) > start]
    if not hit:
        return "no tensor data lies in that range (headers, the pickle or the zip directory)"
    more = f" and {len(hit) - 5} more" if len(hit) > 5 else ""
    return "it holds tensor(s) " + ", ".join(hit[:5]) + more
