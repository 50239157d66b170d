"""The tensors of a damaged torch.distributed.checkpoint (DCP) folder, each with its proof.

``.metadata`` (read by a static walk, :func:`ckptaudit.layouts.dcp.read_metadata`) gives each tensor's dtype,
global size and chunks (``ChunkStorageMetadata``: offsets and sizes), and each chunk's place: a byte range of a
``__<rank>_<n>.distcp`` file (``_StorageInfo``).  With the default ``SerializationFormat.TORCH_SAVE`` each chunk
is a whole ``torch.save`` zip of that chunk (torch ``distributed/checkpoint/filesystem.py``, ``_write_item``),
so its record carries a CRC-32 (checked by ``zipfile``, which raises on a mismatch).  A tensor is intact when
every chunk's blob is there and verifies; a missing rank file, a cut one or a changed chunk loses the tensors
with a chunk there.  An intact tensor is assembled from its chunks when it is written (memory: one tensor and
one chunk).  Non-tensor items (``torch.save`` of any object) are never unpickled and not salvaged.

A folder with Megatron-Core's ``integrity.json`` (:mod:`ckptaudit.formats.integrity_json`) has a SHA-256 of each whole
rank file: a tensor with a chunk in a file whose digest differs is lost (the CRC-32 of each record cannot tell a file
copied from another iteration, whose records all verify, from the one saved), and a tensor all of whose files verify
names that digest in its proof.
"""

from __future__ import annotations

import io
import math
import os
import stat
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..formats.integrity_json import NAME, verify_folder
from ..layouts.dcp import dtype_name, item_fqn, read_metadata, state_fields
from ..pickle_walk import walk
from ..pickle_walk.dtypes import dtype_itemsize
from .proof import INTACT, LOST, SAFETENSORS_DTYPE, FileProof, TensorBytes, file_proof, row_major, strided_bytes

#: the file name the report gives the tensors of a DCP folder (their bytes span every rank's file)
FILE = "dcp"


def is_dcp(folder: Path) -> bool:
    return (folder / ".metadata").exists() or any(n.endswith(".distcp") for n in os.listdir(folder))


def tensors(folder: Path, cfg: dict) -> Tuple[List[TensorBytes], str, int]:
    """``(tensors, problem, non-tensor items)`` of the DCP folder, each tensor with status and proof."""
    sdm, storage, problem = read_metadata(folder, str(folder / ".metadata"), cfg)
    if sdm is None:
        return [], problem, 0
    places: Dict[Tuple[str, tuple], dict] = {}
    for idx, info in storage.items():
        i, s = state_fields(idx), state_fields(info)
        if isinstance(i, dict) and isinstance(s, dict):
            places[(item_fqn(idx), tuple(i.get("offset") or ()))] = s
    sealed, _problem = verify_folder(folder)  # {rank file: True / False / None}, {} without integrity.json
    names = _metadata_proof(folder, sealed)  # .metadata: every tensor's name, dtype, size, chunks and their places
    out: List[TensorBytes] = []
    n_bytes_items = 0
    for fqn, md in sdm.items():
        st = state_fields(md)
        if not (isinstance(st, dict) and "size" in st):
            n_bytes_items += 1
            continue
        dtype = dtype_name(st.get("properties")).removeprefix("torch.")
        shape = tuple(int(d) for d in st["size"])
        chunks = [state_fields(c) for c in st.get("chunks") or []]
        itemsize = dtype_itemsize(dtype, 0)
        t = TensorBytes(name=str(fqn), file=FILE, path=str(folder), dtype=dtype, shape=shape,
                        stride=tuple(row_major(shape)), offset=0, storage_offset=0, itemsize=itemsize, span=(0, 0))
        parts = []
        for c in chunks:
            offsets = tuple(c.get("offsets") or ())
            parts.append((offsets, tuple(c.get("sizes") or ()), places.get((str(fqn), offsets))))
        if names[0] is False:
            t.status, t.proof = LOST, f".metadata, which names every tensor and places its chunks, changed: {names[1]}"
        else:
            t.status, t.proof = _judge(folder, parts, dtype, sealed)
        if t.status == INTACT:
            t.proof += f"; .metadata: {names[1]}"
            t.proven_by = {"identity": names[2], "bytes": "sha256_integrity_json" if "SHA-256 of" in t.proof
                           else "zip_crc32"}
        if t.status == INTACT and dtype in SAFETENSORS_DTYPE:
            t.load = _loader(folder, shape, dtype, parts)
        out.append(t)
    return out, "", n_bytes_items


