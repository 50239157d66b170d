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
    t = layouts._held[0]
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
