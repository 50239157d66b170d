"""The file layer's zip check of a file whose structure bytes equal a clean file's: its records without a parse.

:func:`ckptaudit.formats.torchzip.check_zip` checks every central-directory entry of a torch zip: its local
header against it, its data descriptor, its CRC-32 (~1.5 ms of a 72-record file's scan).  A run's checkpoints of
one model hold the same records at the same offsets, and their central directories, local headers, data
descriptors and end records are equal byte for byte except for the CRC-32 fields and the archive folder
(:mod:`ckptaudit.onepass.zip_layouts`, which keeps one parse per layout and the byte ranges it read).

A file whose check found nothing is kept as a layout (:func:`keep`): every record placed, stored, its local header
agreeing and its CRC-32 verified.  A later file of the same size that matches it (:func:`follow`) — equal bytes
wherever the clean file's check read, outside the CRC fields and one archive folder of the same length used in
every name — gets that file's records with its own CRC-32s and folder, when also

* each of its data descriptors states its record's central-directory CRC-32 (the one comparison the check makes
  of a CRC field that a match leaves out: a layout is kept only where each CRC field is read as nothing else, a
  local header states no CRC or size, and each descriptor carries its signature;
  :func:`ckptaudit.onepass.zip_layouts.ZipLayouts.add`), and
* the hash stage's pass computed every record's CRC-32 over exactly the record's bytes of this file, and each
  equals the record's and covers its size (:meth:`ckptaudit.onepass.facts.ByteFacts.crcs_of`).

The check is a function of the bytes it reads, the file's size and those CRC-32s, so it would find nothing
either, and the same records.  Anything else (a CRC that fails, a fact missing) is checked record by record.
"""

from __future__ import annotations

from typing import List, Tuple


def follow(fh, rep) -> bool:
    """Give ``rep`` (a ``ZipReport``) the records and archive folder of the local file ``fh`` (an
    :class:`~ckptaudit.formats.zip.reader.ArchiveFile` read whole, with the hash stage's facts) from a clean file
    of its layout; False when none answers for it (then nothing is set)."""
    import numpy as np

    data = fh.whole_bytes()
    got = None if data is None or fh.facts is None else fh.facts.zip_layouts.match(data)
    if got is None or not got.descriptors_agree:
        return False
    members = got.payload
    usize = np.asarray(members.int_column("size_bytes"), np.int64)
    if ((got.crc == 0) & (usize > 0)).any():  # a CRC not recorded: the check says so record by record
        return False
    known = fh.facts.crcs_of(fh.path, np.asarray(members.int_column("data_offset"), np.int64),
                             np.asarray(members.int_column("compressed_size_bytes"), np.int64))
    if known is None or not ((known[0] == got.crc) & (known[1] == usize)).all():
        return False
    fh.facts.zip_layouts.hit()
    rep.members = members.of_another_file(got.crc, got.old_folder, got.folder)
    rep.prefix = got.folder.decode("ascii")
    return True


def keep(fh, cd_offset: int, reads: List[Tuple[int, int]], rep, clean: bool) -> None:
    """Keep the layout of the local file ``fh`` read whole, whose check read ``reads`` and gave ``rep``, when
    ``clean`` (no finding of its central directory or records) and every record is placed, stored, with an agreeing
    local header and a verified CRC-32."""
    import numpy as np

    data = fh.whole_bytes()
    m = rep.members
    if data is None or fh.facts is None or not clean or not len(m) or not rep.prefix:
        return
    flags = {k: m.column(k) for k in ("crc_ok", "header_ok", "complete")}
    data_offset = np.asarray(m.int_column("data_offset"), np.int64)
    if (data_offset < 0).any() or np.asarray(m.int_column("method")).any() or not all(
            (col == 1).all() for col in flags.values()):
        return
    prefix = rep.prefix.encode("utf-8", "surrogatepass")
    own = m.of_another_file(m.int_column("crc32"), prefix, prefix)  # a copy: the report's records may change
    fh.facts.zip_layouts.add(data, cd_offset, reads, data_offset,
                             np.asarray(m.int_column("compressed_size_bytes"), np.int64), rep.prefix, own)
