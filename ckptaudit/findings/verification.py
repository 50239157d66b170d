"""The finding kinds of re-verification over time: a file's bytes compared with its last verification's digest.

Data only, as :mod:`.file` (whose layer they share): each entry names its ``stage`` and its ``detector``.  They
come from :mod:`ckptaudit.verification.ledger`, which keeps each unit's last verification in the output folder.
"""

from __future__ import annotations

from typing import List

from .model import Kind as _k

ENTRIES: List[_k] = [
    _k("digest_changed_unseen", "file", "error", "none",
       "{path}: its digest is {actual} but was {expected} when its bytes were last verified ({verified_utc}), "
       "and its size, mtime, ctime, inode and device are unchanged: the bytes changed below the file system "
       "(media bit rot, a disk, controller or RAID layer returning other bytes, a block device written directly).",
       "Do not use it; roll back to the newest checkpoint whose bytes verify, restore {path} from a copy, and "
       "check the storage (SMART, scrub, controller logs).",
       stage="hash", detector="ckptaudit.verification.ledger:digest_changed"),
]
