"""A tiny file layer over local folders and object storage (``s3://bucket/prefix``).

Local paths go to the builtin ``open``/``os.stat`` unchanged.  A remote run folder
is reached through fsspec/s3fs and represented by :class:`RPath`, a small
``pathlib``-like object (``/``, ``name``, ``parent``, ``exists()``, ``is_dir()``,
``stat()``, ``iterdir()``, ``read_bytes()``, ``read_text()``) so the layout
adapters and byte checkers keep their code; they call :func:`open_binary` and
:func:`size` instead of ``open(path, "rb")`` and ``os.path.getsize``.

* **Listing.**  The first look at a remote run lists every object under the
  prefix once (``ListObjectsV2``: key, size in bytes, ETag, LastModified) and
  answers ``exists``/``stat``/``iterdir`` from that snapshot; folders are the
  keys' common prefixes.  :func:`refresh` re-lists (inventory does, per audit).
* **Ranged reads.**  :func:`open_binary` returns an fsspec file with a
  ``readahead`` cache of ``block_size`` bytes (default :data:`RANGE_BLOCK_BYTES`),
  so a seek + read is one ranged ``GET`` of about ``block_size`` bytes: reading a
  zip central directory, a safetensors header or a DCP ``.metadata`` does not
  download the object.  Hashing opens with :data:`STREAM_BLOCK_BYTES` and streams.
* **Bytes read.**  Every remote byte fetched is counted; :func:`bytes_read`
  returns the count of this process (tests and ``benchmarks/bench_s3.py``).
* **Credentials.**  From the standard AWS chain (``AWS_ACCESS_KEY_ID``/
  ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws/config``, instance roles),
  endpoint from ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``; the audit config's
  ``s3:`` block (``endpoint_url``, ``profile``, ``anon``) overrides endpoint and
  profile.  Keys are never read, stored or logged here: botocore reads them.

The package, in import order (each imports only those before it, and nothing of ckptaudit
outside ``fs``): :mod:`.counters` (the I/O counters), :mod:`.kept` (bytes of remote objects an
earlier stage already read, served instead of fetched), :mod:`.remote` (configure, the fsspec
filesystem, listing snapshots, :class:`RPath`), :mod:`.reads` (bounded reads, ``open_binary``,
``read_ranges``) and :mod:`.ops` (path operations, ``download``, multipart uploads, the listing
fingerprint).  This face re-exports every public name, so ``fs.<name>`` keeps working.  The module
state (the counters, the filesystem cache, the snapshots) lives once, in its module; the kept bytes are a
value a stage hands down to its reads as their ``kept=`` parameter (:mod:`.kept`).
"""

from __future__ import annotations

from . import kept  # noqa: F401
from .counters import (bytes_read, count, count_local, gets_issued, local_bytes_read,  # noqa: F401
                       reset_bytes_read, round_trips, stage_bytes)
from .ops import (download, exists, fspath, join, listdir, listing_fingerprint,  # noqa: F401
                  multipart_uploads, path, relpath, scandir, size, version, walk)
from .reads import (SMALL_FILE_BYTES, CountedFile, TooLarge, clean_text,  # noqa: F401
                    loads_json, open_binary, pread, preadv, read_bounded, read_ranges, read_ranges_uncached,
                    without_lone_surrogates)
from .remote import (RANGE_BLOCK_BYTES, STREAM_BLOCK_BYTES, RPath, Snapshot, configure,  # noqa: F401
                     filesystem, is_remote, open_object, refresh, snapshot_for)

__all__ = [
    "RANGE_BLOCK_BYTES", "RPath", "SMALL_FILE_BYTES", "STREAM_BLOCK_BYTES", "Snapshot", "TooLarge",
    "CountedFile", "bytes_read", "clean_text", "configure", "count", "count_local", "local_bytes_read", "pread",
    "preadv", "stage_bytes", "download", "exists", "filesystem", "fspath",
    "gets_issued", "is_remote", "join", "listdir", "listing_fingerprint", "loads_json", "multipart_uploads",
    "open_binary", "open_object", "path", "read_bounded", "read_ranges", "read_ranges_uncached", "refresh", "relpath",
    "reset_bytes_read", "round_trips", "scandir", "size", "snapshot_for", "version", "walk", "without_lone_surrogates",
]
