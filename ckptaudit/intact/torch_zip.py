"""The tensors of a damaged ``torch.save`` zip, each with its proof.

``torch.save`` writes ``<prefix>/data.pkl`` first, then one stored (uncompressed) record per storage,
``<prefix>/data/<key>``, each followed by a data descriptor holding its CRC-32 (the records set flag bit 3:
the local header carries no CRC; PyTorch ``caffe2/serialize/inline_container.cc``, miniz ``mz_zip_writer``),
and the central directory last.  A cut or a zeroed block leaves data.pkl and every record before the damage
readable: :func:`ckptaudit.formats.torchzip.check_zip` walks the records (through the central directory when
it is there, else from the local headers) and checks each CRC; the static walk of data.pkl
(:func:`ckptaudit.pickle_walk.walk`, no unpickling) names every tensor with its storage, dtype, shape,
stride and offset.

A tensor's *identity* is data.pkl (its name, dtype, shape, stride, storage key and offset) and the name of the
record that holds its storage; its *bytes* are that record's.  data.pkl is proven by its record's CRC-32 or by
the manifest chunks that hold it; a record's name by the chunks that hold its local header, else by its local
header and central-directory entry agreeing (a walk without the central directory requires each name to occur
once).  The bytes are proven by the manifest chunks they touch, else by the record's CRC-32: per record the
strongest proof that verifies decides, so a record whose CRC-32 verifies inside a chunk whose digest differs
is still intact when the change there is *located* (another record of that chunk fails its CRC-32, or its
local header disagrees with the central directory: :class:`_Located`); a chunk that differs with no such
record may hold a change in the bytes no CRC-32 covers (names, offsets), and nothing in it is proven by
CRC-32.  A view whose own bytes lie in verified chunks is intact although its storage's CRC-32 fails (the
change lies elsewhere in the storage).  Without chunk digests, a whole-file SHA-256 that verifies proves every
byte.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from ..formats.torchzip import check_zip
from ..pickle_walk import walk
from ..pickle_walk.budgets import ops_for
from ..pickle_walk.dtypes import dtype_itemsize
from ..pickle_walk.model import TensorMeta
from ..pickle_walk.salvage import tensor_key_paths
from .proof import INTACT, LOST, UNPROVEN, FileProof, TensorBytes, is_optimizer_state, view_span

#: (verdict, words, proof kind) of one region, as :meth:`FileProof.region` gives it
Verdict = Tuple[Optional[bool], str, str]


def tensors(path: str, file: str, proof: FileProof
            ) -> Tuple[List[TensorBytes], str, str, Optional[int]]:
    """``(tensors, problem, weights prefix, step)``: every tensor data.pkl names, with ``status`` and ``proof``
    set; ``problem`` is why none can be named, or that the walk named only some ("" when data.pkl was read
    whole); the prefix is the key of the saved
    dict that holds the model's state_dict (:func:`weights_prefix`); the step is :func:`saved_step` of the
    saved dict.  ``file``: the name the report gives ``path``.  Reads every byte of ``path`` once (the CRC pass)
    and data.pkl's again."""
    rep = check_zip(path, display=file, verify_crc=True)
    if rep.data_pkl is None:
        return [], "data.pkl is missing or damaged: no tensor of this file can be named", "", None
    # the scan's budget for this data.pkl (more opcodes for more records): salvage names the tensors the scan named
    res = walk(rep.data_pkl, max_ops=ops_for(len(rep.members)))
    if res.error and not res.tensors:
        return [], f"data.pkl could not be walked: {res.error}", "", None
    partial = (f"data.pkl's walk stopped at its work budget ({res.error}): only the {len(res.tensors)} tensors named "
               f"before the cut are listed, so its shares leave the rest out") if res.budget_exhausted else ""
    prefix = f"{rep.prefix}/" if rep.prefix else ""
    records, twice = {}, set()
    for m in rep.members:
        if m.name.startswith(prefix + "data/"):
            key = m.name[len(prefix) + len("data/"):]
            if key in records and not rep.has_central_directory:
                twice.add(key)  # read from local headers alone, a name met twice names neither record
            records[key] = m
    located = _Located(rep, proof)
    pkl = _pkl_proof(rep, prefix, proof, located)
    order = _byte_order(path, rep, prefix, proof)
    parts = [p for p, _ in tensor_key_paths(res.obj, [meta for _, meta in res.tensors])]
    if len(parts) != len(res.tensors) or any(".".join(map(str, q)) != n for q, (n, _) in zip(parts, res.tensors)):
        parts = [(n,) for n, _ in res.tensors]  # never expected: the two walks are one
    out: List[TensorBytes] = []
    for (name, meta), path_parts in zip(res.tensors, parts):
        itemsize = dtype_itemsize(meta.dtype, meta.storage.itemsize)
        m = records.get(str(meta.storage.key))
        offset = m.data_offset if m is not None else 0
        t = TensorBytes(name=name, file=file, path=path, dtype=meta.dtype, shape=tuple(meta.shape),
                        stride=tuple(meta.stride), offset=offset, storage_offset=meta.storage_offset,
                        itemsize=itemsize, span=view_span(offset, meta.storage_offset, meta.shape, meta.stride,
                                                          itemsize), parts=tuple(path_parts))
        if not itemsize:
            t.status, t.proof = LOST, f"its dtype {meta.dtype!r} has no known element size"
        elif str(meta.storage.key) in twice:
            t.status, t.proof = LOST, (f"two records are named data/{meta.storage.key} and the central directory "
                                       "that would tell them apart is gone")
        else:
            t.status, t.proof, t.proven_by = _judge(t, m, meta.storage.nbytes, proof, pkl, located)
            if order is not None and t.status == INTACT:
                t.status, t.proof, t.proven_by = UNPROVEN, order, None
        out.append(t)
    return out, partial, weights_prefix(res.obj, out), saved_step(res.obj)


