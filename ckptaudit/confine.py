"""Confinement: every path a run names must stay inside the run folder, or it is a finding and never opened.

A run names paths in many places: the shards of a Hugging Face ``model.safetensors.index.json``, the tag in
DeepSpeed's ``latest``, Megatron's tracker, ``latest`` files and symbolic links, Lightning's ``last.ckpt``
link, files inside a unit folder.  Each is resolved as the framework's loader would resolve it (joined to the
folder of the file that names it — transformers ``os.path.join``s the index's folder and the shard name;
DeepSpeed joins the load directory and the tag read from ``latest``), then with every symbolic link followed
at any depth (:func:`os.path.realpath`), and must land inside the run folder's own real path.  Otherwise the
audit never opens it and reports ``path_outside_run`` (:func:`path_outside_run`), naming the path and where
it points: a resume would read a file the run does not hold, and the audit reads what the run holds, not
``/etc/shadow``.

Only names are resolved here (``realpath`` walks the links with ``lstat``/``readlink``): the outside file's
bytes, and its access time, are never touched.  In object storage there are no links; a name that leaves
the prefix (``..`` or an absolute key) is outside by its text.
"""

from __future__ import annotations

import os
import posixpath
from typing import Optional

from . import findings as F
from . import fs

#: How :func:`ckptaudit.discovery.irregular.irregular_reason` words a link out of the run; it becomes ``path_outside_run``.
OUTSIDE_WORDS = "it points outside the run folder"
#: What :func:`ckptaudit.discovery._resolve_pointer` appends to a text pointer's kind, before the outside path.
POINTER_OUTSIDE = ", names a path outside the run: "


def resolved_outside(root, named: str, base: str = "") -> Optional[str]:
    """Where ``named`` resolves when that is outside ``root``, else None.

    ``named`` is a path as a run file writes it (relative to the folder ``base``, itself relative to ``root``;
    an absolute ``named`` stays absolute, as :func:`os.path.join` keeps it).  Returns the resolved real path
    (local) or the normalised key (object storage)."""
    if fs.is_remote(root):
        key = posixpath.normpath(posixpath.join(base or ".", named)) if not named.startswith("/") else named
        return None if not (key == ".." or key.startswith(("../", "/"))) else key
    top = os.path.realpath(root)
    real = os.path.realpath(os.path.join(str(root), base, named))
    if real == top or real.startswith(top.rstrip(os.sep) + os.sep):
        return None
    return real


def path_outside_run(path: str, named: str, target: str, reads: str) -> F.Finding:
    """``path_outside_run``: ``path`` (a file or pointer of the run) names ``named``, which resolves to ``target``
    outside the run folder; ``reads``: what a resume would do with it.  Decided by :func:`resolved_outside`,
    called by :func:`ckptaudit.layouts.hf.check_index` (index shards), :func:`ckptaudit.discovery._resolve_pointer`
    (``latest``, trackers and links, judged in :func:`ckptaudit.pointer_judgements.judge`),
    :func:`ckptaudit.layouts.leftovers.irregular` (a link inside a unit folder, to a file or a folder),
    :func:`ckptaudit.stages.hash.hash_unit` (a sidecar or manifest that is a link, the names they list) and
    :meth:`ckptaudit.layouts.dcp.DCP.scan` (``.metadata`` storage paths)."""
    return F.make("path_outside_run", path=path, named=named, target=target, reads=reads)


__all__ = ["OUTSIDE_WORDS", "POINTER_OUTSIDE", "resolved_outside", "path_outside_run"]
