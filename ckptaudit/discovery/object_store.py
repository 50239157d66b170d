"""Object-storage facts of a run's units (``s3://``): each object's size and ETag, uploads that never completed, small objects.

The inventory (:func:`ckptaudit.stages.inventory.run_inventory`) records them as ``inv["object_store"]``: the part
signature carries the sizes and ETags (a replaced object re-runs its part), and the scan stage makes the
``incomplete_multipart_upload`` and ``suspiciously_small_object`` findings of them
(:func:`ckptaudit.stages.scan.object_store_findings`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from .. import fs, layouts
from ..units import Unit, step_from_name

SMALL_OBJECT_BYTES = 1024  # a checkpoint-named object of 1 to 1023 bytes is suspicious (0 is empty_file)


def unit_objects(run_dir, units: List[Unit]) -> Dict[str, dict]:
    """Object-storage facts per unit of an ``s3://`` run: ``objects`` {file: [size bytes, ETag]}
    (the part signature, so a replaced object re-runs its part), ``multipart_uploads`` that never
    completed under the unit's keys, ``small_objects`` {file: size bytes}.

    An unfinished upload whose key belongs to no unit becomes a unit of its own (layout
    ``in-progress``, no files): a save that never completed.  ``units`` is changed in place.
    """
    root = fs.path(run_dir)
    out: Dict[str, dict] = {}
    for u in units:
        d = out.setdefault(u.unit, {"objects": {}, "multipart_uploads": [], "small_objects": {}})
        data_files = set(u.files)  # looked up per object: a set, so a folder of many objects stays linear
        for f in u.files + u.sidecars + ([u.manifest] if u.manifest else []):
            try:
                info = (root / f).info()
            except OSError:
                continue
            d["objects"][f] = [info["size"], info["etag"]]
            if f in data_files and 0 < info["size"] < SMALL_OBJECT_BYTES and layouts.is_checkpoint_file(Path(f).name):
                d["small_objects"][f] = info["size"]
    for m in fs.multipart_uploads(run_dir):
        key = m["key"]
        owner = next((u for u in units if key in u.files or key == u.unit or key.startswith(u.unit.rstrip("/") + "/")
                      or u.unit == "."), None)
        if owner is None:
            owner = Unit(unit=key, layout="in-progress", kind="file", files=[], size_bytes=0, mtime_ns=0,
                         step_from_name=step_from_name(Path(key).name),
                         in_progress="multipart upload started but never completed (no object exists)")
            units.append(owner)
            out[key] = {"objects": {}, "multipart_uploads": [], "small_objects": {}}
        out[owner.unit]["multipart_uploads"].append(m)
    units.sort(key=lambda u: (u.step_from_name if u.step_from_name is not None else -1, u.unit))
    return {k: v for k, v in out.items() if v["objects"] or v["multipart_uploads"]}
