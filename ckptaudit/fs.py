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
"""

from __future__ import annotations

import datetime as _dt
import os
import posixpath
import re
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional, Tuple

RANGE_BLOCK_BYTES = 16 << 10  # readahead of one ranged GET in the file layer (bytes)
STREAM_BLOCK_BYTES = 8 << 20  # ranged GET size while hashing/downloading a whole object (bytes)
_ENV = {"endpoint_url": "CKPTAUDIT_S3_ENDPOINT_URL", "profile": "CKPTAUDIT_S3_PROFILE", "anon": "CKPTAUDIT_S3_ANON"}

_lock = threading.Lock()
_bytes: Dict[str, int] = {"ranged": 0, "streamed": 0}
_gets: Dict[str, int] = {"ranged": 0, "streamed": 0}
_rounds: Dict[str, int] = {"ranged": 0, "streamed": 0}
_fs_cache: Dict[Tuple, object] = {}
_snapshots: Dict[str, "Snapshot"] = {}


# ------------------------------------------------------------ configuration
def configure(s3cfg: Optional[dict]) -> None:
    """Apply the audit config's ``s3:`` block (endpoint_url, profile, anon).

    Stored in ``CKPTAUDIT_S3_*`` environment variables so that the workflow's job
    processes inherit it.  Credentials are not part of it (AWS chain only).
    """
    for key, var in _ENV.items():
        v = (s3cfg or {}).get(key)
        if v in (None, "", False):
            os.environ.pop(var, None)
        else:
            os.environ[var] = "1" if v is True else str(v)
    _fs_cache.clear()


def is_remote(path) -> bool:
    """True for ``s3://…`` (any ``scheme://``) paths and :class:`RPath` objects."""
    return isinstance(path, RPath) or "://" in str(path)


def _split(url: str) -> Tuple[str, str]:
    proto, _, rest = str(url).partition("://")
    return proto, rest.strip("/")


def filesystem(protocol: str = "s3"):
    """The fsspec filesystem for ``protocol`` (cached per endpoint/profile)."""
    import fsspec

    endpoint = (os.environ.get(_ENV["endpoint_url"]) or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or "")
    profile = os.environ.get(_ENV["profile"], "")
    anon = os.environ.get(_ENV["anon"], "") == "1"
    key = (protocol, endpoint, profile, anon)
    fs = _fs_cache.get(key)
    if fs is None:
        opts: dict = {}
        if protocol in ("s3", "s3a"):
            opts = {"default_block_size": RANGE_BLOCK_BYTES, "skip_instance_cache": True}
            if endpoint:
                opts["endpoint_url"] = endpoint
            if profile:
                opts["profile"] = profile
            if anon:
                opts["anon"] = True
        fs = fsspec.filesystem(protocol, **opts)
        _fs_cache[key] = fs
    return fs


# ------------------------------------------------------------- listing
class Snapshot:
    """One listing of every object under a remote prefix.

    ``files`` maps bucket-relative key → ``{"size": bytes, "etag": str, "mtime_ns": int}``;
    ``dirs`` is every common prefix (folders), the root included.
    """

    def __init__(self, protocol: str, root: str) -> None:
        self.protocol, self.root = protocol, root
        fs = filesystem(protocol)
        fs.invalidate_cache()
        try:
            found = fs.find(root, detail=True, withdirs=False)
        except FileNotFoundError:
            found = {}
        self.files: Dict[str, dict] = {}
        for k, info in found.items():
            k = k.strip("/")
            if info.get("type") == "directory" or str(info.get("name", "")).endswith("/"):
                continue
            if k != root and not k.startswith(root + "/"):
                continue
            self.files[k] = {"size": int(info.get("size") or 0), "etag": str(info.get("ETag", "")).strip('"'),
                             "mtime_ns": _mtime_ns(info.get("LastModified"))}
        self.dirs = {root} if self.files else set()
        for k in self.files:
            d = posixpath.dirname(k)
            while d and d.startswith(root) and d not in self.dirs:
                self.dirs.add(d)
                d = posixpath.dirname(d)
        self.children: Dict[str, List[str]] = {}
        for k in list(self.files) + list(self.dirs):
            if k != root:
                self.children.setdefault(posixpath.dirname(k), []).append(posixpath.basename(k))


def _mtime_ns(v) -> int:
    if isinstance(v, _dt.datetime):
        return int(v.timestamp() * 1e9)
    return 0


def refresh(run_dir) -> "Snapshot":
    """List ``run_dir`` (remote) again and return the new snapshot."""
    proto, root = _split(str(run_dir))
    snap = Snapshot(proto, root)
    _snapshots[f"{proto}://{root}"] = snap
    return snap


