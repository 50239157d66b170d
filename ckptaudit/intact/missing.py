"""The files a folder unit should hold and does not, as the audit's own layout scan names them.

Without a manifest, only the framework's layout knows that a file is gone: DeepSpeed's model states name the
data-parallel world size, so a rank without its ``zero_pp_rank_<r>_…_optim_states.pt`` is missing
(``ds_rank_files_missing``); a DCP ``.metadata`` names every ``.distcp`` file (``dcp_shard_missing``).  Salvage
asks the adapter that scans the unit in an audit (:func:`ckptaudit.layouts.adapter_for`) and reports those files,
so that the tensors they held count as lost.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

#: the scan findings that name a file of the unit that is not there, and the detail key holding it
MISSING_KINDS = {"ds_rank_files_missing": "path", "dcp_shard_missing": "file", "manifest_file_missing": "path"}


def missing_files(run_dir: Path, unit: Path, cfg: dict) -> List[Tuple[str, str]]:
    """``[(file, the finding's message)]`` for the files of folder ``unit`` that its layout says are missing;
    ``[]`` when the run's inventory does not list the unit."""
    from ..discovery import discover
    from ..layouts import adapter_for

    rel = unit.resolve().relative_to(run_dir.resolve()).as_posix() or "."
    units, _, _ = discover(run_dir)
    u = next((x.to_dict() for x in units if x.unit == rel), None)
    if u is None or u["kind"] != "folder":
        return []
    scan = adapter_for(u).scan(run_dir, u, cfg)
    out = []
    for f in scan.findings:
        key = MISSING_KINDS.get(f.kind)
        if key is None:
            continue
        name = str(f.detail.get(key) or (f.path if key == "path" else ""))
        if f.kind != "dcp_shard_missing" and name.startswith(rel + "/"):
            name = name[len(rel) + 1:]
        out.append((name, f.message))
    return out
