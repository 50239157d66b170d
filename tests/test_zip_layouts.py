"""One parse per zip layout in a hash job (ckptaudit.onepass.zip_layouts): torch's checkpoints of one model share
their records; a file whose structure bytes differ anywhere but in a CRC field is parsed itself; whatever the
bytes, a file given a layout's records gets the records a parse of its own gives."""

import io
import zipfile

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from ckptaudit.formats.zip.central import find_central_directory  # noqa: E402
from ckptaudit.onepass import plan as P  # noqa: E402
from ckptaudit.onepass.zip_layouts import ZipLayouts  # noqa: E402


def _checkpoint(step: int) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    for _ in range(2):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        sch.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sch.state_dict(),
            "iter_num": step, "rng": torch.get_rng_state()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Four checkpoints of one model saved by torch.save to paths of one name length (the archive folder is the
    file's stem): their bytes."""
    d = tmp_path_factory.mktemp("layouts")
    out = []
    for step in (300, 400, 500, 600):
        p = d / f"ckpt_{step}.pt"
        torch.save(_checkpoint(step), p)
        out.append(p.read_bytes())
    return out


def _parsed(data: bytes):
    """The records of a parse of ``data`` alone, as plain lists."""
    fh = P._MemFile("x.pt", data)
    cd = find_central_directory(fh)
    return None if not isinstance(cd, dict) else _as_lists(P._records(fh, cd, remote=False))


def _as_lists(rec):
    return (rec.names.to_pylist(), rec.data_offset.tolist(), rec.csize.tolist(), rec.usize.tolist(),
            rec.crc.tolist(), rec.method.tolist(), rec.prefix)


def _with_layout(layouts: ZipLayouts, data: bytes):
    """The plan of ``data`` made with ``layouts`` (a job's shared parses) and whether it took a layout's records."""
    from ckptaudit.onepass.pickle_templates import PickleTemplates

    t = PickleTemplates()
    t.zip_layouts = layouts
    hits = layouts.hits
    return P.plan_file("x.pt", data, templates=t), layouts.hits > hits


def test_checkpoints_of_one_model_share_one_parse(saved):
    layouts = ZipLayouts()
    got = [_with_layout(layouts, d) for d in saved]
    assert [hit for _, hit in got] == [False, True, True, True]
    for data, (plan, _) in zip(saved, got):
        fresh = P.plan_file("x.pt", data)
        assert plan.crc == fresh.crc and plan.tensor_data == fresh.tensor_data and plan.values == fresh.values
        assert len(plan.crc) == len(zipfile.ZipFile(io.BytesIO(data)).infolist())
        # each file's own CRC-32s (they differ between the steps), as zipfile reads them
        rec = layouts.records_of(data)
        assert rec.crc.tolist() == [i.CRC for i in zipfile.ZipFile(io.BytesIO(data)).infolist()]
        assert _as_lists(rec) == _parsed(data)
    assert len({tuple(layouts.records_of(d).crc.tolist()) for d in saved}) == 4


def test_a_changed_structure_byte_is_parsed_again(saved):
    layouts = ZipLayouts()
    _with_layout(layouts, saved[0])
    data = bytearray(saved[1])
    name = data.index(b"ckpt_400/data.pkl")  # the first local header's name
    data[name + 5] = ord("9")
    plan, hit = _with_layout(layouts, bytes(data))
    assert not hit and plan.crc == P.plan_file("x.pt", bytes(data)).crc


def test_a_local_header_stating_its_crc_keeps_no_layout():
    """A zip written without data descriptors states each CRC in its local header; its CRC fields then move a
    record (a disagreement leaves it unplaced), so no layout is kept."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", b"\x00" * 64)
    layouts = ZipLayouts()
    _with_layout(layouts, buf.getvalue())
    assert layouts.records_of(buf.getvalue()) is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_whatever_the_bytes_a_layouts_records_are_the_files_own(saved, data):
    """Bytes written at random places of a checkpoint of the same model (most of them among the bytes a layout
    compares or in its CRC fields): whenever the layout still gives the records, they are those its own parse
    gives, and its plan that of a plan made alone."""
    layouts = ZipLayouts()
    _with_layout(layouts, saved[0])
    t = layouts.held()[0]
    follower = bytearray(saved[1 + data.draw(st.integers(0, 2))])
    places = st.one_of(st.sampled_from(t.at.tolist()), st.sampled_from(t.crc_at.tolist()),
                       st.sampled_from(t.folder_at.ravel().tolist()), st.integers(0, len(follower) - 1))
    for at in data.draw(st.lists(places, min_size=1, max_size=4)):
        follower[at + data.draw(st.integers(0, 3)) if at + 3 < len(follower) else at] = data.draw(st.integers(0, 255))
    follower = bytes(follower)
    rec = layouts.records_of(follower)
    event("given the layout's records" if rec is not None else "parsed itself")
    if rec is not None:
        assert _as_lists(rec) == _parsed(follower)
        plan, hit = _with_layout(layouts, follower)
        fresh = P.plan_file("x.pt", follower)
        assert hit and plan.crc == fresh.crc and plan.tensor_data == fresh.tensor_data


# ----------------------------------------------------------------- the file layer's check of a follower

def _report(rep) -> tuple:
    return (list(rep.members), rep.prefix, list(rep.intact_members), [f.to_dict() for f in rep.findings],
            rep.data_pkl)


def _checked(files, shared: bool):
    """check_zip of each of ``files`` (paths) with the hash stage's facts: of one hash job and one ByteFacts for all
    (the scan job's: its zip layouts shared), or of a pass and a ByteFacts of each file alone; (reports, the scan's
    layouts' hits)."""
    from ckptaudit.formats.torchzip import check_zip
    from ckptaudit.onepass import facts
    from ckptaudit.onepass.filepass import pass_file
    from ckptaudit.onepass.pickle_templates import PickleTemplates

    job = PickleTemplates()  # the hash job's, shared by its passes (its zip layouts plan a follower)
    rows = [[r for r in facts.rows_of("u", p.name, pass_file(p, templates=job if shared else None))] for p in files]
    one = facts.load([r for rs in rows for r in rs], files[0].parent)
    got = [check_zip(p, display=p.name, facts=one if shared else facts.load(rs, p.parent))
           for p, rs in zip(files, rows)]
    return [_report(r) for r in got], one.zip_layouts.hits if shared else 0


def _written(tmp_path, saved, edit=None):
    """The saved checkpoints written back under their own names (the archive folder is each file's stem), the
    last one changed by ``edit`` (a function of its bytes)."""
    out = []
    for i, data in enumerate(saved):
        p = tmp_path / f"ckpt_{300 + 100 * i}.pt"
        p.write_bytes(edit(bytearray(data)) if edit and i == len(saved) - 1 else data)
        out.append(p)
    return out


def test_the_scan_checks_a_models_checkpoints_once_and_reports_each_as_its_own(tmp_path, saved):
    files = _written(tmp_path, saved)
    shared, hits = _checked(files, True)
    alone, _ = _checked(files, False)
    assert hits == 3 and shared == alone
    assert [r[1] for r in shared] == ["ckpt_300", "ckpt_400", "ckpt_500", "ckpt_600"]
    assert all(m.crc_ok and m.header_ok for r in shared for m in r[0]) and not any(r[3] for r in shared)


def _flip_last_record_byte(b: bytearray) -> bytes:
    i = bytes(b).rindex(b"PK\x07\x08")  # the last record's data descriptor: its data ends there
    b[i - 1] ^= 0xFF
    return bytes(b)


def _descriptor_crc_changed(b: bytearray) -> bytes:
    i = bytes(b).rindex(b"PK\x07\x08")
    b[i + 4] ^= 0x01
    return bytes(b)


@pytest.mark.parametrize("edit, kinds", [(_flip_last_record_byte, ["zip_crc_mismatch"]),
                                         (_descriptor_crc_changed, ["zip_member_header_corrupted"])],
                         ids=["tensor-byte", "descriptor-crc"])
def test_a_follower_with_damage_is_checked_record_by_record(tmp_path, saved, edit, kinds):
    files = _written(tmp_path, saved, edit)
    shared, hits = _checked(files, True)
    alone, _ = _checked(files, False)
    assert hits == 2 and shared == alone
    assert [f["kind"] for f in shared[-1][3]] == kinds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_whatever_the_bytes_the_scans_check_of_a_follower_is_its_own(tmp_path_factory, saved, data):
    """Bytes written at random places of a checkpoint after one of the same model (among the bytes a layout
    compares, its CRC and descriptor fields, or anywhere): the file layer's check with the job's shared layouts
    reports what a check of that file alone reports."""
    layouts = ZipLayouts()
    _with_layout(layouts, saved[0])
    t = layouts.held()[0]
    places = st.one_of(st.sampled_from(t.at.tolist()), st.sampled_from(t.crc_at.tolist()),
                       st.sampled_from(t.desc_at.tolist()), st.sampled_from(t.folder_at.ravel().tolist()),
                       st.integers(0, len(saved[1]) - 1))
    edits = data.draw(st.lists(st.tuples(places, st.integers(0, 3), st.integers(0, 255)), min_size=1, max_size=3))

    def edit(b: bytearray) -> bytes:
        for at, k, v in edits:
            b[min(at + k, len(b) - 1)] = v
        return bytes(b)

    files = _written(tmp_path_factory.mktemp("edited"), saved[:2], edit)
    shared, hits = _checked(files, True)
    event("followed" if hits else "checked itself")
    assert shared == _checked(files, False)[0]


# ------------------------------------------------ zips where a CRC field is not only a CRC (an adversarial review)

def _torch_records(tmp_path, step: int, folder: str):
    from .zip_craft import torch_entries

    p = tmp_path / "src.pt"
    torch.save(_checkpoint(step), p)
    return [(folder + n[n.index("/"):], d) for n, d in torch_entries(p.read_bytes())]


def test_descriptors_without_their_signature_keep_no_layout(tmp_path):
    """Data descriptors without a signature (APPNOTE: optional): a follower's CRC-32 of 0x08074b50 puts the
    signature's bytes where a reader looks for one, and the record-by-record check reads its sizes 4 bytes later."""
    from .zip_craft import build, forge_crc

    first, second = _torch_records(tmp_path, 300, "ckpt_300"), _torch_records(tmp_path, 400, "ckpt_400")
    k = next(i for i, (n, _) in enumerate(second) if n.endswith("/data/0"))
    second[k] = (second[k][0], forge_crc(second[k][1], 0x08074B50))
    files = [tmp_path / "ckpt_300.pt", tmp_path / "ckpt_400.pt"]
    files[0].write_bytes(build(first, desc="nosig")[0])
    files[1].write_bytes(build(second, desc="nosig")[0])
    shared, hits = _checked(files, True)
    assert hits == 0 and shared == _checked(files, False)[0]
    assert [f["kind"] for f in shared[1][3]] == ["zip_member_header_corrupted"]


def test_a_central_directory_read_as_a_descriptor_keeps_no_layout(tmp_path):
    """The last record (flag bit 3, no descriptor) ends where the central directory starts: its first 12 bytes
    serve as that record's descriptor, and the follower's damaged central-directory signature is found."""
    import pickle

    from .zip_craft import build, forge_crc

    def made(folder, crc, cd_sig):
        blob = forge_crc(bytes(range(256)) * 8 + bytes(8), crc)
        entries = [(folder + "/data.pkl", pickle.dumps({"a": 1}, protocol=2)), (folder + "/data/0", bytes(64)),
                   (folder + "/blob", blob)]
        return build(entries, desc=["sig", "sig", "none"], flags=0x0808, vn=0, vm=0x0808, cd_sig=cd_sig)[0]

    files = [tmp_path / "ckpt_300.pt", tmp_path / "ckpt_400.pt"]
    files[0].write_bytes(made("ckpt_300", 0x02014B50, b"PK\x01\x02"))
    files[1].write_bytes(made("ckpt_400", 0x03014B50, b"PK\x01\x03"))
    shared, hits = _checked(files, True)
    assert hits == 0 and shared == _checked(files, False)[0]
    assert {f["kind"] for f in shared[1][3]} >= {"zip_central_directory_corrupted"}


@pytest.mark.parametrize("where", ["next-local-header", "central-directory"])
def test_records_without_their_descriptors_keep_no_layout(where):
    """Flag bit 3 set and no descriptors: the 4 bytes after a record's data are the next local header's signature
    (or the central directory's), which a layout must compare."""
    import pickle

    from .zip_craft import build

    entries = [("arch/data.pkl", pickle.dumps({"a": 1}, protocol=2)), ("arch/data/0", bytes(range(64))),
               ("arch/version", b"3\n")]
    first, pos = build(entries, desc="none")
    layouts = ZipLayouts()
    _with_layout(layouts, first)
    edited = bytearray(first)
    at = pos["arch/data/0"]["lho"] if where == "next-local-header" else pos["arch/version"]["end"]
    edited[at:at + 4] = b"XXXX"
    assert not layouts.held() and layouts.records_of(bytes(edited)) is None
    assert _with_layout(layouts, bytes(edited))[0].crc == P.plan_file("x.pt", bytes(edited)).crc


def _crc_as_zip64_end_record(crc_of_last: int) -> bytes:
    """The last central entry's comment ends in a zip64 locator naming that entry's own CRC field (a field a
    layout leaves out) as the zip64 end record: a follower whose CRC there reads ``PK\\x06\\x06`` moves its central
    directory to the numbers its name holds."""
    import pickle
    import struct

    from .zip_craft import build_fields, forge_crc

    blob = forge_crc(bytes(range(64)) * 2, crc_of_last)
    pkl = pickle.dumps({"a": 1}, protocol=2)

    def entries(n64, size64, off64):
        return [(b"a/data.pkl", pkl), (b"a/data/0", bytes(64)), (b"a/" + struct.pack("<QQQ", n64, size64, off64), blob)]

    def locator(z64_off):
        return b"PK\x06\x07" + struct.pack("<IQI", 0, z64_off, 1)

    _, info = build_fields(entries(0, 0, 0), cd_comment={2: locator(0)})
    at, cd = info["records"][2]["cen"], info["cd"]
    return build_fields(entries(2, at + 16 - cd, cd), cd_comment={2: locator(at + 16)})[0]


def _folder_as_zip64_locator_offset(folder: bytes) -> bytes:
    """The last central entry's external attributes read as a zip64 locator whose offset is that entry's name:
    the folder (left out of a layout's comparison) then names a zip64 end record inside tensor data."""
    import pickle
    import struct

    from .zip_craft import build_fields

    pkl = pickle.dumps({"a": 1}, protocol=2)
    blob = bytearray(16384)
    _, info = build_fields([(folder + b"/data.pkl", pkl), (folder + b"/data/0", bytes(blob)),
                            (folder + b"/" + bytes(6), b"3\n")])
    d0 = info["records"][1]["data"]
    blob[0x2f62 - d0:0x2f62 - d0 + 56] = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 0, 0, 0, 0x2f62)
    blob[0x2f61 - d0] = ord("x")
    entries = [(folder + b"/data.pkl", pkl), (folder + b"/data/0", bytes(blob)), (folder + b"/" + bytes(6), b"3\n")]
    return build_fields(entries, cd_extra={2: b"\x01\x00\x00\x00"}, ext_attr={2: 0x07064B50})[0]


@pytest.mark.parametrize("pair", [
    lambda: (_crc_as_zip64_end_record(0x12345678), _crc_as_zip64_end_record(0x06064B50)),
    lambda: (_folder_as_zip64_locator_offset(b"a"), _folder_as_zip64_locator_offset(b"b")),
], ids=["crc-as-zip64-end-record", "folder-as-zip64-locator-offset"])
def test_a_byte_left_out_that_another_read_covers_keeps_no_layout(tmp_path, pair):
    """A CRC field or a folder byte that the end records' reads cover too (a second adversarial review): the
    layout is refused, and each file is checked and planned as alone."""
    first, second = pair()
    layouts = ZipLayouts()
    _with_layout(layouts, first)
    assert not layouts.held() and layouts.records_of(second) is None
    files = [tmp_path / "one.pt", tmp_path / "two.pt"]
    files[0].write_bytes(first)
    files[1].write_bytes(second)
    shared, hits = _checked(files, True)
    assert hits == 0 and shared == _checked(files, False)[0]
