"""One file's pass: plan it, feed every byte once to its consumers, return the facts (digests, CRCs, value stats).

With a whole-file digest wanted (SHA-256, or the audit's own :data:`ckptaudit.formats.digest_purpose.FAST_DIGEST`) the
file is one stream (both are serial over the file; the other consumers of each buffer run beside it on a second
thread, and BLAKE3 splits each buffer over threads itself).  Without it (a manifest with chunk digests
implies the whole-file digest) a big file is split into segments on chunk boundaries, each
streamed by its own thread with its own consumers, merged at the end.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .. import fs
from .consumers import (ChunkDigest, FastDigest, KeepBytes, RangeAllNulRuns, RangeCrc32, RangeNulRuns, RangeValues,
                        Sha256, split_points)
from .plan import DTYPES, Plan, plan_file
from . import at_once, stream
from .stream import BUFFER_BYTES, run


@dataclass
class FileFacts:
    """What one pass computed, as columns aligned with the plan's ranges (no Python object per range):
    ``crc_member``/``crc_range`` the plan's CRC ranges with ``crc_value`` ``(n, 2)`` ``[crc32, bytes seen]`` and,
    of a remote object only, ``nul_run`` ``(n, 2)`` ``[offset or -1, length]`` of each record's longest NUL run
    (None for a local file: see :func:`_consumers`); ``values_range``/
    ``values_dtype`` the plan's value ranges with ``values_nonfinite``, ``values_sum_squares`` and
    ``values_seen`` (non-finite count, Σx² of the finite values, bytes seen); ``nul_scans``
    {(start, length, min_run): [(offset, length), ...] or None}; ``sha256_hex`` "" when not computed;
    ``fast_hex`` the :data:`~ckptaudit.formats.digest_purpose.FAST_DIGEST` of the whole file, "" when not computed;
    ``chunk_hex`` the chunk digests (``chunk_algorithm``), None when not asked for; ``bytes_read``: bytes the
    pass itself read (the plan's small
    reads are counted by ``fs``); ``version``: :func:`ckptaudit.fs.version`'s tag of the file as the pass found
    it; ``tensor_data_range``: the plan's ``(offset, length)`` of bytes that only hold tensor data; ``kept``:
    ``(offset, bytes)`` of a remote object that later stages will read again (:func:`keep_ranges`), else empty.
    ``crc``, ``values`` and ``tensor_data`` give the same as dicts and lists (small files, tests)."""

    size_bytes: int
    version: str = ""
    sha256_hex: str = ""
    fast_hex: str = ""
    chunk_hex: Optional[List[str]] = None
    plan: Plan = field(default_factory=Plan)
    crc_value: object = None
    nul_run: object = None
    values_nonfinite: object = None
    values_sum_squares: object = None
    values_seen: object = None
    nul_scans: Dict[Tuple[int, int, int], Optional[List[Tuple[int, int]]]] = field(default_factory=dict)
    bytes_read: int = 0
    seconds: float = 0.0
    kept: List[Tuple[int, bytes]] = field(default_factory=list)

    @property
    def crc(self) -> Dict[Tuple[str, int, int], Tuple[int, int]]:
        """{(member, data offset, length): (crc32, bytes seen)}."""
        return {k: (int(c), int(n)) for k, (c, n) in zip(self.plan.crc, self.crc_value)} \
            if self.crc_value is not None else {}

    @property
    def values(self) -> Dict[Tuple[int, int, str], Tuple[int, float, int]]:
        """{(data offset, nbytes, dtype): (non-finite count, Σx², bytes seen)}."""
        if self.values_seen is None:
            return {}
        return {k: (int(b), float(q), int(n)) for k, b, q, n in zip(
            self.plan.values, self.values_nonfinite, self.values_sum_squares, self.values_seen)}

    @property
    def tensor_data(self) -> List[Tuple[int, int]]:
        """``(offset, length)`` of each run of tensor data."""
        return self.plan.tensor_data


#: A local file up to this many bytes is read whole with one read and its consumers run in turn, not on
#: threads: for a small file the threads of a streamed pass cost more than its bytes (issue 22: a 1.6 KB
#: DCP rank file took ~5 ms, 1.3 ms read whole).
SMALL_LOCAL_BYTES = 1 << 20
#: Tensor data shorter than this (bytes) is kept with the rest of a remote object: a later stage reads the
#: values of small tensors (a step counter, a scalar learning rate) and the windows around record headers.
KEEP_TENSOR_DATA_UNDER = 64 << 10
#: At most this many bytes of one remote object are kept, the first in file order (headers, data.pkl); past
#: it, a later stage fetches what it reads, as before.  Memory: ``onepass.at_once.PASSES_AT_ONCE`` times this.
KEEP_REMOTE_BYTES = 16 << 20


def keep_ranges(size: int, tensor_data) -> List[Tuple[None, int, int]]:
    """The ranges ``(None, start, length)`` of a remote object of ``size`` bytes that the pass keeps for later
    stages (:mod:`ckptaudit.fs.kept`): every byte outside the runs of tensor data of at least
    :data:`KEEP_TENSOR_DATA_UNDER` bytes, the first :data:`KEEP_REMOTE_BYTES` of them.  With no tensor data
    planned (a damaged archive, another format) that is the whole object, when it fits."""
    skip = sorted((int(o), int(n)) for o, n in tensor_data if n >= KEEP_TENSOR_DATA_UNDER)
    out, at, left = [], 0, KEEP_REMOTE_BYTES
    for o, n in skip + [(size, 0)]:
        if o > at and left > 0:
            k = min(o - at, left)
            out.append((None, at, k))
            left -= k
        at = max(at, o + n)
    if not skip and size > KEEP_REMOTE_BYTES:
        return []  # nothing planned and too big to keep: the later stages read it themselves
    return out


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _read_whole(path, size: int) -> bytes:
    """The first ``size`` bytes of local file ``path`` (fewer when it is shorter now), in one counted read."""
    fd = os.open(fs.fspath(path), os.O_RDONLY)
    try:
        return fs.pread(fd, size, 0)
    finally:
        os.close(fd)


def pass_file(path, *, whole_sha: bool = True, chunk_bytes: Optional[int] = None, chunk_algorithm: str = "sha256",
              threads: Optional[int] = None, plan: Optional[Plan] = None, progress=None,
              stop: Optional[threading.Event] = None, dcp_places: Optional[dict] = None,
              fast_digest: bool = False, templates=None) -> FileFacts:
    """Read ``path`` once and compute every fact of it: the whole-file SHA-256 when ``whole_sha``, the whole-file
    :data:`~ckptaudit.formats.digest_purpose.FAST_DIGEST` when ``fast_digest``, the chunk digests of ``chunk_bytes`` slices
    with ``chunk_algorithm`` (:mod:`ckptaudit.formats.chunk_digest`) when ``chunk_bytes`` is given; ``progress`` (a
    consumer, e.g. :class:`~.consumers.Progress`) is fed too.  ``stop``: set, the pass stops at its next buffer
    (:class:`~.stream.PassStopped`); ``dcp_places``: a DCP data file's folder places
    (:func:`~.plan_dcp.unit_places`), for its plan; ``templates``: the job's data.pkl shapes
    (:class:`~.pickle_templates.PickleTemplates`), for its plan.  Raises ``OSError`` when it cannot be read."""
    size, version = fs.version(path)
    data = None
    if plan is None and fs.is_remote(path) and size <= stream.SMALL_REMOTE_BYTES:
        data = stream.fetch(path, size)  # one round of GETs; the plan is made from these bytes
    elif size <= SMALL_LOCAL_BYTES and not fs.is_remote(path):
        data = _read_whole(path, size)  # one read; the plan is made from these bytes
    serial = data is not None and not fs.is_remote(path)
    plan = plan_file(path, data, dcp_places, templates=templates) if plan is None else plan
    threads = max(1, threads or _cores())
    keep = keep_ranges(size, plan.tensor_data_range) if fs.is_remote(path) else []
    out = FileFacts(size_bytes=size, version=version, plan=plan)
    segments = split_points(size, threads, chunk_bytes or BUFFER_BYTES) \
        if data is None and not (whole_sha or fast_digest) and threads > 1 and size > 2 * BUFFER_BYTES else [(0, size)]
    parts = []
    # one segment: the whole-file digest, CRC32 and the value statistics of a buffer side by side; else one thread a segment
    with ThreadPoolExecutor(max_workers=max(3, len(segments))) as pool:
        def one(seg):
            cons = _consumers(plan, seg[0], (chunk_bytes, chunk_algorithm), (whole_sha, fast_digest), keep,
                              record_nul_runs=fs.is_remote(path))
            live = list(cons.values()) + ([progress] if progress is not None else [])
            if data is not None:
                n = stream.feed_bytes(data, live, None if serial else pool)
            elif len(segments) == 1:  # the digest beside the rest while a core would otherwise idle
                n = run(path, live, seg[0], seg[1], pool=pool, stop=stop, spread=lambda: at_once.spread(threads))
            else:  # one thread per segment: its consumers take turns
                n = run(path, live, seg[0], seg[1], stop=stop)
            return cons, n

        if len(segments) > 1:
            parts = list(pool.map(one, segments))
        else:
            parts = [one(segments[0])]
    cons = parts[0][0]
    out.bytes_read = sum(n for _, n in parts)
    for other, _ in parts[1:]:  # the segments' range consumers into the first's (a whole digest is never split)
        _merge(cons, other)
    if "sha" in cons:
        out.sha256_hex = cons["sha"].hexdigest()
    if "fast" in cons:
        out.fast_hex = cons["fast"].hexdigest()
    if "chunks" in cons:  # segments end on chunk boundaries: only the last one has a short chunk
        out.chunk_hex = [d for c, _ in parts for d in c["chunks"].finish()]
    del parts
    return _collect(out, cons)


def _consumers(plan: Plan, seg_start: int, chunks: Tuple[Optional[int], str], whole: Tuple[bool, bool],
               keep: list, record_nul_runs: bool = False) -> dict:
    """The consumers one segment from ``seg_start`` feeds, by name: the plan's CRC32 ranges, its value ranges,
    the manifest's chunk digests (``chunks``: bytes per chunk or None, the hash), the whole SHA-256 and the whole
    fast digest (``whole``: whether each is wanted), the bytes to keep, the NUL scans, and with
    ``record_nul_runs`` each zip record's longest NUL run.

    That run is told only with a record whose CRC fails (:func:`ckptaudit.formats.zip.crc.longest_zero_run`).
    Of a local file the pass does not look for it: that record is read again, and looking in every record cost
    0.05 CPU-s per GiB beside SHA-256's 0.6 (docs/benchmarks-history.md, issue 45), every night, for a fact
    that one damaged record in many needs.  Of a remote object it does: reading a record again is a GET
    (issue 15: the whole audit fetches each object byte about once), and the pass waits on the network, not
    on a core."""
    has_crc, has_values = len(plan.crc_range) > 0, len(plan.values_range) > 0
    crc_cols = dict(starts=plan.crc_range[:, 0], lengths=plan.crc_range[:, 1])
    cons = {"crc": RangeCrc32(**crc_cols) if has_crc else None,
            "values": RangeValues(starts=plan.values_range[:, 0], lengths=plan.values_range[:, 1],
                                  dtypes=plan.values_dtype, dtype_names=DTYPES) if has_values else None,
            "chunks": ChunkDigest(chunks[0], seg_start, chunks[1]) if chunks[0] else None,
            "sha": Sha256() if whole[0] else None,
            "fast": FastDigest() if whole[1] else None,
            "kept": KeepBytes(keep) if keep else None,
            "nul_runs": RangeNulRuns(**crc_cols) if has_crc and record_nul_runs else None}
    cons.update({("nul_scan", k): RangeAllNulRuns([((o, n, m), o, n)], m)
                 for k, (o, n, m) in enumerate(plan.nul_scans)})
    return {k: c for k, c in cons.items() if c is not None}


def _merge(cons: dict, other: dict) -> None:
    """A later segment's range consumers (``other``) into the first segment's (``cons``), in place."""
    for k, c in cons.items():
        if hasattr(c, "merge"):
            c.merge(other[k])


def _collect(out: FileFacts, cons: dict) -> FileFacts:
    """The consumers' results into ``out``'s columns."""
    import numpy as np

    if "crc" in cons:
        out.crc_value = np.stack(cons["crc"].arrays(), axis=1)
    if "nul_runs" in cons:
        out.nul_run = np.stack(cons["nul_runs"].arrays(), axis=1)
    if "values" in cons:
        out.values_nonfinite, out.values_sum_squares, out.values_seen = cons["values"].arrays()
    out.kept = cons["kept"].results() if "kept" in cons else []
    for k, c in cons.items():
        if isinstance(k, tuple):
            out.nul_scans.update(c.results())
    return out
