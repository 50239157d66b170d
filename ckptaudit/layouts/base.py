"""What every layout adapter returns from a scan, and the shared file scanner.

A scan reads bytes only: sniffing, zip/safetensors/legacy structure, CRCs,
and a static walk of every pickle (:mod:`ckptaudit.pickle_walk`).  Nothing is
unpickled and torch is never imported here.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import findings as F
from .. import fs
from ..findings import Finding

# Element formats for reading small tensors (scalars such as an optimizer's
# per-parameter ``step``) straight from the bytes, little-endian as torch writes
# them (torch/serialization.py records ``byteorder``).
_STRUCT = {
    "float64": "d", "float32": "f", "float16": "e", "int64": "q", "int32": "i",
    "int16": "h", "int8": "b", "uint8": "B", "bool": "?",
}
SMALL_TENSOR_NUMEL = 8


@dataclass
class TensorRow:
    """One tensor of a unit, located in its file.

    ``data_offset`` is the absolute byte offset of the tensor's first element in
    ``file`` (−1 when unknown); ``nbytes`` = numel × itemsize.
    """

    unit: str
    file: str
    name: str  # dotted path from the pickle root, e.g. "model.wte.weight"
    dtype: str
    shape: List[int]
    numel: int
    nbytes: int
    storage_key: str
    data_offset: int
    is_parameter: bool = False
    storage_offset: int = 0  # elements into the storage (views of one storage: tied weights, flat LSTM weights)


@dataclass
class UnitScan:
    unit: str
    layout: str
    findings: List[Finding] = field(default_factory=list)
    imports: List[Dict[str, Any]] = field(default_factory=list)  # one per pickle import
    tensors: List[TensorRow] = field(default_factory=list)
    tree: Dict[str, Any] = field(default_factory=dict)  # per file: pruned object tree
    facts: Dict[str, Any] = field(default_factory=dict)  # layout facts (world sizes, steps …)
    files_checked: List[str] = field(default_factory=list)
    pickle_bytes: int = 0
    walk_seconds: float = 0.0

    def add(self, f: Finding | List[Finding]):
        if isinstance(f, list):
            self.findings.extend(f)
        else:
            self.findings.append(f)

    def benign_by_file(self) -> Dict[str, List[str]]:
        """{file: known-benign globals its pickles import} (what the load test must allow, per file)."""
        out: Dict[str, set] = {}
        for i in self.imports:
            if i.get("category") == "benign":
                out.setdefault(i["file"], set()).add(f"{i['module']}.{i['name']}")
        return {f: sorted(v) for f, v in out.items()}

    def row(self) -> Dict[str, Any]:
        _scope_security_by_role(self.findings, self.facts.get("file_roles") or {})
        errs = [f for f in self.findings if f.severity == "error"]
        return {
            "unit": self.unit,
            "layout": self.layout,
            "n_files": len(self.files_checked),
            "n_tensors": len(self.tensors),
            "n_imports": len(self.imports),
            "pickle_bytes": self.pickle_bytes,
            "walk_seconds": self.walk_seconds,
            "file_ok": not any(f.layer == "file" for f in errs),
            # no security error on a file the resume loads (a metadata file cannot stop the other layers)
            "security_ok": not any(f.layer == "security" and (self.facts.get("file_roles") or {}).get(f.path)
                                   != "metadata" for f in errs),
            "benign_globals": sorted({f"{i['module']}.{i['name']}" for i in self.imports if i.get("category") == "benign"}),
            "facts_json": json.dumps({**self.facts, "benign_by_file": self.benign_by_file()}, sort_keys=True,
                                     default=str),
            "tree_json": json.dumps(self.tree, sort_keys=True, default=str),
            "findings_json": json.dumps([f.to_dict() for f in self.findings]),
        }


_METADATA_NOTE = " {path} is metadata: the producer's resume never unpickles it."


def _scope_security_by_role(fl: List[Finding], file_roles: Dict[str, str]) -> None:
    """Say so on each security warning of a metadata file (``training_args.bin``): it cannot stop a
    resume; only a dangerous finding there (an error) still makes the unit unusable."""
    for f in fl:
        if f.layer != "security" or f.severity == "error" or file_roles.get(f.path) != "metadata":
            continue
        if f.detail.get("file_role") != "metadata":
            f.detail["file_role"] = "metadata"
            f.message += _METADATA_NOTE.format(path=f.path)


# ---------------------------------------------------------------- pruning
PRUNE_NODE_BUDGET = 1_000_000  # nodes described per file; a pickle whose tree is larger is a finding


class PruneBudget:
    """Work bound of :func:`prune`: nodes left, the containers on the current path (cycles), and
    whether the budget ran out (``exhausted``)."""

    def __init__(self, nodes: int = PRUNE_NODE_BUDGET) -> None:
        self.left = nodes
        self.path: set = set()
        self.exhausted = False


def prune(obj: Any, values: Dict[int, Any], depth: int = 0, max_items: int = 4096,
          budget: Optional[PruneBudget] = None) -> Any:
    """A JSON-able description of a walked pickle object.

    Tensors become ``{"__tensor__": dtype, "shape": [...], "value": x}``
    (``value`` only for tensors of ≤ 8 elements whose bytes were readable);
    symbolic instances keep their class name and state.  ``values`` maps
    ``id(TensorMeta)`` to decoded small values.
    """
    from ..pickle_walk import Call, GlobalRef, Instance, TensorMeta

    if budget is None:
        budget = PruneBudget()
    if depth > 40:
        return "<deep>"
    budget.left -= 1
    if budget.left < 0:  # a tree that re-expands shared containers (a list appended to itself) ends here
        budget.exhausted = True
        return "<budget>"
    if isinstance(obj, (dict, list, tuple, Instance, Call)):
        if id(obj) in budget.path:
            return "<cycle>"
        budget.path.add(id(obj))
        try:
            return _prune_container(obj, values, depth, max_items, budget)
        finally:
            budget.path.discard(id(obj))
    return _prune_leaf(obj, values)


def walk_problem(res: Any, rel: str, member: str) -> F.Finding:
    """The finding for a walk that stopped before ``STOP``: ``pickle_too_complex`` when only the work budget
    ran out (the bytes may be fine), ``pickle_unreadable`` for damage."""
    if not res.budget_exhausted:
        return F.make("pickle_unreadable", path=rel, member=member, why=res.error)
    if res.imports_complete:
        imports = "every import was still listed and checked"
    else:
        imports = (f"imports were checked up to byte {res.imports_end} only, the rest was not scanned: treat the "
                   f"file as untrusted")
    return F.make("pickle_too_complex", path=rel, member=member, why=res.error, imports=imports)


def describe(scan: "UnitScan", rel: str, obj: Any, values: Dict[int, Any]) -> Any:
    """:func:`prune` of one file's object under a work budget; running out is a ``pickle_too_complex`` finding."""
    budget = PruneBudget()
    tree = prune(obj, values, budget=budget)
    if budget.exhausted:
        scan.add(F.make("pickle_too_complex", path=rel,
                        why=f"its object tree expands past {PRUNE_NODE_BUDGET} nodes, as shared containers "
                            f"re-expanded (a list appended to itself) do",
                        imports="every import was checked"))
    return tree


