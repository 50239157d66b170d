"""Single-file units: torch.save zip, legacy torch.save, safetensors, Lightning ``.ckpt``.

Format facts: torch.save writes a zip archive since torch 1.6 (its first bytes
are the zip local-header magic ``PK\\x03\\x04``); earlier files start with a
pickled magic number (torch/serialization.py ``MAGIC_NUMBER``); safetensors
starts with an 8-byte little-endian header length followed by ``{``
(safetensors README, "Format").
"""

from __future__ import annotations

import struct
from pathlib import Path

from .. import fs, producers
from . import leftovers
from .adapter import NeverClaims
from .base import UnitScan, scan_file


def layout_of(path: Path) -> str:
    try:
        with fs.open_binary(path, exact=True) as fh:
            head = fh.read(16)
    except OSError:
        return "file"
    name = path.name.lower()
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        # a zip named as a producer's file unit (Lightning's .ckpt, Composer's ep1-ba10-rank0.pt, ultralytics'
        # weights/last.pt) comes as that producer's layout
        return producers.zip_layout(path.name, path.parent.name) or "torch-zip"
    if head.startswith(b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8"):
        return "torch-legacy"
    if len(head) >= 9 and name.endswith(".safetensors"):
        (n,) = struct.unpack("<Q", head[:8])
        if 0 < n < (100 << 20) and head[8:9] == b"{":
            return "safetensors"
    if name.endswith(".safetensors"):
        return "safetensors"
    return "file"


class SingleFile:
    name = "single-file"

    def claim_dir(self, path: Path) -> bool:
        return False

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], unit["layout"])
        if unit.get("in_progress"):
            scan.add(leftovers.in_progress(unit["unit"], unit["in_progress"]))
        rel = unit["files"][0]
        info = scan_file(run_dir, rel, unit["unit"], scan, cfg, tree_key="root", byte_facts=byte_facts)
        scan.facts["sniffed"] = info["kind"]
        return scan


class InProgressFolder(NeverClaims):
    """A folder whose name marks an unfinished save (``tmp-checkpoint-500``)."""

    name = "in-progress"

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], unit["layout"])
        scan.add(leftovers.in_progress(unit["unit"], unit.get("in_progress") or "temporary folder"))
        return scan


class Irregular(NeverClaims):
    """A path that is never opened (its findings come from the inventory's ``irregular`` map)."""

    name = "irregular"

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        return UnitScan(unit["unit"], unit["layout"])


ADAPTER = SingleFile()
IRREGULAR = Irregular()
IN_PROGRESS = InProgressFolder()
