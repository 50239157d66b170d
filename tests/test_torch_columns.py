"""Issue 45, memory by columns for torch files: the forms that replace a Python object per record and per memo slot
give the same facts as before on real ``torch.save`` files.

Guards against the hash and scan jobs of a 300,000-tensor checkpoint holding every rebuild's arguments through the
walk's memo (673 / 463 MiB), and against the columns saying something other than ``zipfile`` and the full walk.
"""

from __future__ import annotations

import io
import struct
import zipfile

import pytest

from ckptaudit import pickle_walk
from ckptaudit.pickle_walk import machine
from ckptaudit.pickle_walk.opcodes import genops, memo_reads

torch = pytest.importorskip("torch")


def _checkpoint(path, n: int = 300) -> bytes:
    """A torch.save of ``n`` parameters with AdamW's state (each tensor its own storage, as a training loop writes
    them); returns data.pkl's bytes."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(i % 3 + 1, 2)) for i in range(n)]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    opt.step()
    torch.save({"model": {f"layers.{i}.w": p.detach() for i, p in enumerate(params)},
                "optimizer": opt.state_dict(), "iter_num": 7}, path)
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


def test_the_zip_records_as_columns_are_zipfiles_records(tmp_path):
    """The hash stage's plan holds a zip's records as a names buffer and numpy columns (``onepass.plan._records``):
    every name, data offset, size and CRC-32 of a few hundred members equals ``zipfile``'s."""
    from ckptaudit.formats.zip.central import find_central_directory
    from ckptaudit.formats.zip.reader import ArchiveFile
    from ckptaudit.onepass.plan import _records

    path = tmp_path / "ckpt.pt"
    _checkpoint(path)
    fh = ArchiveFile(str(path), window=1 << 16, prefetch=False)
    try:
        rec = _records(fh, find_central_directory(fh), remote=False)
    finally:
        fh.close()
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
    raw = path.read_bytes()
    assert len(infos) > 600 and rec.names.to_pylist() == [i.filename for i in infos]
    data_at = []
    for i in infos:  # the local header's own name and extra lengths say where the data starts
        nlen, xlen = struct.unpack_from("<HH", raw, i.header_offset + 26)
        data_at.append(i.header_offset + 30 + nlen + xlen)
    assert rec.data_offset.tolist() == data_at
    assert rec.usize.tolist() == [i.file_size for i in infos]
    assert rec.csize.tolist() == [i.compress_size for i in infos]
    assert rec.crc.tolist() == [i.CRC for i in infos]
    assert rec.method.tolist() == [i.compress_type for i in infos]
    assert rec.prefix == infos[0].filename.split("/", 1)[0]
    rows = rec.rows_of([infos[5].filename, "no/such/record", infos[0].filename])
    assert rows.tolist() == [5, -1, 0]


def test_memo_reads_are_the_slots_genops_reads(tmp_path):
    """``memo_reads`` names exactly the slots a ``genops`` decode of a real data.pkl reads, and gives up (None)
    where it cannot tell them: a protocol-0 ``GET``, a stream cut before its ``STOP``."""
    import pickle

    data = _checkpoint(tmp_path / "ckpt.pt")
    got = {arg for op, arg, _ in genops(data, io.BytesIO(data)) if op.name in ("BINGET", "LONG_BINGET")}
    reads = memo_reads(data)
    assert reads == got and 0 < len(reads) < 50
    assert memo_reads(data[:-1]) is None
    shared = [1, 2]
    assert memo_reads(pickle.dumps([shared, shared], protocol=0)) is None  # read back with a text GET


def test_a_walk_that_forgets_unread_slots_describes_the_same_checkpoint(tmp_path, monkeypatch):
    """The walk of a data.pkl with its memo keeping only the slots the stream reads lists the same tensors (names,
    storages, dtypes, shapes, strides, offsets, parameters), imports and tree as the walk that keeps every slot."""
    from ckptaudit.layouts.tree import prune

    data = _checkpoint(tmp_path / "ckpt.pt")

    def described(res):
        tensors = [(name, tm.storage.key, tm.storage.dtype, tm.storage.numel, tm.dtype, tm.shape, tm.stride,
                    tm.storage_offset, tm.is_parameter, tm.requires_grad) for name, tm in res.tensors]
        return tensors, [str(g) for g in res.globals], res.tricks, res.error, res.n_ops, prune(res.obj, {})

    monkeypatch.setattr(machine, "FORGET_UNREAD_FROM_BYTES", 1 << 62)
    kept = described(pickle_walk.walk(data))
    monkeypatch.setattr(machine, "FORGET_UNREAD_FROM_BYTES", 0)
    forgot = described(pickle_walk.walk(data))
    assert kept == forgot and len(kept[0]) > 900 and kept[3] is None


