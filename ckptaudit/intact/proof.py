"""What salvage knows about one tensor of a damaged file: where its bytes are, and what proves them intact.

A tensor is **intact** when records made at save time check every byte it depends on: its *identity* (the
bytes that give its name, dtype, shape, stride and offsets: a torch zip's ``data.pkl`` and the name of the
record holding its storage, a safetensors header, a DCP ``.metadata``) and its *bytes*.  The proofs
(:data:`PROOFS`, each tensor's ``proven_by``): the CRC-32 of a zip record (torch writes one per record, in the
record's data descriptor), the chunk digests of a ``ckptaudit.manifest`` (BLAKE3 in ``/2``, SHA-256 in ``/1``)
for every chunk the bytes touch, a whole-file SHA-256 (the manifest entry's ``sha256_hex``, the ``.sha256``
sidecar, Megatron's ``integrity.json``).  It is **lost** when its bytes are missing (the file ends before them,
the record was never finished, the file is gone) or a check proves them or its identity changed.  It is
**unproven** when its bytes are all there and nothing recorded can check them (a safetensors file without a
manifest: the format has no checksum); finite values alone never count as proof.  ``suspect`` is an unproven
tensor that holds an all-zero 4 KiB page, what a lost block of a file looks like (``formats.safetensors_check``'s
rule).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ..formats.chunk_digest import FIELDS, SAID, digest_range

#: torch dtype name -> safetensors dtype: every dtype ``safetensors.torch`` 0.8 reads back to torch
#: (``safetensors.torch._TYPES``; a test holds the two equal).  torch dtypes not here (complex128, complex32,
#: float8_e8m0fnu, float4_e2m1fn_x2, the quantized and bits types, int1..7/uint1..7) are named in the report
#: and never written: no safetensors dtype holds them unchanged.
SAFETENSORS_DTYPE = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2": "F8_E5M2", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "uint16": "U16", "uint32": "U32", "uint64": "U64", "complex64": "C64",
}
#: safetensors dtype -> torch dtype name, the inverse of :data:`SAFETENSORS_DTYPE`
TORCH_DTYPE = {v: k for k, v in SAFETENSORS_DTYPE.items()}

#: what ``proven_by`` names (salvage.json, per tensor: ``{"identity": …, "bytes": …}``) -> what it is
PROOFS = {
    "zip_crc32": "the CRC-32 torch recorded for the zip record (data descriptor and central directory)",
    "manifest_blake3": "the BLAKE3 digests of a ckptaudit manifest's chunks (manifest/2)",
    "manifest_sha256": "the SHA-256 digests of a ckptaudit manifest's chunks (manifest/1)",
    "sha256_manifest": "the whole file's SHA-256 in its ckptaudit manifest entry",
    "sha256_sidecar": "the whole file's SHA-256 in its .sha256 sidecar",
    "sha256_integrity_json": "the whole file's SHA-256 in the folder's integrity.json",
    "dcp_blob_crosscheck": "each chunk blob's own CRC-checked data.pkl agrees with .metadata on dtype and shape "
                           "(.metadata itself has no checksum)",
    "empty": "zero bytes: nothing to check",
}

INTACT, LOST, UNPROVEN, SUSPECT = "intact", "lost", "unproven", "suspect"
#: a tensor of the damaged unit replaced by the intact one of an older unit (``--fill-from``)
FILLED = "filled"


@dataclass
class TensorBytes:
    """One tensor of a damaged file.  ``name``: its path in the saved object (``model.fc.weight``);
    ``dtype``: torch's dtype name; ``shape``/``stride`` in elements; ``offset``: byte offset in ``path`` of
    element 0 of its storage (or, for a safetensors tensor, of the tensor); ``storage_offset`` in elements;
    ``span``: ``(first byte, end byte)`` in ``path`` that the tensor's elements occupy; ``status`` and
    ``proof`` (how it was shown intact, or why it is not, in words); ``proven_by``: for an intact tensor
    ``{"identity": proof, "bytes": proof}`` (keys of :data:`PROOFS`); ``parts``: its path in the saved object
    as components (``("model", "fc.weight")``: a dict key holding dots stays one component), default
    ``(name,)``; ``key``: the key it is written under (set by :mod:`ckptaudit.salvage.keys`), None when not
    written."""

    name: str
    file: str
    path: str
    dtype: str
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    offset: int
    storage_offset: int
    itemsize: int
    span: Tuple[int, int]
    status: str = UNPROVEN
    proof: str = ""
    source: Dict[str, object] = field(default_factory=dict)
    proven_by: Optional[Dict[str, str]] = None
    parts: Tuple[object, ...] = ()
    key: Optional[str] = None
    #: for a tensor assembled from several places (DCP chunks): returns its contiguous bytes when written
    load: Optional[Callable[[], bytes]] = field(default=None, repr=False, compare=False)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    def contiguous(self) -> bool:
        """Whether the elements lie in one run of ``nbytes`` bytes from ``span[0]``, in row-major order."""
        want = 1
        for d, s in zip(reversed(self.shape), reversed(self.stride)):
            if d != 1 and s != want:
                return False
            want *= d
        return True

    def row(self) -> dict:
        """The report's row for this tensor (JSON-able)."""
        d = {k: getattr(self, k) for k in ("name", "file", "dtype", "status", "proof", "proven_by", "source",
                                           "itemsize", "key")}
        d.update(shape=list(self.shape), span=list(self.span), nbytes=self.nbytes,
                 path=[p if isinstance(p, (str, int)) and not isinstance(p, bool) else repr(p)
                       for p in (self.parts or (self.name,))])
        return d