def snapshot_for(url: str) -> Optional[Snapshot]:
    """The snapshot whose root holds ``url`` (listing it once when none does)."""
    proto, key = _split(url)
    best = None
    for s in _snapshots.values():
        if s.protocol == proto and (key == s.root or key.startswith(s.root + "/")):
            if best is None or len(s.root) > len(best.root):
                best = s
    return best


def _lookup(url: str):
    """(snapshot, key) for a remote url, listing its bucket prefix when never listed."""
    snap = snapshot_for(url)
    proto, key = _split(url)
    if snap is None:
        snap = refresh(f"{proto}://{posixpath.dirname(key) or key}")
    return snap, key


# ------------------------------------------------------------- RPath
class RPath:
    """A remote path (``s3://bucket/key``) with the ``pathlib`` subset the audit uses.

    Deliberately no ``__fspath__``: handing one to ``os``/builtin ``open`` fails
    loudly instead of touching a local file of the same name.
    """

    __slots__ = ("url",)

    def __init__(self, url) -> None:
        proto, key = _split(str(url))
        self.url = f"{proto}://{key}"

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RPath({self.url!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RPath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, other) -> "RPath":
        other = str(other).replace(os.sep, "/")
        return RPath(posixpath.normpath(posixpath.join(self.url, other)).replace(":/", "://", 1))

    @property
    def name(self) -> str:
        return posixpath.basename(_split(self.url)[1])

    @property
    def parent(self) -> "RPath":
        proto, key = _split(self.url)
        return RPath(f"{proto}://{posixpath.dirname(key) or key}")

    @property
    def suffix(self) -> str:
        return posixpath.splitext(self.name)[1]

    def exists(self) -> bool:
        snap, key = _lookup(self.url)
        return key in snap.files or key in snap.dirs

    def is_dir(self) -> bool:
        snap, key = _lookup(self.url)
        return key in snap.dirs

    def is_file(self) -> bool:
        snap, key = _lookup(self.url)
        return key in snap.files

    def is_symlink(self) -> bool:
        return False

    def info(self) -> dict:
        """{"size", "etag", "mtime_ns"} from the listing; FileNotFoundError when absent."""
        snap, key = _lookup(self.url)
        if key in snap.files:
            return snap.files[key]
        if key in snap.dirs:
            return {"size": 0, "etag": "", "mtime_ns": 0}
        raise FileNotFoundError(f"{self.url}: no such object")

    def stat(self):
        i = self.info()
        return SimpleNamespace(st_size=i["size"], st_mtime_ns=i["mtime_ns"], st_mtime=i["mtime_ns"] / 1e9)

    def iterdir(self) -> Iterator["RPath"]:
        snap, key = _lookup(self.url)
        for n in sorted(snap.children.get(key, [])):
            yield RPath(f"{snap.protocol}://{key}/{n}")

    def read_bytes(self) -> bytes:
        with open_binary(self, block_size=STREAM_BLOCK_BYTES) as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def relative_to(self, other) -> str:
        a, b = _split(self.url)[1], _split(str(other))[1]
        if a == b:
            return "."
        if not a.startswith(b + "/"):
            raise ValueError(f"{self.url} is not under {other}")
        return a[len(b) + 1:]


def path(p):
    """``RPath`` for remote paths, ``Path`` for local ones (an RPath/Path is returned as is)."""
    if isinstance(p, (RPath, Path)):
        return p
    return RPath(p) if is_remote(p) else Path(p)


def join(run_dir, rel: str):
    """``run_dir / rel`` that keeps ``s3://`` (string for strings, path for paths)."""
    if isinstance(run_dir, (RPath, Path)):
        return run_dir / rel
    if is_remote(run_dir):
        return str(RPath(run_dir) / rel)
    return os.path.join(run_dir, rel)


def fspath(p) -> str:
    """``os.fspath`` for local paths; the ``s3://`` url for remote ones."""
    return p.url if isinstance(p, RPath) else os.fspath(p)


def size(p) -> int:
    """Size in bytes; ``OSError`` (FileNotFoundError) when absent."""
    if is_remote(p):
        return path(p).info()["size"]
    return os.path.getsize(p)


def listdir(p) -> List[str]:
    """Names in folder ``p`` (``os.listdir`` locally; from the listing remotely)."""
    if not is_remote(p):
        return os.listdir(p)
    rp = path(p)
    if not rp.is_dir():
        raise NotADirectoryError(f"{rp}: not a folder")
    return [c.name for c in rp.iterdir()]


def relpath(p, root) -> str:
    """``p`` relative to ``root`` with "/" separators ("." for the root itself)."""
    if isinstance(p, RPath) or isinstance(root, RPath):
        return RPath(p).relative_to(root)
    r = os.path.relpath(p, root)
    return "." if r == "." else r.replace(os.sep, "/")


class _Entry:
    """The ``os.DirEntry`` subset inventory uses, for a remote child."""

    def __init__(self, p: "RPath") -> None:
        self.path, self.name = p, p.name

    def is_symlink(self) -> bool:
        return False

    def is_dir(self) -> bool:
        return self.path.is_dir()

    def is_file(self) -> bool:
        return self.path.is_file()


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
            for k, v in o.items():
                if type(v) is str:
                    o[k] = clean_text(v)
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(o, list):
            for i, v in enumerate(o):
                if type(v) is str:
                    o[i] = clean_text(v)
                elif isinstance(v, (dict, list)):
                    stack.append(v)
    return obj


def read_bounded(p, limit: int) -> bytes:
    """The bytes of a small metadata file, refusing what is not a regular file or is over ``limit`` bytes.

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` before any read, so a FIFO,
    a device or a sparse giant named like a sidecar never blocks or floods memory.
    Raises ``OSError`` (``TooLarge`` for a file over the cap).  Remote paths are read
    with a ranged read of ``limit + 1`` bytes.
    """
    import stat

    if is_remote(p):
        if size(p) > limit:
            raise TooLarge(f"{p}: over {limit} bytes")
        data = read_ranges(p, [(0, limit + 1)])[0]
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


SMALL_FILE_BYTES = 16 << 20  # cap for sidecars, manifests, pointers, indexes, trainer_state.json


def scandir(d):
    """``os.scandir`` locally; entries from the listing remotely (``path`` is an RPath)."""
    if not is_remote(d):
        return list(os.scandir(d))
    return [_Entry(c) for c in path(d).iterdir()]


def walk(d, onerror=None):
    """``os.walk`` (top-down, sorted by the caller) locally; remotely from the listing
    (``dirpath`` is an RPath).  ``onerror(OSError)`` is called for a local folder that cannot
    be listed (``os.walk`` skips it silently otherwise)."""
    if not is_remote(d):
        yield from os.walk(d, onerror=onerror)
        return
    stack = [path(d)]
    while stack:
        cur = stack.pop(0)
        kids = list(cur.iterdir())
        dirnames = [k.name for k in kids if k.is_dir()]
        filenames = [k.name for k in kids if k.is_file()]
        yield cur, dirnames, filenames
        stack[:0] = [cur / n for n in dirnames]


def exists(p) -> bool:
    return path(p).exists()


def etag(p) -> str:
    """The object's ETag without quotes ('' for local files)."""
    return path(p).info()["etag"] if is_remote(p) else ""


# ------------------------------------------------------------- reading
class _Counted:
    def __init__(self, fetch, purpose: str):
        self.fetch, self.purpose = fetch, purpose

    def __call__(self, start, end):
        data = self.fetch(start, end)
        with _lock:
            _bytes[self.purpose] += len(data)
            _gets[self.purpose] += 1
            _rounds[self.purpose] += 1
        return data


def open_binary(p, block_size: int = RANGE_BLOCK_BYTES, exact: bool = False, cache_type: str = ""):
    """Open for reading bytes.  Local: builtin ``open(p, "rb")``.  Remote: an fsspec
    file whose reads are ranged GETs of about ``block_size`` bytes (readahead cache),
    counted in :func:`bytes_read` (as "streamed" when ``block_size`` >= 1 MiB:
    hashing, CRC verification, the value scan, downloads; else as "ranged").  With ``exact``
    each read is one GET of exactly the bytes asked for (no readahead): for callers that
    read known ranges (zip records, tensor values) at scattered offsets.  ``cache_type``
    overrides fsspec's cache (e.g. "blockcache": an LRU of 32 blocks of ``block_size``).  Raises ``OSError`` (FileNotFoundError) when absent."""
    if not is_remote(p):
        return open(p, "rb")
    rp = path(p)
    proto, key = _split(rp.url)
    info = rp.info()  # from the listing: no HEAD request, and FileNotFoundError when absent
    fs = filesystem(proto)
    cache = cache_type or ("none" if exact else "readahead")
    try:
        f = fs.open(key, "rb", block_size=block_size, cache_type=cache, size=info["size"])
    except TypeError:  # an fsspec implementation without the size keyword
        f = fs.open(key, "rb", block_size=block_size, cache_type=cache)
    if getattr(f, "cache", None) is not None:  # buffered files (s3fs, gcsfs…); others are not counted
        f.cache.fetcher = _Counted(f.cache.fetcher, "streamed" if block_size >= (1 << 20) else "ranged")
    return f


def read_ranges(p, ranges: List[Tuple[int, int]]) -> List[Optional[bytes]]:
    """Bytes of each ``(offset, length)`` of remote object ``p``, fetched concurrently
    (fsspec ``cat_ranges``: s3fs issues the ranged GETs together, in batches of fsspec's
    ``gather_batch_size``), so N scattered small reads cost about one round trip rather
    than N.  A range that failed is None (the caller reads it again on its own).  Counted
    in :func:`bytes_read` / :func:`gets_issued` as "ranged".  Local paths raise
    ``ValueError``: read them with ``os.pread``."""
    if not is_remote(p):
        raise ValueError(f"{p}: read_ranges is for remote objects")
    if not ranges:
        return []
    proto, key = _split(path(p).url)
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
    with _lock:
        _bytes["ranged"] += got
        _gets["ranged"] += len(ranges)
        _rounds["ranged"] += 1
    return out


def bytes_read(purpose: str = "") -> int:
    """Remote bytes fetched by this process so far: all, or only "ranged" (small reads of
    headers, directories, pickles) or "streamed" (whole-object passes)."""
    return _bytes[purpose] if purpose else sum(_bytes.values())


def gets_issued(purpose: str = "") -> int:
    """Ranged GET requests this process issued for object data so far (all, "ranged" or
    "streamed", as :func:`bytes_read`); listings and HEADs are not counted."""
    return _gets[purpose] if purpose else sum(_gets.values())


def round_trips(purpose: str = "") -> int:
    """Sequential request rounds behind :func:`gets_issued`: one per single GET, one per
    :func:`read_ranges` batch (whose GETs run concurrently).  What latency multiplies."""
    return _rounds[purpose] if purpose else sum(_rounds.values())


def reset_bytes_read() -> None:
    """Zero :func:`bytes_read`, :func:`gets_issued` and :func:`round_trips`."""
    with _lock:
        for k in _bytes:
            _bytes[k] = 0
            _gets[k] = 0
            _rounds[k] = 0


def download(p, dest_dir, limit_bytes: int) -> Optional[str]:
    """Copy object ``p`` into ``dest_dir`` (streamed); its local path, or None when
    it is larger than ``limit_bytes`` (nothing is downloaded then)."""
    if size(p) > limit_bytes:
        return None
    dest = Path(dest_dir) / path(p).name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open_binary(p, block_size=STREAM_BLOCK_BYTES) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, STREAM_BLOCK_BYTES)
    return str(dest)