def test_a_rebound_slot_that_nothing_reads_is_still_a_trick(monkeypatch):
    """A slot written twice is told as a trick whether or not the walk kept what it held."""
    monkeypatch.setattr(machine, "FORGET_UNREAD_FROM_BYTES", 0)
    data = b"\x80\x02X\x01\x00\x00\x00aq\x00X\x01\x00\x00\x00bq\x00\x86."  # 'a' PUT 0, 'b' PUT 0, TUPLE2
    r = pickle_walk.walk(data)
    assert r.obj == ("a", "b")
    assert r.tricks == ["memo slot 0 rebound at byte 16 (BINPUT): was <unread>, now 'b'"]


def test_the_plan_walk_without_paths_lists_the_same_tensors(tmp_path):
    """``walk(tensor_paths=False)`` (the hash stage's plan) lists every tensor the named walk lists, unnamed."""
    data = _checkpoint(tmp_path / "ckpt.pt")
    named = pickle_walk.walk(data)
    bare = pickle_walk.walk(data, tensor_paths=False)
    key = lambda tm: (tm.storage.key, tm.storage_offset, tm.shape, tm.dtype)  # noqa: E731
    assert sorted(key(t) for _, t in bare.tensors) == sorted(key(t) for _, t in named.tensors)
    assert {n for n, _ in bare.tensors} == {""}


def test_a_small_archives_name_lookup_answers_as_the_large_ones(monkeypatch):
    """Records of up to 4,096 names are looked up in a dict, larger ones through pyarrow: the same rows, the last
    record of a repeated name, -1 for an absent one, a record added later found."""
    import numpy as np
    import pyarrow as pa

    from ckptaudit.formats.zip import records as R
    from ckptaudit.formats.zip.reader import Member
    from ckptaudit.onepass import plan

    names = ["a/data.pkl", "a/data/0", "a/data/1", "a/data/0", "a/é", "a/version"]
    recs = R.Records.of(Member(name=n, header_offset=i, data_offset=i, size_bytes=1, crc32=0)
                        for i, n in enumerate(names))
    cols = plan._Records(pa.array(names), *(np.arange(len(names)),) * 5, prefix="a")
    asked = ["a/data/0", "nope", "a/é", "a/data.pkl"]
    small = [recs.rows_of(asked).tolist(), recs.rows_of(pa.array(asked)).tolist(), cols.rows_of(asked).tolist()]
    recs.append(Member(name="a/late", header_offset=9, data_offset=9, size_bytes=1, crc32=0))
    late = recs.rows_of(["a/late"]).tolist()
    monkeypatch.setattr(R, "DICT_ROWS", 0)
    monkeypatch.setattr(plan, "DICT_ROWS", 0)
    cols = plan._Records(pa.array(names), *(np.arange(len(names)),) * 5, prefix="a")
    large = [recs.rows_of(asked).tolist(), recs.rows_of(pa.array(asked)).tolist(), cols.rows_of(asked).tolist()]
    assert small == large == [[3, -1, 4, 0]] * 3 and late == recs.rows_of(["a/late"]).tolist() == [6]


def test_the_first_names_of_an_archive_are_its_names_in_order():
    """``Records.name_list(first)``: the first names as ``names`` gives them, ASCII or not, none past the end."""
    from ckptaudit.formats.zip import records as R
    from ckptaudit.formats.zip.reader import Member

    names = ["a/data.pkl", "a/é", "a/data/0"]
    recs = R.Records.of(Member(name=n, header_offset=0, data_offset=0, size_bytes=1, crc32=0) for n in names)
    assert [recs.name_list(k) for k in (0, 1, 2, 9)] == [[], names[:1], names[:2], names]
    assert recs.name_list() == list(recs.names) == names and R.Records().name_list() == []