def _prune_container(obj: Any, values: Dict[int, Any], depth: int, max_items: int, budget: "PruneBudget") -> Any:
    from ..pickle_walk import Call, GlobalRef, Instance

    if isinstance(obj, dict):
        out = {}
        for i, (k, v) in enumerate(obj.items()):
            if i >= max_items:
                out["__truncated__"] = len(obj)
                break
            out[str(k)] = prune(v, values, depth + 1, max_items, budget)
        return out
    if isinstance(obj, (list, tuple)):
        if len(obj) > 64 and all(isinstance(x, (int, float)) for x in obj[:64]):
            return {"__list__": len(obj)}
        return [prune(v, values, depth + 1, max_items, budget) for v in obj[:max_items]]
    if isinstance(obj, Instance):
        cls = obj.cls
        name = f"{cls.module}.{cls.name}" if isinstance(cls, GlobalRef) else str(cls)
        d: Dict[str, Any] = {"__instance__": name}
        if obj.args:
            d["args"] = prune(list(obj.args), values, depth + 1, max_items, budget)
        if obj.state is not None:
            d["state"] = prune(obj.state, values, depth + 1, max_items, budget)
        if obj.items:
            d["items"] = prune(obj.items, values, depth + 1, max_items, budget)
        return d
    f = obj.func  # Call
    name = f"{f.module}.{f.name}" if isinstance(f, GlobalRef) else "<computed>"
    return {"__call__": name, "args": prune(list(obj.args), values, depth + 1, max_items, budget)}


