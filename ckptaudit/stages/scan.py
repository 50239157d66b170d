"""Scanning units by their bytes: each unit through its layout adapter, with file roles and the inventory's findings.

The scan rule (:mod:`ckptaudit.stages`), :func:`ckptaudit.safe_load_checkpoint` and the
reference-checkpoint target (:mod:`ckptaudit.stages.target`) all scan through :func:`scan_units`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator, List, Tuple

if TYPE_CHECKING:
    import pyarrow as pa

from . import liveness
from .context import Part, StageContext
from .rows import EarlierRows, HashRows, ImportRow, ScanRow, ScanRows


def scan_units(run_dir: Path, units: List[dict], cfg: dict):
    """Scan units by bytes; returns (scan rows, tensor rows, import rows).  Holds every unit's tensor rows as
    dicts: a caller that writes them (the scan stage) takes :func:`iter_scans` instead."""
    scans, tensors, imports = [], [], []
    for row, tens, imps in iter_scans(run_dir, units, cfg):
        scans.append(row)
        tensors.extend(tens.to_pylist())
        imports.extend(imps)
    return scans, tensors, imports


def iter_scans(run_dir: Path, units: List[dict], cfg: dict, facts=None
               ) -> Iterator[Tuple[dict, "pa.Table", List[dict]]]:
    """Per unit, in order: (its scan row, its tensors as a ``tensors`` table, its import rows).  A unit's
    TensorRows are dropped once they are columns, so memory follows one unit's tensors, not the part's.
    ``facts``: the hash stage's (:class:`ckptaudit.onepass.facts.ByteFacts`), or None (the bytes are read)."""
    from .. import layouts
    from ..layouts import leftovers

    for u in units:
        adapter = layouts.adapter_for(u)
        s = liveness.guard("scan", u, lambda: adapter.scan(run_dir, u, cfg, facts), lambda f: _scan_error(u, f))
        s.facts["unit_files"] = list(u["files"])
        s.facts["file_roles"] = _file_roles(u, s)
        for mf in u.get("missing_files", []):
            s.facts.setdefault("missing_files", []).append(mf)
        s.add(object_store_findings(u))
        said = {(f.kind, f.path) for f in s.findings}  # an adapter that met the path itself (an index's shard)
        for rel, why in sorted((u.get("irregular") or {}).items()):
            f = leftovers.irregular(rel, why)
            if (f.kind, f.path) not in said:
                s.add(f)
        if u.get("in_progress") and u["kind"] != "file" and not any(f.kind == "unit_in_progress" for f in s.findings):
            s.add(leftovers.in_progress(u["unit"], u["in_progress"]))
        row = s.row()
        tens = s.tensor_table_of_rows()
        if s.tensor_tables:  # a safetensors header's tensors came as a table (issue 45)
            import pyarrow as pa

            tens = pa.concat_tables([*s.tensor_tables, tens]) if s.tensors else pa.concat_tables(s.tensor_tables)
            s.tensor_tables.clear()
        s.tensors.clear()
        imps = [{"unit": u["unit"], **{k: i.get(k) for k in ("file", "member", "module", "name", "category",
                                                              "source", "add_safe")}} for i in s.imports]
        yield row, tens, imps


def _file_roles(u: dict, s) -> Dict[str, str]:
    """{file: role} of a unit's files (and of files its findings name), from its layout and producer."""
    from .. import producers, roles

    files = list(u["files"]) + [f.path for f in s.findings if f.path and f.path not in u["files"]]
    out = roles.roles_for(s.layout, files, s.facts)
    contract = producers.identify(s.layout, u["files"], s.tree)
    for f in files:
        r = producers.role_of(contract, f)
        if r is not None and (out.get(f) == "mixed" or r.loaded_by == "never"):
            out[f] = "metadata" if r.loaded_by == "never" else r.role
    return out


def _scan_error(u: dict, f):
    from ..layouts.base import UnitScan

    s = UnitScan(u["unit"], u.get("layout") or "")
    s.add(f)
    return s


def object_store_findings(u: dict):
    """Findings the inventory recorded from object storage (``u["object_store"]``, from
    ``inv["object_store"]`` that :func:`ckptaudit.stages.inventory.run_inventory` writes for ``s3://`` runs): multipart uploads that
    never completed under the unit's keys, and suspiciously small objects."""
    from .. import findings as F

    out = []
    osd = u.get("object_store") or {}
    for m in osd.get("multipart_uploads", []):
        out.append(F.make("incomplete_multipart_upload", path=m["key"], initiated=m.get("initiated", ""),
                          upload_id=m.get("upload_id", "")))
    for rel, n in sorted((osd.get("small_objects") or {}).items()):
        out.append(F.make("suspiciously_small_object", path=rel, size_bytes=n))
    return out


#: The kinds of the hash stage's facts the scan asks of them (:func:`ckptaudit.onepass.facts.load`).
FACT_KINDS = ("crc", "nul_run", "nul_scan", "nul_scan_run", "bytes")


def run(ctx: StageContext, part: Part, rows: EarlierRows) -> ScanRows:
    """The file and security layers of ``part``: each unit through its layout adapter.  The CRC32 of zip records
    comes from the hash stage's facts (``rows.hash``) where it has them; at a ``ctx.depth`` without
    ``tensor_bytes`` (:data:`ckptaudit.fs.read_depth.METADATA_ONLY`) no check streams tensor data.  Remote reads
    are served from the bytes the hash stage's pass kept.  Returns a row per unit, the part's tensors as one
    ``tensors`` table (a unit's tensor rows are columns once scanned) and its imports."""
    import pyarrow as pa

    from .. import tables

    facts = (rows.hash or HashRows(())).byte_facts(ctx.run_dir, ctx.depth, FACT_KINDS)
    osd = ctx.inventory.get("object_store") or {}
    units = [{**u, "object_store": osd[u["unit"]]} if u["unit"] in osd else u for u in part.units]
    scans, tensors, imports = [], [], []
    for row, tens, imps in iter_scans(ctx.run_dir, units, dict(ctx.config), facts):  # reads served from facts.kept
        scans.append(row)
        tensors.append(tens.cast(tables.SCHEMAS["tensors"]))
        imports.extend(imps)
    t = pa.concat_tables(tensors) if tensors else tables.SCHEMAS["tensors"].empty_table()
    # each row with every column of the table, as the next stages read it
    return ScanRows(tuple(ScanRow.of(r) for r in tables.rows_of(tables.table("scan", scans))), t,
                    tuple(ImportRow(**i) for i in imports))
