"""The finding of a torch zip record whose bytes fail their CRC32 (``zip_crc_mismatch``), naming the tensors it holds.

``torchzip._verify_member`` (archives with a central directory, the CRC from :mod:`.crc`) and the local
walk of a cut archive (:func:`ckptaudit.formats.zip.cut.walk_local`) decide that a record fails;
:func:`crc_mismatch` is the one place the finding is built.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional, Sequence, Tuple

from ... import findings
from ...findings import Finding


def crc_mismatch(display: str, member: str, expected: str, actual: str, prefix: str = "",
                 tensors: Optional[Mapping[str, Sequence[str]]] = None,
                 nul_run: Optional[Tuple[int, int]] = None) -> Finding:
    """``zip_crc_mismatch``: record ``member`` of the file shown as ``display`` stores CRC ``expected`` but
    its bytes give ``actual``.

    ``tensors``: storage key -> names of the tensors it holds (from the walk of data.pkl); a storage
    record ``<prefix>/data/<key>`` names up to three of them, else the storage key alone.  ``nul_run``:
    ``(offset, length)`` of the record's longest run of NUL bytes, said as a fact to compare, never as the
    cause: zeros are also genuine values (AdamW moments of embedding rows no batch touched are zero in every
    checkpoint of a run), and the CRC mismatch is the evidence (``detail["longest_nul_run"]``).
    """
    key = member.rsplit("/", 1)[-1] if f"{prefix}/data/" in member else None
    names = list((tensors or {}).get(key or "", []))
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        text = f"; it holds {shown}"
    else:
        mm = re.search(r"(?:^|/)data/(\w+)$", member)
        text = f" (the bytes of storage {mm.group(1)})" if mm else ""
    zeros = ""
    if nul_run:
        zeros = (f" (its longest run of NUL bytes, {nul_run[1]} at offset {nul_run[0]}, may be genuine zeros or the "
                 "damage: compare that range with an older checkpoint)")
    f = findings.make("zip_crc_mismatch", path=display, member=member, expected=expected, actual=actual,
                      tensor_text=text, zeros_text=zeros)
    if nul_run:
        f.detail["longest_nul_run"] = [int(nul_run[0]), int(nul_run[1])]
    return f