class _Located:
    """Which manifest chunks that differ have their change located by the zip's own checks: a chunk holding a
    record whose CRC-32 fails, or a local header that disagrees with the central directory.  Inside a chunk
    that differs, a record's CRC-32 stands as proof only when the chunk is located (:meth:`unlocated`)."""

    def __init__(self, rep, proof: FileProof):
        self.chunks = proof.chunks
        self.at = set()
        if self.chunks is None:
            return
        cb = self.chunks.chunk_bytes
        for m in rep.members:
            if m.crc_ok is False and m.data_offset >= 0:
                end = m.data_offset + max(m.compressed_size_bytes, 1)
                self.at.update(range(m.data_offset // cb, (end - 1) // cb + 1))
            if not m.header_ok:
                self.at.add(m.header_offset // cb)

    def unlocated(self, first: int, end: int) -> List[int]:
        """The chunks touching ``[first, end)`` whose digest differs and whose change is not located."""
        if self.chunks is None or end <= first:
            return []
        cb = self.chunks.chunk_bytes
        return [i for i in range(first // cb, (end - 1) // cb + 1)
                if self.chunks.chunk(i) is False and i not in self.at]


def _pkl_proof(rep, prefix: str, proof: FileProof, located: _Located) -> Verdict:
    """How data.pkl (every tensor's name, dtype, shape, stride, storage and offset) is proven: its record's bytes
    by the manifest chunks, else by its CRC-32 (``check_zip`` keeps data.pkl only when that did not fail)."""
    m = rep.members.find(prefix + "data.pkl")
    if m is None or m.data_offset < 0:
        return None, "data.pkl's record cannot be placed", ""
    ok, words, kind = proof.region(m.data_offset, m.data_offset + m.compressed_size_bytes)
    if ok:
        return True, f"data.pkl by {words}", kind
    bad = located.unlocated(m.header_offset, m.data_offset + m.compressed_size_bytes)
    if m.crc_ok is True and m.header_ok and not bad:
        return True, f"data.pkl by its zip record CRC-32 {m.crc32:08x}", "zip_crc32"
    if bad:
        return False, (f"data.pkl: manifest chunk {bad[0]} differs and no record's CRC-32 there says where "
                       "(the change may be in what its CRC-32 does not cover)"), ""
    return (False if ok is False else None), (f"data.pkl: {words}" if words else
                                              "data.pkl's CRC-32 was not recorded and nothing else checks it"), ""


def _byte_order(path: str, rep, prefix: str, proof: FileProof) -> Optional[str]:
    """None when the storages' bytes are little-endian as safetensors holds them (torch's ``byteorder`` record
    says ``little``, proven by its CRC-32 or the chunks, or is absent: torch then reads native order, and every
    machine torch builds for today is little-endian); else why no tensor of the file is proven as written."""
    m = rep.members.find(prefix + "byteorder")
    if m is None:
        return None
    if m.data_offset < 0 or not (m.crc_ok or proof.region(m.data_offset, m.data_offset + m.size_bytes)[0]):
        return "the byteorder record, which says how its bytes are read, is not proven (its CRC-32 fails or is absent)"
    with open(path, "rb") as f:  # a few bytes
        f.seek(m.data_offset)
        value = f.read(m.size_bytes)
    if value != b"little":
        return f"saved with byteorder {value[:8]!r}: salvage writes little-endian safetensors and does not convert"
    return None


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


def _judge(t: TensorBytes, m, storage_nbytes: Optional[int], proof: FileProof, pkl: Verdict, located: _Located
           ) -> Tuple[str, str, Optional[dict]]:
    """``(status, words, proven_by)`` of tensor ``t`` whose storage is record ``m`` (None: no complete record);
    ``pkl``: how data.pkl is proven (:func:`_pkl_proof`); ``located``: where the changes of differing chunks
    are known to lie."""
    if m is None or not m.complete:
        return LOST, "its storage record was never completely written (the file ends before it)", None
    if m.method != 0:
        return LOST, f"its storage record is compressed (method {m.method}): torch writes stored records", None
    if t.span[1] > m.data_offset + m.size_bytes or (storage_nbytes is not None and storage_nbytes > m.size_bytes):
        return LOST, "its storage record is shorter than the storage data.pkl declares", None
    if not m.header_ok or m.data_offset < 0:  # the entry leads to a record of another name, or to none
        return LOST, "its record's local header disagrees with the central directory: which storage it holds is " \
                     "not proven", None
    name_ok = proof.region(m.header_offset, m.data_offset)[0]  # the local header: the record's name
    if not name_ok and located.unlocated(m.header_offset, m.data_offset):
        return LOST, ("the manifest chunk holding its record's name differs and no record's CRC-32 there says where: "
                      "which storage it holds is not proven"), None
    if not pkl[0]:
        why = f"what names it is not proven: {pkl[1]}"
        return (LOST, why, None) if pkl[0] is False else (UNPROVEN, why, None)
    ok, words, kind = proof.region(*t.span)
    record = f"data/{m.name.rsplit('/', 1)[-1]}"
    if ok:
        return INTACT, f"{words}; {pkl[1]}", {"identity": pkl[2], "bytes": kind}
    bad = located.unlocated(m.header_offset, m.data_offset + m.compressed_size_bytes)
    if bad:
        return LOST, (f"manifest chunk {bad[0]} differs and no record's CRC-32 there says where: the change may be "
                      "in the bytes that name its record, which no CRC-32 covers"), None
    if m.crc_ok is True and m.header_ok:
        also = (f" ({words}; the change there lies in a record whose CRC-32 fails)") if ok is False else ""
        return INTACT, f"zip record CRC-32 {m.crc32:08x} of {record}{also}; {pkl[1]}", \
            {"identity": pkl[2], "bytes": "zip_crc32"}
    if ok is False:
        return LOST, words + (" and its record's CRC-32 differs" if m.crc_ok is False else ""), None
    if m.crc_ok is False:
        return LOST, f"zip record CRC-32 differs (recorded {m.crc32:08x}, read {m.crc_actual or 0:08x})", None
    if m.size_bytes == 0 or t.span[1] <= t.span[0]:
        return INTACT, f"no bytes to check (empty); {pkl[1]}", {"identity": pkl[2], "bytes": "empty"}
    return LOST, "its storage record's CRC-32 could not be checked (damaged header or descriptor)", None
