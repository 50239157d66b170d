"""Reading file bytes, local or remote: bounded reads of small metadata files, binary opens and batched ranged reads.

* **Small files.**  :func:`read_bounded` refuses what is not a regular file or is over its cap
  (:class:`TooLarge`, :data:`SMALL_FILE_BYTES`); :func:`loads_json` parses what it read.
* **Ranged reads.**  :func:`open_binary` is builtin ``open(p, "rb")`` locally and, remotely, an
  fsspec file with a ``readahead`` cache of ``block_size`` bytes (:func:`ckptaudit.fs.remote.open_object`);
  :func:`read_ranges` fetches scattered ranges of one object concurrently.  Remote bytes are
  counted in :mod:`ckptaudit.fs.counters`.  Each remote read takes ``kept=``: the bytes an earlier stage's
  pass kept (:class:`ckptaudit.fs.kept.KeptBytes`, or None), served from memory instead of fetched.
"""

from __future__ import annotations

import io
import os
import re
from typing import List, Optional, Tuple

from . import kept as kept_mod
from .counters import count, count_local
from .remote import RANGE_BLOCK_BYTES, as_rpath, split_url, filesystem, is_remote, open_object

SMALL_FILE_BYTES = 16 << 20  # cap for sidecars, manifests, pointers, indexes, trainer_state.json

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class TooLarge(OSError):
    """A small metadata file (sidecar, manifest, pointer, index) that is larger than its cap."""


def loads_json(data, **kw):
    """``json.loads`` for a file from the run: nesting too deep for the parser is a ``ValueError`` too.

    CPython's decoder recurses once per ``[``/``{``, so 100,000 opening brackets (a few hundred KiB,
    well under any size cap) raise ``RecursionError``; callers already treat ``ValueError`` as
    "not valid JSON" (as they do an integer of more than 4300 digits, which ``json`` refuses with a
    ``ValueError``).  A lone surrogate escape (``"\\ud800"``, valid JSON) becomes U+FFFD: such a
    string cannot be written as UTF-8 to the tables or the report (see :func:`without_lone_surrogates`).
    """
    import json

    try:
        obj = json.loads(data, **kw)
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None
    if (b"\\u" if isinstance(data, (bytes, bytearray)) else "\\u") in data:
        obj = without_lone_surrogates(obj)
    return obj


def clean_text(s: str) -> str:
    """``s`` with every lone surrogate (U+D800..U+DFFF) replaced by U+FFFD."""
    return s if s.isascii() else _LONE_SURROGATE.sub("\ufffd", s)


def without_lone_surrogates(obj):
    """A parsed JSON value (or walked pickle strings) with lone surrogates in strings and keys made U+FFFD.

    JSON's ``\\udXXX`` escapes and pickle's ``surrogatepass`` strings can hold code points that no
    UTF-8 encoder accepts, so a name from a damaged (or merely odd) file would stop the audit when its
    tables or report are written.  Containers are edited in place (iteratively: no recursion limit);
    key order is kept."""
    if isinstance(obj, str):
        return clean_text(obj)
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            if any(type(k) is str and not k.isascii() and _LONE_SURROGATE.search(k) for k in o):
                items = list(o.items())
                o.clear()
                o.update((clean_text(k) if type(k) is str else k, v) for k, v in items)
            _clean_values(o, o.items(), stack)
        elif isinstance(o, list):
            _clean_values(o, enumerate(o), stack)
    return obj


def _clean_values(o, pairs, stack: list) -> None:
    """Strings among the values of container ``o`` (``pairs``: its (key or index, value)) cleaned in place;
    containers among them pushed on ``stack``."""
    for k, v in pairs:  # assigning to an existing key does not change a dict's size while iterating
        if type(v) is str:
            o[k] = clean_text(v)
        elif isinstance(v, (dict, list)):
            stack.append(v)


