"""What is this file, from its first bytes?  (No torch, no unpickling.)

:func:`sniff` classifies a file from its size, its first 4 KiB and, only for
files that start with NUL bytes, a streamed all-zero check.  :func:`generic_findings`
turns the classes that are never a checkpoint (empty, all-NUL, Git LFS pointer,
HTML/text error page, plain pickle, NumPy archive, unknown bytes) into findings.
The formats that have their own checker (torch zip, legacy torch, safetensors)
get no finding here; run :mod:`.torchzip`, :mod:`.legacy` or
:mod:`.safetensors_check` on them.

Format facts used (and where they come from):

* torch.save zip: a zip archive (``PK\\x03\\x04`` local header first) whose
  records live under one folder, e.g. ``ckpt/data.pkl`` (torch/serialization.py
  ``_save``; c10 ``PyTorchStreamWriter``).
* legacy torch.save (pre-1.6 / ``_use_new_zipfile_serialization=False``):
  starts with ``pickle.dump(MAGIC_NUMBER)``, MAGIC_NUMBER =
  ``0x1950A86A20F9469CFC6C`` (torch/serialization.py), i.e. for protocol 2
  ``80 02 8a 0a 6c fc 9c 46 f9 20 6a a8 50 19 2e``.
* safetensors: u64 little-endian header length N, then a JSON header starting
  with ``{`` (huggingface/safetensors README).
* Git LFS pointer: ``version https://git-lfs.github.com/spec/v1`` / ``oid
  sha256:<hex>`` / ``size <n>`` lines (git-lfs spec).
* NumPy: ``\\x93NUMPY`` magic (numpy.lib.format); ``.npz`` is a zip of ``.npy``.
"""

from __future__ import annotations

import os
import pickletools
import re
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .. import findings, fs
from ..findings import Finding
from . import zeros
from .zeros import zero_runs  # noqa: F401 - the streamed NUL-run search lives in zeros

#: ``MAGIC_NUMBER`` of torch/serialization.py (legacy torch.save format).
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
#: ``PROTOCOL_VERSION`` of torch/serialization.py (second legacy pickle).
TORCH_LEGACY_PROTOCOL_VERSION = 1001

#: Bytes read for classification (only the first 64 are kept in ``Sniff.head``).
SNIFF_BYTES = 4096
#: Suffixes of files that are meant to hold binary checkpoint data: text or
#: JSON under such a name is an error page, not a legitimate text file.
BINARY_SUFFIXES = (
    ".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".pkl", ".pickle", ".distcp",
    ".tar", ".h5", ".msgpack", ".model", ".npz", ".npy", ".pdparams",
)

_LFS_VERSION = b"version https://git-lfs.github.com/spec/"
_TORCH_RECORD = re.compile(
    r"^[^/]+/(data\.pkl|\.format_version|\.storage_alignment|byteorder|version|data/\d+|\.data/.+)$"
)
_LEGACY_P0_MAGIC = b"L%dL\n." % TORCH_LEGACY_MAGIC  # protocol 0/1 spelling of the magic pickle


@dataclass
class Sniff:
    """Classification of one file.

    ``kind`` is one of ``"empty" | "all_zero" | "lfs_pointer" | "html" | "text" |
    "json" | "torch_zip" | "zip" | "torch_legacy" | "pickle" | "safetensors" |
    "npy" | "npz" | "unknown"``.  ``head`` is the first <= 64 bytes.  ``detail``
    holds what the classification found (e.g. ``lfs_size``, ``lfs_oid``,
    ``pickle_protocol``, ``first_member``, ``header_len``, ``zero_head_bytes``,
    ``by_suffix`` when only the file name made it ``safetensors``).
    """

    path: str
    size_bytes: int
    kind: str
    head: bytes = b""
    detail: Dict[str, Any] = field(default_factory=dict)


def _is_all_zero_stream(f, start: int, chunk: int) -> bool:
    """True if every byte from ``start`` to EOF is NUL; reads ``chunk`` bytes at a time."""
    f.seek(start)
    buf = bytearray(chunk)
    zeros = bytes(chunk)
    view = memoryview(buf)
    while True:
        n = f.readinto(buf)
        if not n:
            return True
        if view[:n] != zeros[:n]:
            return False


def _leading_zeros(b: bytes) -> int:
    return len(b) - len(b.lstrip(b"\0"))