def _metadata_proof(folder: Path, sealed: Dict[str, Optional[bool]]) -> Tuple[Optional[bool], str, str]:
    """``(verdict, words, proof kind)`` of ``.metadata``: by ``integrity.json``'s SHA-256 (``sealed``), else by a
    ckptaudit manifest's digests of it; without either it has no checksum, and each chunk is only cross-checked
    (its blob's own CRC-checked data.pkl must agree on dtype and shape: :func:`_chunk`)."""
    from ..formats.manifest_entries import load_manifest

    if sealed.get(".metadata") is not None:
        ok = bool(sealed[".metadata"])
        return ok, (f"its SHA-256 as {NAME} records" if ok else f"its SHA-256 differs from the one {NAME} records"), \
            "sha256_integrity_json"
    path = folder / ".metadata"
    proof: FileProof = file_proof(path, load_manifest(folder / "manifest.json").get(".metadata"))
    if proof.chunks is not None or proof.whole is not None:
        ok, words, kind = proof.region(0, os.path.getsize(path))
        if ok is None and proof.chunks is None:
            ok, words, kind = proof.whole.check()  # a whole-file mismatch of .metadata: the names changed
        if ok is not None:
            return ok, words, kind
    return None, ("no checksum covers it; each chunk's dtype and shape agree with its blob's CRC-checked data.pkl, "
                  "its name and place in the tensor are unchecked"), "dcp_blob_crosscheck"


def _judge(folder: Path, parts, dtype: str, sealed: Dict[str, Optional[bool]]) -> Tuple[str, str]:
    """``(status, proof)`` of a tensor from its chunks ``parts``; ``sealed``: the rank files' ``integrity.json``
    verdicts (:func:`ckptaudit.formats.integrity_json.verify_folder`)."""
    if not parts:
        return LOST, ".metadata lists no chunk of it"
    files = set()
    for offsets, sizes, place in parts:
        if place is None:
            return LOST, f"no storage item for its chunk at {list(offsets)}"
        relp = str(place.get("relative_path"))
        if sealed.get(relp) is False:
            return LOST, (f"chunk at {list(offsets)} in {relp}: the file's SHA-256 differs from the one {NAME} records "
                          "(changed after the save; a copy from another iteration keeps every CRC-32)")
        _, why = _chunk(folder, place, sizes, dtype)
        if why:
            return LOST, f"chunk at {list(offsets)} in {relp}: {why}"
        files.add(relp)
    also = f"; SHA-256 of {', '.join(sorted(files))} as {NAME} records" if all(sealed.get(f) for f in files) else ""
    return INTACT, f"zip record CRC-32 of each of its {len(parts)} chunk blob(s){also}"


def _chunk(folder: Path, place: dict, sizes, dtype: str) -> Tuple[Optional[bytes], str]:
    """``(the chunk's elements as contiguous bytes, "")`` or ``(None, why it is lost)``."""
    relp, off, length = str(place.get("relative_path")), place.get("offset"), place.get("length")
    path = folder / relp
    if not isinstance(off, int) or not isinstance(length, int) or "/" in relp or relp.startswith("."):
        return None, "its storage place is not a file of the folder with an offset and a length"
    if not path.is_file():
        return None, f"{relp} is missing (that rank's file was never written or was removed)"
    if not stat.S_ISREG(os.lstat(path).st_mode):
        return None, f"{relp} is a symbolic link or no regular file: never opened (it may lead out of the run)"
    with open(path, "rb") as f:
        f.seek(off)
        blob = f.read(length)
    if len(blob) < length:
        return None, f"{relp} ends at byte {off + len(blob)}, before the chunk's end at {off + length}"
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            names = z.namelist()
            pkl = next(n for n in names if n.endswith("/data.pkl") or n == "data.pkl")
            res = walk(z.read(pkl))
            if res.error or len(res.tensors) != 1:
                return None, "the blob's data.pkl does not describe one tensor"
            meta = res.tensors[0][1]
            prefix = pkl[: -len("data.pkl")]
            data = z.read(f"{prefix}data/{meta.storage.key}")  # zipfile checks the record's CRC-32
    except (zipfile.BadZipFile, StopIteration, KeyError, OSError, ValueError) as e:
        return None, f"its torch.save blob does not verify ({type(e).__name__}: {e})"
    if tuple(meta.shape) != tuple(sizes) or meta.dtype != dtype:
        return None, f"the blob holds {meta.dtype} {list(meta.shape)}, .metadata says {dtype} {list(sizes)}"
    item = dtype_itemsize(dtype, 0)
    n = math.prod(sizes)
    want = row_major(sizes)
    if all(s == w or d == 1 for s, w, d in zip(meta.stride, want, sizes)):
        start = meta.storage_offset * item
        piece = data[start:start + n * item]
        return (piece, "") if len(piece) == n * item else (None, "the blob's storage is shorter than the chunk")
    try:
        return strided_bytes(data[meta.storage_offset * item:], sizes, meta.stride, item), ""
    except ValueError as e:
        return None, f"the blob's storage does not hold the chunk ({e})"


def _loader(folder: Path, shape, dtype: str, parts):
    def load() -> bytes:
        import torch

        whole = torch.empty(shape, dtype=getattr(torch, dtype))
        for offsets, sizes, place in parts:
            raw, why = _chunk(folder, place, sizes, dtype)
            if raw is None:
                raise ValueError(f"{folder}: a chunk changed while salvaged: {why}")
            piece = torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).view(sizes) if raw else \
                torch.empty(sizes, dtype=getattr(torch, dtype))
            whole[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] = piece
        return whole.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return load