# ------------------------------------------------------------- object-store facts
def multipart_uploads(run_dir) -> List[dict]:
    """Multipart uploads in progress under ``run_dir`` (S3 ``ListMultipartUploads``):
    [{"key": run-relative key, "upload_id": str, "initiated": iso time}]; [] for local paths."""
    if not is_remote(run_dir):
        return []
    proto, root = _split(str(run_dir))
    if proto not in ("s3", "s3a"):
        return []
    bucket, _, prefix = root.partition("/")
    fs = filesystem(proto)
    out: List[dict] = []
    kw = {"Bucket": bucket, "Prefix": (prefix + "/") if prefix else ""}
    while True:
        resp = fs.call_s3("list_multipart_uploads", **kw)
        for u in resp.get("Uploads", []) or []:
            key = u["Key"]
            rel = key[len(kw["Prefix"]):]
            init = u.get("Initiated")
            out.append({"key": rel, "upload_id": u.get("UploadId", ""),
                        "initiated": init.isoformat() if hasattr(init, "isoformat") else str(init or "")})
        if not resp.get("IsTruncated"):
            break
        kw["KeyMarker"], kw["UploadIdMarker"] = resp.get("NextKeyMarker", ""), resp.get("NextUploadIdMarker", "")
    return sorted(out, key=lambda d: (d["key"], d["initiated"]))


def listing_fingerprint(run_dir) -> str:
    """Fingerprint of names, sizes and ETags under a remote ``run_dir`` (one LIST)."""
    import hashlib

    snap = refresh(run_dir)
    if not snap.files:
        return "missing"
    h = hashlib.sha256()
    for k in sorted(snap.files):
        i = snap.files[k]
        h.update(f"{k[len(snap.root) + 1:]}\0{i['size']}\0{i['etag']}\n".encode())
    for m in multipart_uploads(run_dir):
        h.update(f"multipart\0{m['key']}\0{m['upload_id']}\n".encode())
    return h.hexdigest()[:16]