def strided_bytes(raw: bytes, shape, stride, itemsize: int) -> bytes:
    """The elements of the strided view ``shape``/``stride`` (in elements) whose element 0 is at byte 0 of
    ``raw``, in row-major order, as bytes; any dtype (elements are copied as ``itemsize``-byte units).  Raises
    ``ValueError`` when the view reaches past ``raw``."""
    import numpy as np

    n = 1
    for d in shape:
        n *= d
    if n == 0:
        return b""
    last = sum((d - 1) * s for d, s in zip(shape, stride))
    if (last + 1) * itemsize > len(raw) or any(s < 0 for s in stride):
        raise ValueError(f"a view {list(shape)} with strides {list(stride)} reaches past its {len(raw)} bytes")
    base = np.frombuffer(raw, dtype=np.dtype(f"V{itemsize}"), count=last + 1)
    view = np.lib.stride_tricks.as_strided(base, shape=tuple(shape), strides=tuple(s * itemsize for s in stride))
    return np.ascontiguousarray(view).tobytes()


def row_major(shape) -> List[int]:
    """The strides (in elements) of a contiguous row-major tensor of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return list(reversed(out))


def view_span(offset: int, storage_offset: int, shape, stride, itemsize: int) -> Tuple[int, int]:
    """Bytes ``[first, end)`` of a file that a strided view over a storage starting at byte ``offset`` touches."""
    if any(d == 0 for d in shape):
        start = offset + storage_offset * itemsize
        return start, start
    last = storage_offset + sum((d - 1) * s for d, s in zip(shape, stride))
    return offset + storage_offset * itemsize, offset + (last + 1) * itemsize


class ChunkProof:
    """The chunk digests of one manifest entry (``chunk_bytes``, the digest list, the size the file had),
    checked lazily against the file as it is now: a chunk is ``True`` (verifies), ``False`` (differs) or
    ``None`` (the file ends before the chunk ends).  Each chunk is read once."""

    def __init__(self, path: str, entry: dict):
        self.path = path
        self.chunk_bytes = int(entry["chunk_bytes"])
        self.size = int(entry["size_bytes"])
        self.algorithm, self.digests = next(((a, [str(d).lower() for d in entry[k]]) for a, k in FIELDS.items()
                                             if isinstance(entry.get(k), list)))
        self.have = os.path.getsize(path) if os.path.exists(path) else 0
        self._known: Dict[int, Optional[bool]] = {}

    @classmethod
    def of(cls, path: str, entry: Optional[dict]) -> Optional["ChunkProof"]:
        """The proof for ``entry`` when it records usable chunk digests, else None."""
        if not entry or not isinstance(entry.get("chunk_bytes"), int) or entry["chunk_bytes"] < 1 \
                or not isinstance(entry.get("size_bytes"), int):
            return None
        if not any(isinstance(entry.get(k), list) for k in FIELDS.values()):
            return None
        proof = cls(path, entry)
        return proof if len(proof.digests) == -(-proof.size // proof.chunk_bytes) else None

    def chunk(self, i: int) -> Optional[bool]:
        if i not in self._known:
            start, end = i * self.chunk_bytes, min((i + 1) * self.chunk_bytes, self.size)
            if i < 0 or i >= len(self.digests) or end > self.have:  # past the file, or past what was recorded
                self._known[i] = None
            else:
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    self._known[i] = digest_range(fd, start, end - start, self.algorithm) == self.digests[i]
                finally:
                    os.close(fd)
        return self._known[i]

    @property
    def kind(self) -> str:
        """The :data:`PROOFS` key of these digests."""
        return f"manifest_{self.algorithm}"

    def span(self, first: int, end: int) -> Tuple[Optional[bool], str]:
        """``(verdict, words)`` for bytes ``[first, end)``: True when every chunk they touch verifies, False
        when one differs, None when one is beyond the end of the file."""
        if end <= first:
            return True, "empty"
        idx = range(first // self.chunk_bytes, (end - 1) // self.chunk_bytes + 1)
        got = [self.chunk(i) for i in idx]
        name = SAID[self.algorithm]
        if any(g is False for g in got):
            bad = [i for i, g in zip(idx, got) if g is False]
            return False, f"manifest {name} chunk digest differs (chunk {', '.join(map(str, bad[:5]))})"
        if any(g is None for g in got):
            return None, "the file ends inside the manifest chunk(s) that hold it, or they lie past what it records"
        return True, f"manifest {name} chunk digest ({len(got)} chunk(s) of {self.chunk_bytes} bytes)"

    def failed(self) -> List[int]:
        """Indices of the chunks known so far to differ."""
        return sorted(i for i, g in self._known.items() if g is False)


class WholeDigest:
    """The whole-file SHA-256 digests recorded for one file (its manifest entry's ``sha256_hex``, its ``.sha256``
    sidecar, ``integrity.json``), checked against the file once, when first asked: True when the file's
    SHA-256 equals each of them, False when one differs, None when none is recorded or the file cannot be read.
    A mismatch says only that some byte changed, never which: it proves nothing about any one tensor."""

    def __init__(self, path: str, recorded: List[Tuple[str, str]]):
        self.path, self.recorded = path, [(k, h.lower()) for k, h in recorded if isinstance(h, str)]
        self._verdict: Optional[Tuple[Optional[bool], str, str]] = None

    def check(self) -> Tuple[Optional[bool], str, str]:
        """``(verdict, words, proof kind)`` (:data:`PROOFS`)."""
        if self._verdict is None:
            self._verdict = self._check()
        return self._verdict

    def _check(self) -> Tuple[Optional[bool], str, str]:
        if not self.recorded:
            return None, "no whole-file digest recorded", ""
        h = hashlib.sha256()
        try:
            with open(self.path, "rb") as f:
                for piece in iter(lambda: f.read(4 << 20), b""):
                    h.update(piece)
        except OSError as e:
            return None, f"the file cannot be read ({e.strerror or e})", ""
        got = h.hexdigest()
        bad = [k for k, want in self.recorded if want != got]
        kind = self.recorded[0][0]
        if bad:
            return False, (f"the file's SHA-256 differs from the one its {_SAID_WHOLE[bad[0]]} records: a byte "
                           "changed, where is not known"), bad[0]
        return True, f"the whole file's SHA-256 as its {_SAID_WHOLE[kind]} records", kind


_SAID_WHOLE = {"sha256_manifest": "manifest entry", "sha256_sidecar": ".sha256 sidecar",
               "sha256_integrity_json": "integrity.json"}


@dataclass
class FileProof:
    """What recorded at save time can check one data file: its manifest chunk digests (``chunks``) and its
    whole-file SHA-256 (``whole``).  The chunk digests decide where they exist (they locate a change); the
    whole-file digest only where there are none."""

    chunks: Optional[ChunkProof] = None
    whole: Optional[WholeDigest] = None

    def region(self, first: int, end: int) -> Tuple[Optional[bool], str, str]:
        """``(verdict, words, proof kind)`` for bytes ``[first, end)`` of the file: by the chunk digests, else by
        the whole-file digest (whose mismatch is None here: it does not say these bytes changed), else
        ``(None, "", "")``."""
        if end <= first:
            return True, "no bytes to check (zero elements)", "empty"
        if self.chunks is not None:
            ok, words = self.chunks.span(first, end)
            return ok, words, self.chunks.kind
        if self.whole is not None:
            ok, words, kind = self.whole.check()
            return (True if ok else None), words, kind
        return None, "", ""


def regular_file(p: Path) -> bool:
    """Whether ``p`` itself (not what a link names) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(p).st_mode)
    except OSError:
        return False


