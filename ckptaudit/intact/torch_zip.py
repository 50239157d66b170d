"""The tensors of a damaged ``torch.save`` zip, each with its proof.

``torch.save`` writes ``<prefix>/data.pkl`` first, then one stored (uncompressed) record per storage,
``<prefix>/data/<key>``, each followed by a data descriptor holding its CRC-32 (the records set flag bit 3:
the local header carries no CRC; PyTorch ``caffe2/serialize/inline_container.cc``, miniz ``mz_zip_writer``),
and the central directory last.  A cut or a zeroed block leaves data.pkl and every record before the damage
readable: :func:`ckptaudit.formats.torchzip.check_zip` walks the records (through the central directory when
it is there, else from the local headers) and checks each CRC; the static walk of data.pkl
(:func:`ckptaudit.pickle_walk.walk`, no unpickling) names every tensor with its storage, dtype, shape,
stride and offset.  A tensor is intact when its storage's record is complete and its CRC verifies, or when
the manifest's chunk digests cover its bytes and verify.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..formats.torchzip import check_zip
from ..pickle_walk import walk
from ..pickle_walk.dtypes import dtype_itemsize
from ..pickle_walk.model import TensorMeta
from .proof import INTACT, LOST, ChunkProof, TensorBytes, is_optimizer_state, view_span


def tensors(path: str, file: str, chunks: Optional[ChunkProof]
            ) -> Tuple[List[TensorBytes], str, str, Optional[int]]:
    """``(tensors, problem, weights prefix, step)``: every tensor data.pkl names, with ``status`` and ``proof``
    set; ``problem`` is why none can be named ("" when data.pkl was read); the prefix is the key of the saved
    dict that holds the model's state_dict (:func:`weights_prefix`); the step is :func:`saved_step` of the
    saved dict.  ``file``: the name the report gives ``path``.  Reads every byte of ``path`` once (the CRC pass)
    and data.pkl's again."""
    rep = check_zip(path, display=file, verify_crc=True)
    if rep.data_pkl is None:
        return [], "data.pkl is missing or damaged: no tensor of this file can be named", "", None
    res = walk(rep.data_pkl)
    if res.error and not res.tensors:
        return [], f"data.pkl could not be walked: {res.error}", "", None
    prefix = f"{rep.prefix}/" if rep.prefix else ""
    records = {m.name[len(prefix) + len("data/"):]: m for m in rep.members
               if m.name.startswith(prefix + "data/")}
    out: List[TensorBytes] = []
    for name, meta in res.tensors:
        itemsize = dtype_itemsize(meta.dtype, meta.storage.itemsize)
        m = records.get(str(meta.storage.key))
        offset = m.data_offset if m is not None else 0
        t = TensorBytes(name=name, file=file, path=path, dtype=meta.dtype, shape=tuple(meta.shape),
                        stride=tuple(meta.stride), offset=offset, storage_offset=meta.storage_offset,
                        itemsize=itemsize, span=view_span(offset, meta.storage_offset, meta.shape, meta.stride,
                                                          itemsize))
        t.status, t.proof = _judge(t, m, meta.storage.nbytes, chunks)
        out.append(t)
    return out, "", weights_prefix(res.obj, out), saved_step(res.obj)


def saved_step(root) -> Optional[int]:
    """The step a saved dict records at its top level under one of the usual step keys
    (:data:`ckptaudit.components.STEP_KEYS`: nanoGPT's ``iter_num``, Lightning's ``global_step``, …), or None."""
    from ..components import STEP_KEYS

    if not isinstance(root, dict):
        return None
    for k in STEP_KEYS:
        v = root.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return None


def weights_prefix(root, tensors: List[TensorBytes]) -> str:
    """The key of the saved dict ``root`` (the walked object) under which the model's state_dict lies, by shape:
    "" for a flat state_dict (tensors at the top); else the dict-valued key, not an optimizer state_dict
    (``state`` and ``param_groups``), holding the most tensor bytes outside optimizer state.  Tensors at the top
    level (a flat state_dict, or an RNG state saved beside the model's dict) count for "" by their bytes: a
    top-level ``rng`` tensor does not make a nested model state_dict flat."""
    if not isinstance(root, dict):
        return ""
    top = {k for k, v in root.items() if type(v) is TensorMeta}
    best, most = "", sum(t.nbytes for t in tensors if t.name in top)
    for k, v in root.items():
        if not isinstance(k, str) or not isinstance(v, dict) or ("state" in v and "param_groups" in v):
            continue
        n = sum(t.nbytes for t in tensors if t.name.startswith(k + ".") and not is_optimizer_state(t.name))
        if n > most:
            best, most = k, n
    return best


def _judge(t: TensorBytes, m, storage_nbytes: Optional[int], chunks: Optional[ChunkProof]) -> Tuple[str, str]:
    """Status and proof of tensor ``t`` whose storage is record ``m`` (None: no complete record)."""
    if m is None or not m.complete:
        return LOST, "its storage record was never completely written (the file ends before it)"
    if m.method != 0:
        return LOST, f"its storage record is compressed (method {m.method}): torch writes stored records"
    if t.span[1] > m.data_offset + m.size_bytes or (storage_nbytes is not None and storage_nbytes > m.size_bytes):
        return LOST, "its storage record is shorter than the storage data.pkl declares"
    if chunks is not None:
        ok, words = chunks.span(*t.span)
        if ok is True:
            return INTACT, words
        if ok is False:
            return LOST, words
    if m.crc_ok is True and m.header_ok:
        return INTACT, f"zip record CRC-32 {m.crc32:08x} of data/{m.name.rsplit('/', 1)[-1]}"
    if m.crc_ok is False:
        return LOST, f"zip record CRC-32 differs (recorded {m.crc32:08x}, read {m.crc_actual or 0:08x})"
    if m.size_bytes == 0:
        return INTACT, "empty storage"
    return LOST, "its storage record's CRC-32 could not be checked (damaged header or descriptor)"