def read_bounded(p, limit: int, *, kept: Optional[kept_mod.KeptBytes] = None) -> bytes:
    """The bytes of a small metadata file, refusing what is not a regular file or is over ``limit`` bytes.

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` before any read, so a FIFO,
    a device or a sparse giant named like a sidecar never blocks or floods memory.
    Raises ``OSError`` (``TooLarge`` for a file over the cap).  Remote paths are read
    with a ranged read of ``limit + 1`` bytes (:func:`read_ranges`, answered from ``kept`` first).
    """
    import stat

    if is_remote(p):
        if as_rpath(p).info()["size"] > limit:
            raise TooLarge(f"{p}: over {limit} bytes")
        data = read_ranges(p, [(0, limit + 1)], kept=kept)[0]
        if data is None:
            raise OSError(f"{p}: ranged read failed")
        if len(data) > limit:
            raise TooLarge(f"{p}: over {limit} bytes")
        return data
    fd = os.open(str(p), os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{p}: not a regular file")
        if st.st_size > limit:
            raise TooLarge(f"{p}: {st.st_size} bytes, over the {limit}-byte cap")
        chunks, left = [], limit + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        data = b"".join(chunks)
        if len(data) > limit:
            raise TooLarge(f"{p}: grew past the {limit}-byte cap while read")
        return data
    finally:
        os.close(fd)


def open_binary(p, block_size: int = RANGE_BLOCK_BYTES, exact: bool = False, cache_type: str = "", *,
                kept: Optional[kept_mod.KeptBytes] = None):
    """Open for reading bytes.  Local: builtin ``open(p, "rb")``.  Remote: an fsspec
    file whose reads are ranged GETs of about ``block_size`` bytes (readahead cache),
    counted in :func:`bytes_read` (as "streamed" when ``block_size`` >= 1 MiB:
    hashing, CRC verification, the value scan, downloads; else as "ranged").  With ``exact``
    each read is one GET of exactly the bytes asked for (no readahead): for callers that
    read known ranges (zip records, tensor values) at scattered offsets.  ``cache_type``
    overrides fsspec's cache (e.g. "blockcache": an LRU of 32 blocks of ``block_size``).  ``kept``: bytes
    of the object already read (:class:`ckptaudit.fs.kept.KeptBytes`), which the file answers from for its
    life instead of fetching them (None: every read is fetched; local files ignore it).  Raises ``OSError``
    (FileNotFoundError) when absent."""
    if not is_remote(p):
        return io.BufferedReader(CountedFile(p), buffer_size=io.DEFAULT_BUFFER_SIZE)
    return open_object(as_rpath(p), block_size=block_size, exact=exact, cache_type=cache_type, kept=kept)


class CountedFile(io.FileIO):
    """A local file opened for reading whose every byte read is counted (:func:`ckptaudit.fs.counters.count_local`)."""

    def __init__(self, p) -> None:
        super().__init__(os.fspath(p), "rb")

    def readinto(self, b) -> int:
        n = super().readinto(b)
        count_local(n or 0)
        return n

    def readall(self) -> bytes:
        data = super().readall()
        count_local(len(data))
        return data

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        count_local(len(data or b""))
        return data


def pread(fd: int, n: int, off: int) -> bytes:
    """``os.pread`` of a local audited file, counted."""
    data = os.pread(fd, n, off)
    count_local(len(data))
    return data


def preadv(fd: int, views, off: int) -> int:
    """``os.preadv`` of a local audited file, counted."""
    n = os.preadv(fd, views, off)
    count_local(n)
    return n


def read_ranges(p, ranges: List[Tuple[int, int]], purpose: str = "ranged", *,
                kept: Optional[kept_mod.KeptBytes] = None) -> List[Optional[bytes]]:
    """Bytes of each ``(offset, length)`` of remote object ``p``, fetched concurrently
    (fsspec ``cat_ranges``: s3fs issues the ranged GETs together, in batches of fsspec's
    ``gather_batch_size``), so N scattered small reads cost about one round trip rather
    than N.  A range that failed is None (the caller reads it again on its own).  Counted
    in :func:`bytes_read` / :func:`gets_issued` as ``purpose`` ("ranged"; the one-pass reader's
    whole-object ranges are "streamed").  Bytes an earlier stage's pass kept (``kept``: a
    :class:`ckptaudit.fs.kept.KeptBytes`, or None) are served from memory and only the gaps fetched.  Local
    paths raise ``ValueError``: read them with ``os.pread``."""
    if not is_remote(p):
        raise ValueError(f"{p}: read_ranges is for remote objects")
    if not ranges:
        return []
    url = as_rpath(p).url
    if kept is not None and kept.has(url):  # bytes the hash stage's pass already read: only the gaps are fetched
        return _with_kept(p, url, ranges, purpose, kept)
    return read_ranges_uncached(p, ranges, purpose)


def _with_kept(p, url: str, ranges: List[Tuple[int, int]], purpose: str, k: kept_mod.KeptBytes
               ) -> List[Optional[bytes]]:
    """:func:`read_ranges` where part of the object is kept (``k``): one batch of GETs for the gaps."""
    split = [k.pieces(url, int(o), int(o) + int(n)) for o, n in ranges]
    gaps = [(o, n) for parts in split for o, n, b in parts if b is None]
    fetched = dict(zip(gaps, read_ranges_uncached(p, gaps, purpose))) if gaps else {}
    out: List[Optional[bytes]] = []
    for parts in split:
        blobs = [b if b is not None else fetched.get((o, n)) for o, n, b in parts]
        if any(b is None for b in blobs):
            out.append(None)
            continue
        kept_mod.served(sum(len(b) for (_, _, kb), b in zip(parts, blobs) if kb is not None))
        out.append(b"".join(blobs))
    return out


def read_ranges_uncached(p, ranges: List[Tuple[int, int]], purpose: str = "ranged") -> List[Optional[bytes]]:
    """:func:`read_ranges` without the kept bytes: every range is fetched."""
    proto, key = split_url(as_rpath(p).url)
    fsys = filesystem(proto)
    starts = [int(o) for o, _ in ranges]
    ends = [int(o) + int(n) for o, n in ranges]
    try:
        blobs = fsys.cat_ranges([key] * len(ranges), starts, ends, on_error="return")
    except TypeError:  # an fsspec implementation without on_error
        blobs = fsys.cat_ranges([key] * len(ranges), starts, ends)
    out: List[Optional[bytes]] = []
    got = 0
    for b in blobs:
        ok = isinstance(b, (bytes, bytearray))
        out.append(bytes(b) if ok else None)
        got += len(b) if ok else 0
    count(purpose, got, len(ranges))
    return out