def file_proof(path: Path, entry: Optional[dict], integrity_sha256: Optional[str] = None) -> FileProof:
    """What recorded at save time checks the data file ``path``: the chunk digests of its manifest ``entry``,
    and the whole-file SHA-256 of that entry (``sha256_hex``), of its ``<name>.sha256`` sidecar (the first
    word of its first line, as ``sha256sum -c`` reads it; a link is never followed) and of ``integrity.json``
    (``integrity_sha256``)."""
    recorded = []
    if entry and isinstance(entry.get("sha256_hex"), str):
        recorded.append(("sha256_manifest", entry["sha256_hex"]))
    side = path.with_name(path.name + ".sha256")
    if regular_file(side):
        try:
            with open(side, "rb") as f:
                word = f.read(4096).split(b"\n", 1)[0].split()[:1]
            if word and len(word[0]) == 64:
                recorded.append(("sha256_sidecar", word[0].decode("ascii", "replace")))
        except OSError:
            pass
    if integrity_sha256:
        recorded.append(("sha256_integrity_json", integrity_sha256))
    return FileProof(chunks=ChunkProof.of(str(path), entry),
                     whole=WholeDigest(str(path), recorded) if recorded else None)


def integrity_digests(folder: Path) -> Dict[str, str]:
    """{bare name: SHA-256 hex} that the folder's Megatron ``integrity.json`` records ({} without one)."""
    from ..formats.integrity_json import NAME, parse

    p = folder / NAME
    if not regular_file(p):
        return {}
    try:
        from .. import fs

        return parse(fs.read_bounded(p, fs.SMALL_FILE_BYTES)).digests
    except OSError:
        return {}


def counts(tensors: List[TensorBytes]) -> Dict[str, int]:
    """``{status: number of tensors}`` over the four statuses of the unit's own tensors."""
    out = {INTACT: 0, LOST: 0, UNPROVEN: 0, SUSPECT: 0}
    for t in tensors:
        out[t.status] = out.get(t.status, 0) + 1
    return out


def is_optimizer_state(name: str) -> bool:
    """Whether a tensor path lies in an optimizer state_dict's ``state`` (``optimizer.state.3.exp_avg``,
    ``optimizer_states.0.state.0.exp_avg_sq``): the component ``state`` followed by a parameter index, the
    shape ``torch.optim.Optimizer.state_dict`` gives it."""
    parts = name.split(".")
    return any(p == "state" and i + 1 < len(parts) and parts[i + 1].isdigit() for i, p in enumerate(parts))
