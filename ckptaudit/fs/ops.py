"""Path operations that work the same on local folders and remote run folders (``os``/``pathlib`` locally, the listing remotely).

``path``, ``join``, ``fspath``, ``size``, ``listdir``, ``relpath``, ``scandir``, ``walk``,
``exists``, plus the operations that reach past the listing: :func:`download` (a
streamed copy of one object), :func:`multipart_uploads` (S3 ``ListMultipartUploads``) and
:func:`listing_fingerprint` (one fresh LIST).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

from .kept import KeptBytes
from .reads import open_binary
from .remote import STREAM_BLOCK_BYTES, RPath, split_url, filesystem, is_remote, refresh


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


def version(p) -> Tuple[int, str]:
    """``(size in bytes, version tag)`` of ``p`` now: an object's ETag (from the listing), a local file's
    ``"<mtime_ns>:<inode>"``.  The one pass's facts carry the tag (:mod:`ckptaudit.onepass.facts`), so a file
    rewritten with the same size after the pass (a writer beside the audit) has its facts and kept bytes
    dropped, and the later stage reads it again.  Raises ``OSError`` when the file is gone."""
    if is_remote(p):
        info = path(p).info()
        return int(info["size"]), str(info["etag"])
    st = os.stat(fspath(p))
    return st.st_size, f"{st.st_mtime_ns}:{st.st_ino}"


def download(p, dest_dir, limit_bytes: int, *, kept: Optional[KeptBytes] = None) -> Optional[str]:
    """Copy object ``p`` into ``dest_dir`` (streamed; bytes in ``kept`` served from memory, see
    :func:`open_binary`); its local path, or None when it is larger than ``limit_bytes`` (nothing is
    downloaded then)."""
    if size(p) > limit_bytes:
        return None
    dest = Path(dest_dir) / path(p).name
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open_binary(p, block_size=STREAM_BLOCK_BYTES, kept=kept) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out, STREAM_BLOCK_BYTES)
    return str(dest)


# ------------------------------------------------------------- object-store facts
def multipart_uploads(run_dir) -> List[dict]:
    """Multipart uploads in progress under ``run_dir`` (S3 ``ListMultipartUploads``):
    [{"key": run-relative key, "upload_id": str, "initiated": iso time}]; [] for local paths."""
    if not is_remote(run_dir):
        return []
    proto, root = split_url(str(run_dir))
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
