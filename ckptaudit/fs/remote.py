"""Remote run folders: the fsspec filesystem, the listing snapshots and :class:`RPath` (``s3://bucket/key``).

The configured filesystem (fsspec's own instance cache, one per protocol and options, cleared by fsspec in
a forked child) and the listing snapshots (:data:`_snapshots`, per listed root) live here and nowhere else.
The first look at a remote run lists every object under the prefix once (``ListObjectsV2``: key, size in
bytes, ETag, LastModified) and answers ``exists``/``stat``/``iterdir`` from that snapshot, so every stage of
a process sees the run as it was at one moment; folders are the keys' common prefixes.  :func:`refresh`
re-lists.  :func:`open_object` opens one object for ranged, counted reads (:mod:`ckptaudit.fs.counters`).
"""

from __future__ import annotations

import datetime as _dt
import os
import posixpath
from types import SimpleNamespace
from typing import Dict, Iterator, List, Optional, Tuple

from .counters import Counted
from .kept import KeptBytes, KeptFetcher

RANGE_BLOCK_BYTES = 16 << 10  # readahead of one ranged GET in the file layer (bytes)
STREAM_BLOCK_BYTES = 8 << 20  # ranged GET size while hashing/downloading a whole object (bytes)
_ENV = {"endpoint_url": "CKPTAUDIT_S3_ENDPOINT_URL", "profile": "CKPTAUDIT_S3_PROFILE", "anon": "CKPTAUDIT_S3_ANON"}

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


def is_remote(path) -> bool:
    """True for ``s3://…`` (any ``scheme://``) paths and :class:`RPath` objects."""
    return isinstance(path, RPath) or "://" in str(path)


def split_url(url: str) -> Tuple[str, str]:
    """``(protocol, bucket/key)`` of an object URL ``protocol://bucket/key``, the key without surrounding slashes."""
    proto, _, rest = str(url).partition("://")
    return proto, rest.strip("/")


def as_rpath(p) -> "RPath":
    """``p`` as an :class:`RPath` (returned as is when it is one); for paths :func:`is_remote` accepts."""
    return p if isinstance(p, RPath) else RPath(p)


def filesystem(protocol: str = "s3"):
    """The fsspec filesystem for ``protocol`` with the configured endpoint, profile and anonymity: fsspec
    keeps one instance per protocol and options (its ``_Cached`` metaclass; a child process gets new ones)."""
    import fsspec

    endpoint = (os.environ.get(_ENV["endpoint_url"]) or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or "")
    profile = os.environ.get(_ENV["profile"], "")
    anon = os.environ.get(_ENV["anon"], "") == "1"
    opts: dict = {}
    if protocol in ("s3", "s3a"):
        opts = {"default_block_size": RANGE_BLOCK_BYTES}
        if endpoint:
            opts["endpoint_url"] = endpoint
        if profile:
            opts["profile"] = profile
        if anon:
            opts["anon"] = True
    return fsspec.filesystem(protocol, **opts)


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
    proto, root = split_url(str(run_dir))
    snap = Snapshot(proto, root)
    _snapshots[f"{proto}://{root}"] = snap
    return snap


def snapshot_for(url: str) -> Optional[Snapshot]:
    """The snapshot whose root holds ``url`` (listing it once when none does)."""
    proto, key = split_url(url)
    best = None
    for s in _snapshots.values():
        if s.protocol == proto and (key == s.root or key.startswith(s.root + "/")):
            if best is None or len(s.root) > len(best.root):
                best = s
    return best


def _lookup(url: str):
    """(snapshot, key) for a remote url, listing its bucket prefix when never listed."""
    snap = snapshot_for(url)
    proto, key = split_url(url)
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
        proto, key = split_url(str(url))
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
        return posixpath.basename(split_url(self.url)[1])

    @property
    def parent(self) -> "RPath":
        proto, key = split_url(self.url)
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
        with open_object(self, block_size=STREAM_BLOCK_BYTES) as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def relative_to(self, other) -> str:
        a, b = split_url(self.url)[1], split_url(str(other))[1]
        if a == b:
            return "."
        if not a.startswith(b + "/"):
            raise ValueError(f"{self.url} is not under {other}")
        return a[len(b) + 1:]


# ------------------------------------------------------------- opening an object
def open_object(rp: RPath, block_size: int = RANGE_BLOCK_BYTES, exact: bool = False, cache_type: str = "", *,
                kept: Optional[KeptBytes] = None):
    """The remote half of :func:`ckptaudit.fs.reads.open_binary`: an fsspec file for ``rp`` whose
    reads are ranged GETs of about ``block_size`` bytes, counted as "streamed" when ``block_size``
    >= 1 MiB, else as "ranged"; its fetcher answers from ``kept`` first (:class:`~.kept.KeptFetcher`: bytes
    an earlier pass read, for the file's life; None: every read is fetched).  Raises ``FileNotFoundError``
    when the listing has no such object."""
    proto, key = split_url(rp.url)
    info = rp.info()  # from the listing: no HEAD request, and FileNotFoundError when absent
    fs = filesystem(proto)
    cache = cache_type or ("none" if exact else "readahead")
    try:
        f = fs.open(key, "rb", block_size=block_size, cache_type=cache, size=info["size"])
    except TypeError:  # an fsspec implementation without the size keyword
        f = fs.open(key, "rb", block_size=block_size, cache_type=cache)
    if getattr(f, "cache", None) is not None:  # buffered files (s3fs, gcsfs…); others are not counted
        counted = Counted(f.cache.fetcher, "streamed" if block_size >= (1 << 20) else "ranged")
        # bytes the hash stage's pass kept, handed to this open, are not fetched again
        f.cache.fetcher = KeptFetcher(rp.url, counted, kept)
    return f