def _parse_lfs(text: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "version":
            out["lfs_version"] = value
        elif key == "oid":
            out["lfs_oid"] = value.split(":", 1)[1] if value.startswith("sha256:") else value
        elif key == "size" and value.strip().isdigit():
            out["lfs_size"] = int(value.strip())
    return out


def _first_pickle_value(data: bytes) -> Tuple[Any, int | None, int | None]:
    """Statically read the first pickle in ``data`` if it is one integer constant.

    Returns ``(value, protocol, end)``; ``value`` is None when the pickle is not
    a lone integer (or cannot be walked in the bytes given); ``end`` is the
    offset just after its STOP when that was seen.  Never executes it.
    """
    proto = None
    value = None
    try:
        for op, arg, pos in pickletools.genops(data):
            if op.name == "PROTO":
                proto = arg
            elif op.name in ("FRAME",):
                continue
            elif op.name in ("LONG1", "LONG4", "LONG", "INT", "BININT", "BININT1", "BININT2"):
                if value is not None:
                    return None, proto, None
                value = arg
            elif op.name == "STOP":
                return value, proto, pos + 1
            else:
                return None, proto, None
    except Exception:  # truncated / not a pickle: static walk only, never raises out
        return None, proto, None
    return None, proto, None


def _looks_text(b: bytes) -> bool:
    if not b:
        return False
    try:
        s = b.decode("utf-8")
    except UnicodeDecodeError as e:  # a multi-byte char cut at the window edge is fine
        if e.start < len(b) - 4:
            return False
        s = b[: e.start].decode("utf-8")
    if not s:
        return False
    printable = sum(1 for c in s if c.isprintable() or c in "\r\n\t")
    return printable / len(s) > 0.95


def sniff(path, *, kept=None) -> Sniff:
    """Classify ``path`` from its bytes (see :class:`Sniff` for the kinds).

    Reads at most :data:`SNIFF_BYTES` from the start; a file whose first bytes
    are NUL is streamed to EOF in 1 MiB chunks to tell ``all_zero`` from a file
    with a zeroed head.  ``kept``: bytes of a remote object already read
    (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory.  Raises only ``OSError`` when the file
    cannot be opened or read at all (the caller's I/O problem, not the checkpoint's).
    """
    path = fs.fspath(path)
    size = fs.size(path)
    if size == 0:
        return Sniff(path, 0, "empty", b"", {})
    with fs.open_binary(path, exact=True, kept=kept) as f:
        first = f.read(SNIFF_BYTES)
        head = first[:64]
        detail: Dict[str, Any] = {}
        lz = _leading_zeros(first)
        if lz == len(first):
            if _is_all_zero_stream(f, len(first), 1 << 20):
                return Sniff(path, size, "all_zero", head, {})
        if lz:
            detail["zero_head_bytes"] = lz if lz < len(first) else None
            if lz == len(first):  # count precisely, streamed
                f.seek(0)
                n = 0
                while True:
                    b = f.read(1 << 20)
                    if not b:
                        break
                    k = _leading_zeros(b)
                    n += k
                    if k < len(b):
                        break
                detail["zero_head_bytes"] = n

    lower = path.lower()
    kind = _classify(first, size, detail, lower)
    return Sniff(path, size, kind, head, detail)


def _classify(first: bytes, size: int, detail: Dict[str, Any], lower_path: str) -> str:
    if first.startswith(b"PK\x03\x04") or first.startswith(b"PK\x05\x06"):
        return _zip_kind(first, detail)
    if first.startswith(b"\x93NUMPY"):
        return "npy"
    if first.startswith(_LFS_VERSION):
        detail.update(_parse_lfs(first.decode("utf-8", "replace")))
        return "lfs_pointer"
    # before the pickle test: a header length of 0x0480 starts with 80 04, like a protocol-4 pickle
    if len(first) >= 9 and first[8:9] == b"{" and struct.unpack_from("<Q", first, 0)[0] < (1 << 40):
        detail["header_len"] = struct.unpack_from("<Q", first, 0)[0]
        return "safetensors"
    return _pickle_kind(first, detail) or _text_kind(first, detail, lower_path)


def _zip_kind(first: bytes, detail: Dict[str, Any]) -> str:
    """``torch_zip`` (its first member is a torch record), ``npz`` (a ``.npy`` member) or ``zip``."""
    if first.startswith(b"PK\x03\x04") and len(first) >= 30:
        nlen = struct.unpack_from("<H", first, 26)[0]
        name = first[30 : 30 + nlen].decode("utf-8", "replace")
        detail["first_member"] = name
        if _TORCH_RECORD.match(name):
            return "torch_zip"
        if name.endswith(".npy"):
            return "npz"
    return "zip"


def _pickle_kind(first: bytes, detail: Dict[str, Any]) -> str:
    """``torch_legacy`` or ``pickle`` when ``first`` starts a pickle; "" otherwise."""
    if first.startswith(_LEGACY_P0_MAGIC):
        detail["pickle_protocol"] = 0
        return "torch_legacy"
    if not (len(first) >= 2 and first[0] == 0x80 and 2 <= first[1] <= 5):
        return ""
    value, proto, end = _first_pickle_value(first)
    detail["pickle_protocol"] = proto
    if value == TORCH_LEGACY_MAGIC:
        return "torch_legacy"
    if type(value) is int and end is not None and first[end:end + 1] == b"\x80":
        # a lone integer pickle followed by another pickle: the legacy torch
        # layout (magic, protocol version, ...) with a wrong magic number
        detail["first_int"] = value
    return "pickle"


def _text_kind(first: bytes, detail: Dict[str, Any], lower_path: str) -> str:
    """``html``, ``json``, ``text``, ``safetensors`` (by its name alone) or ``unknown``."""
    stripped = first.lstrip(b"\xef\xbb\xbf \t\r\n")
    low = stripped[:1024].lower()
    if low.startswith(b"<!doctype html") or low.startswith(b"<html") or b"<html" in low or (
        low.startswith(b"<") and (b"<head" in low or b"<body" in low)
    ):
        return "html"
    if _looks_text(first):
        if stripped[:1] in (b"{", b"["):
            return "json"
        return "text"
    if lower_path.endswith(".safetensors") and not detail.get("zero_head_bytes"):
        detail["by_suffix"] = True
        if len(first) >= 8:
            detail["header_len"] = struct.unpack_from("<Q", first, 0)[0]
        return "safetensors"
    return "unknown"


def generic_findings(s: Sniff, display: Optional[str] = None) -> List[Finding]:
    """Findings for the sniff kinds that are never a checkpoint.

    ``torch_zip``, ``zip``, ``torch_legacy`` and ``safetensors`` get none here
    (their checkers decide).  ``text``/``json`` are findings only under a name
    meant for binary data (:data:`BINARY_SUFFIXES`): a run folder legitimately
    holds text files such as DeepSpeed's ``latest`` or an HF index.  A plain
    ``pickle`` named ``.metadata`` is torch.distributed.checkpoint's metadata
    (written with ``pickle.dump`` by design) and gets no finding here either.
    ``display`` is the path the findings name (default: the path sniffed).
    """
    p = s.path if display is None else display
    k = s.kind
    name = os.path.basename(s.path).lower()
    binary_name = name.endswith(BINARY_SUFFIXES)
    if k == "empty":
        return [findings.make("empty_file", path=p, size_bytes=0)]
    if k == "all_zero":
        return [findings.make("all_zero_file", path=p, size_bytes=s.size_bytes)]
    if k == "lfs_pointer":
        return [findings.make(
            "git_lfs_pointer", path=p, size_bytes=s.size_bytes,
            lfs_size=s.detail.get("lfs_size", "?"), lfs_oid=s.detail.get("lfs_oid", "?"),
        )]
    if k == "html":
        return [findings.make("html_error_page", path=p, size_bytes=s.size_bytes)]
    if k in ("text", "json"):
        if not binary_name:
            return []
        return [findings.make("text_error_page", path=p, size_bytes=s.size_bytes, head=_head_text(s.head))]
    if k == "pickle":
        return _pickle_findings(s, p, name)
    if k in ("npy", "npz"):
        return [findings.make("numpy_archive_not_checkpoint", path=p, size_bytes=s.size_bytes)]
    if k == "unknown":
        return zeros.head(p, s.detail.get("zero_head_bytes"), s.size_bytes) or [
            findings.make("unknown_format", path=p, size_bytes=s.size_bytes, head_hex=s.head[:16].hex(" "))]
    return []


def _pickle_findings(s: Sniff, p: str, name: str) -> List[Finding]:
    """A plain pickle: none for DCP's ``.metadata``, a legacy file with a wrong magic number, or
    ``not_a_torch_save_file``."""
    if name == ".metadata":
        return []
    if s.detail.get("first_int") is not None:
        return [legacy_magic_mismatch(p, hex(s.detail["first_int"]))]
    return [findings.make("not_a_torch_save_file", path=p, size_bytes=s.size_bytes,
                          pickle_protocol=s.detail.get("pickle_protocol"))]


def as_pickle(generic: List[Finding], s: Sniff, protocol: Optional[int], display: str) -> List[Finding]:
    """The file-layer findings of a file whose bytes turned out to be a pickle (the scanner's security
    sweep walked it): a text, HTML or unknown-bytes verdict of :func:`generic_findings` is replaced by
    ``not_a_torch_save_file`` (an error page is named so only when it is not a pickle)."""
    if s.kind not in ("text", "json", "html", "unknown"):
        return generic
    kept = [f for f in generic if f.kind not in ("text_error_page", "html_error_page", "unknown_format")]
    if len(kept) != len(generic) or s.kind in ("html", "unknown"):
        kept.append(findings.make("not_a_torch_save_file", path=display, size_bytes=s.size_bytes,
                                  pickle_protocol=protocol if protocol is not None else "0 or 1"))
    return kept


def legacy_magic_mismatch(display: str, found: str) -> Finding:
    """``legacy_magic_mismatch``: the file's first pickle is ``found`` where the legacy format has
    :data:`TORCH_LEGACY_MAGIC`.  Decided by :func:`generic_findings` (a lone integer pickle followed by
    another pickle) and by :func:`ckptaudit.formats.legacy.check_legacy` (a file that is no legacy file)."""
    return findings.make("legacy_magic_mismatch", path=display, found=found, expected=hex(TORCH_LEGACY_MAGIC))


def _head_text(head: bytes) -> str:
    return head[:40].decode("utf-8", "replace")
