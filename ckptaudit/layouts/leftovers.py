"""What a unit holds besides checkpoint data: the one builder each of unit_in_progress, not_a_regular_file, file_unreadable.

The inventory names irregular files (:func:`ckptaudit.inventory.irregular_reason`) and in-progress saves
(``in_progress``); the adapters find temporary leftovers (DCP's ``.metadata.tmp``, an HF write-then-rename
temp file, a ``tmp-checkpoint-*`` folder) and a folder under a shard's name.  They decide; these build.
"""

from __future__ import annotations

from .. import findings as F
from ..findings import Finding

#: :func:`ckptaudit.inventory.irregular_reason` of a regular file this process may not read (mode 000,
#: another owner): :func:`irregular` makes it ``file_unreadable``; any other reason is ``not_a_regular_file``.
UNREADABLE = "permission denied"


def in_progress(path: str, why: str) -> Finding:
    """``unit_in_progress``: ``path`` is a save that never finished (``why``: what was left over)."""
    return F.make("unit_in_progress", path=path, why=why)


def irregular(path: str, why: str) -> Finding:
    """The finding for a file the audit does not open: ``file_unreadable`` when ``why`` is :data:`UNREADABLE`,
    else ``not_a_regular_file`` (a FIFO, a device, a link out of the run, a folder under a file's name...)."""
    if why == UNREADABLE:
        return F.make("file_unreadable", path=path, why=why)
    return F.make("not_a_regular_file", path=path, why=why)