def _prune_leaf(obj: Any, values: Dict[int, Any]) -> Any:
    from ..pickle_walk import GlobalRef, TensorMeta, _short_repr

    if isinstance(obj, TensorMeta):
        d = {"__tensor__": obj.dtype, "shape": list(obj.shape)}
        if id(obj) in values:
            d["value"] = values[id(obj)]
        return d
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": len(obj)}
    if isinstance(obj, GlobalRef):
        return {"__global__": f"{obj.module}.{obj.name}"}
    if isinstance(obj, (set, frozenset)):  # members are hashable scalars or nested (frozen)sets: one level shown
        return [v if isinstance(v, (str, int, float, bool)) or v is None else _short_repr(v, 200)
                for v in list(obj)[:4096]]
    return _short_repr(obj, 200)  # bounded: a 100,000-deep persistent id must not recurse


def small_nbytes(dtype: str, numel: int) -> Optional[int]:
    """Bytes of a tensor of ≤ 8 elements that :func:`decode_small` can decode, else None."""
    if numel > SMALL_TENSOR_NUMEL:
        return None
    if dtype == "bfloat16":
        return 2 * numel
    fmt = _STRUCT.get(dtype)
    return None if fmt is None else struct.calcsize(fmt) * numel


def decode_small(raw: bytes, dtype: str, numel: int):
    """The value(s) of a small tensor from its little-endian bytes; None when not decodable
    (short read, unknown dtype).  NaN/Inf become the strings ``"nan"``/``"inf"``."""
    n = small_nbytes(dtype, numel)
    if n is None or len(raw) != n:
        return None
    if dtype == "bfloat16":
        vals = [struct.unpack("<f", b"\x00\x00" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    else:
        vals = list(struct.unpack("<" + _STRUCT[dtype] * numel, raw))
    vals = [v if not isinstance(v, float) or v == v and abs(v) != float("inf") else str(v) for v in vals]
    return vals[0] if numel == 1 else vals


def read_small(fh, offset: int, dtype: str, numel: int):
    """Decode a tensor of ≤ 8 elements at ``offset`` of open file ``fh``; None when not decodable."""
    n = small_nbytes(dtype, numel)
    if n is None or offset < 0:
        return None
    fh.seek(offset)
    return decode_small(fh.read(n), dtype, numel)


def relabel(fl: List[Finding], rel: str) -> List[Finding]:
    """Re-render findings of a byte checker with the file's run-relative path.

    The format checkers name the path they opened (absolute); findings shown to
    people name the file as it sits in the run folder.
    """
    out = []
    for f in fl:
        vals = {k: v for k, v in f.detail.items() if k != "path"}
        if f.kind in F.CATALOGUE:
            g = F.make(f.kind, path=rel, **vals)
            g.detail = f.detail | {"path": rel}
            out.append(g)
        else:
            f.path = rel
            out.append(f)
    return out


# --------------------------------------------------------- single files
def scan_file(run_dir: Path, rel: str, unit: str, scan: UnitScan, cfg: Dict[str, Any],
              extra_allowed: Optional[List[str]] = None, tree_key: Optional[str] = None) -> Dict[str, Any]:
    """Scan one file of a unit by its bytes; findings and tensors go into ``scan``.

    Returns a dict of what was learnt: ``kind`` (sniffed format), ``obj`` (the
    walked top-level object, or None), ``header`` (safetensors header).
    """
    import time

    from ..formats import sniff as sniff_mod
    from .. import security

    path = run_dir / rel
    scan.files_checked.append(rel)
    allowed = list(cfg.get("security", {}).get("allow_globals", [])) + list(extra_allowed or [])
    s = sniff_mod.sniff(path)
    scan.facts.setdefault("file_kinds", {})[rel] = s.kind
    generic = relabel(sniff_mod.generic_findings(s), rel)
    out: Dict[str, Any] = {"kind": s.kind, "obj": None, "header": None, "size_bytes": s.size_bytes}
    swept = _security_sweep(path, rel, s, scan, allowed)
    if swept is not None:
        out["obj"] = swept.obj
        scan.tree[tree_key or rel] = describe(scan, rel, swept.obj, {})
        generic = _as_pickle(generic, rel, s, swept.protocol)
    scan.add(generic)
    if generic and any(f.severity == "error" for f in generic):
        return out
    values: Dict[int, Any] = {}
    _disguise(rel, s.kind, scan)
    if s.kind in ("torch_zip", "zip"):
        from ..formats import torchzip

        rep = torchzip.check_zip(path)
        scan.add(relabel(rep.findings, rel))
        prefixes = sorted({m.name.split("/", 1)[0] for m in rep.members if "/" in m.name})
        pkls = sorted(m.name for m in rep.members if m.name.endswith("data.pkl"))
        if len(prefixes) > 1 or len(pkls) > 1:
            scan.add(F.make("pickle_obfuscation", path=rel, member=", ".join(pkls) or "(none)",
                            why=f"the archive mixes record folders {prefixes} or holds several data.pkl "
                                f"({len(pkls)}); torch reads one and other tools another"))
        member = f"{rep.prefix}/data.pkl" if rep.prefix else "data.pkl"
        from ..pickle_walk import walk

        if rep.data_pkl is None:
            if rep.data_pkl_any:  # damaged record: a loader that ignores the CRC still unpickles it
                all_streams = security.streams(rep.data_pkl_any)
                verdicts, sec = security.scan(all_streams, path=rel, member=member, extra_allowed=allowed)
                scan.add(sec)
                scan.imports.extend({"file": rel, "member": member, **asdict(v)} for v in verdicts)
            return out
        t0 = time.perf_counter()
        res = walk(rep.data_pkl)
        all_streams = security.streams(rep.data_pkl, res)
        scan.walk_seconds += time.perf_counter() - t0
        scan.pickle_bytes += len(rep.data_pkl)
        verdicts, sec = security.scan(all_streams, path=rel, member=member, extra_allowed=allowed)
        scan.add(sec)
        scan.imports.extend({"file": rel, "member": member, **asdict(v)} for v in verdicts)
        if res.error:
            scan.add(walk_problem(res, rel, member))
        storages = {}
        for key, sref in res.storages.items():
            if sref.numel is not None:
                storages[key] = (sref.numel * sref.itemsize, sref.dtype, sref.numel)
        scan.add(relabel(torchzip.check_storages(rep, storages, rel), rel))
        _name_damaged_tensors(scan, rel, rep.prefix, res.tensors)
        members = {m.name: m for m in rep.members}
        small = []
        for name, tm in res.tensors:
            m = members.get(f"{rep.prefix}/data/{tm.storage.key}")
            off = m.data_offset + tm.storage_offset * tm.storage.itemsize if m else -1
            scan.tensors.append(TensorRow(unit, rel, name, tm.dtype, list(tm.shape), tm.numel,
                                          tm.nbytes, tm.storage.key, off, tm.is_parameter, tm.storage_offset))
            if tm.numel <= SMALL_TENSOR_NUMEL and m is not None:
                small.append((off, tm))
        small = [(off, tm, n) for off, tm in small if off >= 0 and (n := small_nbytes(tm.dtype, tm.numel))]
        if small and fs.is_remote(path) and torchzip.REMOTE_PREFETCH:  # all small values in one batch
            try:
                raws = fs.read_ranges(path, [(off, n) for off, _, n in small])
            except OSError:
                raws = [None] * len(small)
            for (off, tm, n), raw in zip(small, raws):
                v = decode_small(raw, tm.dtype, tm.numel) if raw is not None else None
                if v is not None:
                    values[id(tm)] = v
        elif small:
            with fs.open_binary(path, exact=True) as fh:
                for off, tm, n in small:
                    try:
                        v = read_small(fh, off, tm.dtype, tm.numel)
                    except OSError:
                        v = None
                    if v is not None:
                        values[id(tm)] = v
        out["obj"] = res.obj
        scan.tree[tree_key or rel] = describe(scan, rel, res.obj, values)
    elif s.kind == "torch_legacy":
        from ..formats import legacy

        res, fl = legacy.check_legacy(path)
        scan.add(relabel(fl, rel))
        if res is not None:  # its security findings came from the sweep of all five records
            for name, tm in res.tensors:
                scan.tensors.append(TensorRow(unit, rel, name, tm.dtype, list(tm.shape), tm.numel,
                                              tm.nbytes, tm.storage.key, -1, tm.is_parameter, tm.storage_offset))
            out["obj"] = res.obj
            scan.tree[tree_key or rel] = describe(scan, rel, res.obj, values)
    elif s.kind == "safetensors":
        from ..formats.safetensors_check import check_safetensors, valid_entries

        header, fl = check_safetensors(path)
        scan.add(relabel(fl, rel))
        if header is not None:
            hlen = _safetensors_header_len(path)
            tree: Dict[str, Any] = {}
            # a malformed entry (wrong types) is already an invalid_header_json error: it is not a tensor
            for name, info in valid_entries(header):
                a, b = info["data_offsets"]
                dtype = _ST_DTYPES.get(info.get("dtype"), str(info.get("dtype")).lower())
                shape = list(info.get("shape", []))
                numel = 1
                for d in shape:
                    numel *= int(d)
                scan.tensors.append(TensorRow(unit, rel, name, dtype, shape, numel, b - a, name, 8 + hlen + a))
                tree[name] = {"__tensor__": dtype, "shape": shape}
            out["header"] = header
            out["obj"] = tree
            scan.tree[tree_key or rel] = {"__safetensors__": tree, "__metadata__": header.get("__metadata__")}
    elif s.kind == "json" and swept is None:
        try:
            with fs.open_binary(path) as fh:
                out["obj"] = fs.loads_json(fh.read(16 << 20))
            scan.tree[tree_key or rel] = out["obj"]
        except (OSError, ValueError):
            pass
    return out


_ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U16": "uint16", "U32": "uint32", "U64": "uint64",
}


def _name_damaged_tensors(scan: UnitScan, rel: str, prefix: str, tensors) -> None:
    """Say which tensors live in a storage record whose CRC failed."""
    by_key: Dict[str, List[str]] = {}
    for name, tm in tensors:
        by_key.setdefault(str(tm.storage.key), []).append(name)
    for i, f in enumerate(scan.findings):
        if f.kind != "zip_crc_mismatch" or f.path != rel:
            continue
        member = str(f.detail.get("member", ""))
        key = member.rsplit("/", 1)[-1] if f"{prefix}/data/" in member else None
        names = by_key.get(key or "", [])
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            vals = {k: v for k, v in f.detail.items() if k != "path"}
            vals["tensor_text"] = f"; it holds {shown}"
            scan.findings[i] = F.make(f.kind, path=rel, **vals)


_PICKLE_KINDS = ("torch_zip", "torch_legacy", "pickle", "zip")
#: Sniff kinds whose bytes may be a pickle (protocol 0 is text; protocol 1 starts with any opcode).
_SWEPT_KINDS = ("torch_legacy", "pickle", "text", "json", "html", "unknown")
#: Bytes of one file read for the security sweep (legacy records sit at the front).
SWEEP_BYTES = 256 << 20
_SWEEP_HEAD_BYTES = 1 << 20


def _security_sweep(path: Path, rel: str, s, scan: UnitScan, allowed: List[str]):
    """Walk every pickle stream of a file that is not a zip or safetensors, whatever its name or
    what the file layer calls it; add its security findings.  Returns the combined walk when the
    bytes are a pickle, else None.  ``torch.load`` with weights-only off unpickles the first pickle
    of any non-zip file before it checks a magic number, so each one is a loadable pickle."""
    import time

    from .. import security
    from ..pickle_walk import walk

    if s.kind not in _SWEPT_KINDS or s.size_bytes == 0:
        return None
    t0 = time.perf_counter()
    with fs.open_binary(path) as fh:
        data = fh.read(min(s.size_bytes, _SWEEP_HEAD_BYTES))  # most non-pickles fail in the first bytes
        first = walk(data)
        if s.kind not in ("torch_legacy", "pickle") and not first.globals \
                and not (first.n_ops >= 2 and (first.error is None or first.error.startswith("truncated"))):
            return None  # text or bytes that are no pickle
        if len(data) < s.size_bytes and (first.error is None or first.error.startswith("truncated")):
            data += fh.read(min(s.size_bytes, SWEEP_BYTES) - len(data))
            first = walk(data)
    res = security.streams(data, first, expected=5 if s.kind == "torch_legacy" else 1)
    scan.walk_seconds += time.perf_counter() - t0
    member = "(legacy pickle)" if s.kind == "torch_legacy" else "(pickle)"
    verdicts, sec = security.scan(res, path=rel, member=member, extra_allowed=allowed)
    scan.add(sec)
    scan.imports.extend({"file": rel, "member": member, **asdict(v)} for v in verdicts)
    return res


def _as_pickle(generic: List[Finding], rel: str, s, protocol: Optional[int]) -> List[Finding]:
    """File-layer findings of a file whose bytes turned out to be a pickle: a text, HTML or
    unknown-bytes verdict is replaced by ``not_a_torch_save_file`` (an error page is named so
    only when it is not a pickle)."""
    if s.kind not in ("text", "json", "html", "unknown"):
        return generic
    kept = [f for f in generic if f.kind not in ("text_error_page", "html_error_page", "unknown_format")]
    if len(kept) != len(generic) or s.kind in ("html", "unknown"):
        kept.append(F.make("not_a_torch_save_file", path=rel, size_bytes=s.size_bytes,
                           pickle_protocol=protocol if protocol is not None else "0 or 1"))
    return kept


def _disguise(rel: str, kind: str, scan: UnitScan) -> None:
    """A file whose name promises a pickle-free format but whose bytes are a pickle.

    Loaders that dispatch on content (e.g. ``torch.load`` on anything) would
    unpickle it although its name says it is safe (safetensors, npy/npz).
    """
    name = rel.lower()
    if name.endswith((".safetensors", ".npy", ".npz")) and kind in _PICKLE_KINDS:
        scan.add(F.make("pickle_obfuscation", path=rel, member=rel,
                        why=f"it is named like a pickle-free format but its bytes are a {kind.replace('_', ' ')}"))


def _safetensors_header_len(path: Path) -> int:
    with fs.open_binary(path) as fh:
        return struct.unpack("<Q", fh.read(8))[0]
