"""The result of scanning one unit: its tensors (TensorRow), findings, imports, trees and facts (UnitScan).

``UnitScan.row`` scopes a metadata file's security warnings by its role (``_scope_security_by_role``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List

from ..findings import Finding


@dataclass(slots=True)
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


#: The fields of :class:`TensorRow`, which are the ``tensors`` table's columns.
TENSOR_COLUMNS = ("unit", "file", "name", "dtype", "shape", "numel", "nbytes", "storage_key", "data_offset",
                  "is_parameter", "storage_offset")


@dataclass
class UnitScan:
    unit: str
    layout: str
    findings: List[Finding] = field(default_factory=list)
    imports: List[Dict[str, Any]] = field(default_factory=list)  # one per pickle import
    tensors: List[TensorRow] = field(default_factory=list)
    # tensors already as ``tensors`` tables (a safetensors header's, issue 45), in order before ``tensors``
    tensor_tables: List[Any] = field(default_factory=list)
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

    def add_tensor_table(self, table) -> None:
        """Add tensors as a ``tensors`` table (``pyarrow``), after the rows added so far (kept in order)."""
        if self.tensors:
            self.tensor_tables.append(self.tensor_table_of_rows())
            self.tensors.clear()
        self.tensor_tables.append(table)

    def tensor_table_of_rows(self):
        """The :class:`TensorRow` rows in ``tensors`` as a ``tensors`` table."""
        from .. import tables

        return tables.from_columns("tensors", {c: [getattr(t, c) for t in self.tensors] for c in TENSOR_COLUMNS})

    def n_tensors(self) -> int:
        """The tensors found, rows and tables together."""
        return len(self.tensors) + sum(t.num_rows for t in self.tensor_tables)

    def iter_tensors(self) -> Iterator[TensorRow]:
        """Every tensor found, as :class:`TensorRow` (those held as tables made rows a batch at a time)."""
        for t in self.tensor_tables:
            for batch in t.to_batches(max_chunksize=1 << 14):
                yield from (TensorRow(**r) for r in batch.to_pylist())
        yield from self.tensors

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
            "n_tensors": self.n_tensors(),
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
        if f.layer != "security" or f.severity == "error" or file_roles.get(f.path) != "metadata" \
                or f.kind == "pickle_global_not_loaded_on_resume":  # its message already says so
            continue
        if f.detail.get("file_role") != "metadata":
            f.detail["file_role"] = "metadata"
            f.message += _METADATA_NOTE.format(path=f.path)
