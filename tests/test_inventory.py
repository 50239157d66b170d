"""Inventory finds units, pointers and leftovers by name and layout."""

import os
import shutil

import pytest

from ckptaudit import discovery as inventory
from ckptaudit.stages import inventory as inventory_stage

from .conftest import CASES


@pytest.mark.parametrize("name,step", [
    ("ckpt_000500.pt", 500), ("checkpoint-1200", 1200), ("global_step300", 300), ("iter_0000009", 9),
    ("epoch=3-step=1200.ckpt", 1200), ("step-6", 6), ("model-00001-of-00002.safetensors", None),
    ("ckpt.pt", None), ("last.ckpt", None), ("model_legacy.pt", None),
])
def test_step_from_name(name, step):
    assert inventory.step_from_name(name) == step


def test_units_pointers_and_leftovers(tmp_path):
    src = CASES / "ok_full_torch" / "ckpt.pt"
    for s in (100, 200):
        shutil.copy(src, tmp_path / f"ckpt_{s:06d}.pt")
    shutil.copy(src, tmp_path / "ckpt_000300.pt.tmp")
    (tmp_path / "tmp-checkpoint-400").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    os.symlink("ckpt_000900.pt", tmp_path / "last.ckpt")
    (tmp_path / "ckpt_000100.pt.sha256").write_text("0" * 64 + "  ckpt_000100.pt\n")
    units, pointers, stray = inventory.discover(tmp_path)
    by = {u.unit: u for u in units}
    assert sorted(by) == ["ckpt_000100.pt", "ckpt_000200.pt", "ckpt_000300.pt.tmp", "tmp-checkpoint-400"]
    assert by["ckpt_000100.pt"].sidecars == ["ckpt_000100.pt.sha256"]
    assert by["ckpt_000300.pt.tmp"].in_progress.startswith("temporary name")
    assert by["tmp-checkpoint-400"].in_progress.startswith("HF Trainer temp folder")
    assert by["ckpt_000100.pt"].layout == "torch-zip" and by["ckpt_000100.pt"].size_bytes == src.stat().st_size
    assert [(p.path, p.is_symlink, p.exists) for p in pointers] == [("last.ckpt", True, False)]
    assert stray == ["notes.txt"]


def test_layout_folders_are_units():
    units, pointers, _ = inventory.discover(CASES / "ds_latest_points_to_missing_tag")
    assert [(u.unit, u.layout, u.step_from_name) for u in units] == [
        ("global_step3", "deepspeed", 3), ("global_step6", "deepspeed", 6)]
    assert [(p.path, p.target, p.resolved) for p in pointers] == [("latest", "global_step9", "")]
    units, pointers, _ = inventory.discover(CASES / "megatron_mixed_step_shards")
    assert [u.unit for u in units] == ["iter_0000006", "iter_0000009"]
    assert [(p.path, p.resolved) for p in pointers] == [("latest_checkpointed_iteration.txt", "iter_0000009")]
    units, _, _ = inventory.discover(CASES / "hf_index_missing_shard")
    assert [(u.unit, u.layout, u.missing_files) for u in units] == [
        ("model.safetensors.index.json", "hf-sharded", ["model-00002-of-00002.safetensors"])]


def test_parts_are_stable_as_the_run_grows():
    assert inventory_stage.auto_units_per_job(1) == 1
    assert inventory_stage.auto_units_per_job(16) == 1
    assert inventory_stage.auto_units_per_job(17) == 2
    assert inventory_stage.auto_units_per_job(1000) == 64
    assert inventory_stage.auto_units_per_job(4096) == 256
    assert inventory_stage.auto_units_per_job(16 * 1024) == 1024
    assert inventory_stage.auto_units_per_job(16 * 1024 + 1) == 1024  # parts stop growing: a job's memory too
    assert inventory_stage.auto_units_per_job(50_000) == 1024


def test_a_large_run_gets_more_parts_not_bigger_ones():
    """50,000 small units: 49 parts of at most 1,024 (was 13 of 4,096, whose stage jobs held 417–476 MiB); a unit
    added to the run touches only the last part."""
    from ckptaudit.stages.inventory.parts import MAX_AUTO_UNITS_PER_JOB, assign_parts

    sizes = [len(v) for v in assign_parts(_sized([87_005] * 50_000), "auto", None).values()]
    assert sizes == [MAX_AUTO_UNITS_PER_JOB] * 48 + [50_000 - 48 * 1024]
    grown = assign_parts(_sized([87_005] * 50_001), "auto", None)
    before = assign_parts(_sized([87_005] * 50_000), "auto", None)
    assert all(grown[p] == before[p] for p in list(before)[:-1])


def _sized(sizes):
    from types import SimpleNamespace

    return [SimpleNamespace(unit=f"u{i:05d}", size_bytes=s, part="") for i, s in enumerate(sizes)]


def test_auto_packs_small_units_into_one_part_and_keeps_big_ones_apart():
    from ckptaudit.stages.inventory.parts import SMALL_PART_BYTES, assign_parts

    kib, gib = 1 << 10, 1 << 30
    assert list(assign_parts(_sized([16 * kib] * 3), "auto")) == ["p0000"]  # a tiny run: one part
    assert [len(v) for v in assign_parts(_sized([16 * kib] * 17), "auto").values()] == [16, 1]
    assert [len(v) for v in assign_parts(_sized([gib] * 3), "auto").values()] == [3]  # 3 GiB: one part, hashed at once
    assert [len(v) for v in assign_parts(_sized([gib] * 6), "auto").values()] == [4, 2]  # parts stop at 4 GiB
    assert [len(v) for v in assign_parts(_sized([5 * gib] * 3), "auto").values()] == [1, 1, 1]  # big units apart
    half = SMALL_PART_BYTES // 2
    assert [len(v) for v in assign_parts(_sized([half] * 5), "auto").values()] == [2, 2, 1]
    # a large run keeps the count rule: 1,000 small units in 16 parts of 64, big units too
    assert [len(v) for v in assign_parts(_sized([16 * kib] * 1000), "auto").values()] == [64] * 15 + [40]
    assert [len(v) for v in assign_parts(_sized([gib] * 1000), "auto").values()] == [64] * 15 + [40]
    assert [len(v) for v in assign_parts(_sized([16 * kib] * 5), 2).values()] == [2, 2, 1]  # a number is a number


def test_auto_on_one_machine_packs_big_units_by_count():
    """Each unit over half the 4 GiB budget had a part of its own on one machine too: 3 units of 9 GiB ran 22
    jobs and three `import torch` load jobs, where one part hashes all three at once on every core."""
    from ckptaudit.stages.inventory.parts import assign_parts

    gib = 1 << 30
    assert [len(v) for v in assign_parts(_sized([9 * gib] * 3), "auto", None).values()] == [3]
    assert [len(v) for v in assign_parts(_sized([9 * gib] * 17), "auto", None).values()] == [16, 1]
    assert [len(v) for v in assign_parts(_sized([gib] * 1000), "auto", None).values()] == [64] * 15 + [40]
    assert [len(v) for v in assign_parts(_sized([9 * gib] * 3), 1, None).values()] == [1, 1, 1]


def test_auto_parts_only_change_at_the_end_as_the_run_grows():
    from ckptaudit.stages.inventory.parts import assign_parts

    sizes = [(i % 7) * (50 << 20) for i in range(16)]
    before = assign_parts(_sized(sizes[:10]), "auto")
    after = assign_parts(_sized(sizes), "auto")
    last = max(before)
    assert {k: v for k, v in before.items() if k != last} == {k: v for k, v in after.items() if k < last}
    assert after[last][:len(before[last])] == before[last]


def test_missing_run_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        inventory.discover(tmp_path / "missing")


def _rank_saves(run, saves, ranks):
    """``saves`` DCP-like folders ``step-N`` of ``ranks`` data files each (what the inventory looks at: names,
    sizes, mtimes), rank r's file r + 1 bytes long."""
    for s in range(1, saves + 1):
        d = run / f"step-{s * 10}"
        d.mkdir(parents=True)
        (d / ".metadata").write_bytes(b"\x80\x04N.")
        for r in range(ranks):
            (d / f"__{r}_0.distcp").write_bytes(b"x" * (r + 1))


def test_many_rank_files_make_one_unit_per_save_with_every_file(tmp_path):
    """A multi-rank run (thousands of rank files) once stalled the inventory; each save must stay one unit
    holding all its files, sizes summed, each file's snapshot taken by the walk."""
    _rank_saves(tmp_path, saves=3, ranks=700)
    units, pointers, stray = inventory.discover(tmp_path)
    assert [(u.unit, u.layout, u.kind, u.step_from_name) for u in units] == [
        ("step-10", "dcp", "folder", 10), ("step-20", "dcp", "folder", 20), ("step-30", "dcp", "folder", 30)]
    for u in units:
        assert len(u.files) == 701 and u.files[0] == f"{u.unit}/.metadata"
        assert u.files[1:4] == [f"{u.unit}/__0_0.distcp", f"{u.unit}/__100_0.distcp", f"{u.unit}/__101_0.distcp"]
        assert u.size_bytes == 4 + 700 * 701 // 2  # .metadata is 4 bytes
        assert sorted(u.snapshot) == sorted(u.files)
        assert u.snapshot[f"{u.unit}/__699_0.distcp"][0] == 700
    assert pointers == [] and stray == []


def test_many_file_units_in_one_folder_each_get_their_own_sidecar(tmp_path):
    """Sidecars are looked up by name (a set), not searched in the folder's listing once per file: 3,000
    checkpoints and their sidecars in one folder give 3,000 units, each with exactly its own sidecar."""
    for i in range(3000):
        (tmp_path / f"ckpt_{i:06d}.pt").write_bytes(b"PK\x03\x04" + bytes(i % 7))
        if i % 2 == 0:
            (tmp_path / f"ckpt_{i:06d}.pt.sha256").write_text("0" * 64 + "\n")
    doc = inventory_stage.run_inventory(str(tmp_path))
    assert len(doc["units"]) == 3000 and doc["stray_files"] == []
    u0, u1, last = doc["units"][0], doc["units"][1], doc["units"][-1]
    assert (u0["unit"], u0["step_from_name"], u0["sidecars"], u0["size_bytes"]) == (
        "ckpt_000000.pt", 0, ["ckpt_000000.pt.sha256"], 4)
    assert (u1["unit"], u1["sidecars"], u1["size_bytes"], u1["layout"]) == ("ckpt_000001.pt", [], 5, "torch-zip")
    assert (last["unit"], last["step_from_name"], last["sidecars"]) == ("ckpt_002999.pt", 2999, [])
    assert sum(len(u["sidecars"]) for u in doc["units"]) == 1500
    assert list(last["snapshot"]) == ["ckpt_002999.pt"] and last["snapshot"]["ckpt_002999.pt"][0] == 4 + 2999 % 7
    assert [len(v) for v in doc["parts"].values()] == [256] * 11 + [184]


def _deep_folders(top, levels, name="nested_folder_number_{:03d}"):
    """``levels`` nested folders under ``top``, made through directory descriptors (their path is too long
    to name); returns the descriptor of the deepest one (the caller closes it)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(levels):
        os.mkdir(name.format(i), dir_fd=fd)
        nfd = os.open(name.format(i), os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def test_unit_beyond_path_max_is_found_through_descriptors_and_never_read(tmp_path):
    """A unit 200 folders deep (a path over PATH_MAX, 4096 bytes) ended the whole inventory with
    ``OSError: File name too long``; it must become an irregular unit with its reason, the rest audited."""
    shutil.copy(CASES / "ok_full_torch" / "ckpt.pt", tmp_path / "ckpt_000100.pt")
    fd = _deep_folders(tmp_path, 200)
    try:
        os.close(os.open("ckpt_000900.pt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.mkdir("step-950", dir_fd=fd)
        sub = os.open("step-950", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(os.open(".metadata", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=sub))
        os.close(sub)
        os.close(os.open("notes.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    units, _, stray = inventory.discover(tmp_path)
    deep = "/".join(f"nested_folder_number_{i:03d}" for i in range(200))
    assert [(u.unit, u.layout, u.step_from_name, u.files) for u in units] == [
        ("ckpt_000100.pt", "torch-zip", 100, ["ckpt_000100.pt"]),
        (f"{deep}/ckpt_000900.pt", "irregular", 900, []),
        (f"{deep}/step-950", "irregular", 950, [])]
    n = len(os.fsencode(os.path.abspath(tmp_path))) + 1 + len(deep) + len("/ckpt_000900.pt")
    assert n > 4096
    assert units[1].irregular == {f"{deep}/ckpt_000900.pt": (
        f"its path is {n:,} bytes, over this system's limit (PATH_MAX: a path of 4,096 bytes or more cannot be "
        "opened by name)")}
    assert stray == [f"{deep}/notes.txt"]


def test_save_folder_whose_files_reach_path_max_is_one_finding(tmp_path):
    """A save folder whose own path fits but whose files' paths reach PATH_MAX cannot be read either: it is
    one unit with a path_too_long finding that says so, not a crash on the first path formed inside it."""
    from ckptaudit.layouts.leftovers import irregular

    top = tmp_path / ("x" * 200)
    top.mkdir()
    base = len(os.fsencode(str(top)))
    levels = (4090 - 14 - base - 1) // 201  # then a pad folder, so checkpoint-7's path is 4,090 bytes
    fd = _deep_folders(top, levels, name="y" * 200)
    pad = "z" * (4090 - len("/checkpoint-7") - 1 - base - 201 * levels)
    os.mkdir(pad, dir_fd=fd)
    nfd = os.open(pad, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nfd
    try:
        os.mkdir("checkpoint-7", dir_fd=fd)
        sub = os.open("checkpoint-7", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(os.open("model.safetensors", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=sub))
        os.close(sub)
    finally:
        os.close(fd)
    units, _, _ = inventory.discover(tmp_path)
    assert [(u.unit.rsplit("/", 1)[-1], u.layout, u.step_from_name, u.files) for u in units] == [
        ("checkpoint-7", "irregular", 7, [])]
    ((path, why),) = units[0].irregular.items()
    assert path == units[0].unit and len(os.fsencode(str(tmp_path / path))) == 4090
    assert why == ("its path is 4,090 bytes, and the paths of the files in it reach this system's limit "
                   "(PATH_MAX: a path of 4,096 bytes or more cannot be opened by name)")
    f = irregular(path, why)
    assert (f.kind, f.layer, f.severity, f.caps) == ("path_too_long", "file", "error", "none")
    assert f.message.endswith("a training job cannot open it by this path either.") and "characters)…" in f.message
    assert f.next_step.startswith("Move or rename it to a shorter path")


def test_each_part_job_reads_its_own_share_of_the_inventory(tmp_path):
    """The inventory stage writes one document per part beside inventory.json; a part's job reads that
    document, which holds exactly the units ``part_units`` gives from the whole inventory (in its order), the
    part's object-store entries and the run folder.  A document cut from another inventory.json (the inventory
    run again), a torn one or none: the job reads inventory.json whole.  A part the inventory no longer has
    loses its document."""
    import json

    from ckptaudit.stages import cli
    from ckptaudit.stages.inventory import part_docs
    from ckptaudit.stages.inventory.parts import part_units, read_inventory

    run = tmp_path / "run"
    run.mkdir()
    for i in range(1, 8):
        (run / f"ckpt_{i:03d}.pt").write_bytes(b"PK\x05\x06" + bytes(18))
    work = tmp_path / "work"
    js = work / "inventory.json"
    cli.stage_inventory(str(run), 3, str(tmp_path / "t" / "inv.parquet"), str(js), str(tmp_path / "t" / "p.parquet"))
    whole = read_inventory(str(js))
    assert sorted(whole["parts"]) == ["p0000", "p0001", "p0002"]
    assert sorted(p.name for p in (work / part_docs.FOLDER).iterdir()) == ["p0000.json", "p0001.json", "p0002.json"]
    for part in whole["parts"]:
        one = part_docs.read_part_inventory(js, part)
        assert one["units"] == part_units(whole, part) and len(one["units"]) == len(whole["parts"][part])
        assert one["parts"] == {part: whole["parts"][part]} and one["run_dir"] == whole["run_dir"]
        assert part_units(one, part) == one["units"] and "stray_files" not in one
    os.utime(js, ns=(1, 1))  # Snakemake touches a job's outputs when it ends: the same bytes, another mtime
    assert "stray_files" not in part_docs.read_part_inventory(js, "p0001")  # still the part's document
    doc = part_docs.part_doc_path(js, "p0001")
    doc.write_text(doc.read_text()[:40])  # torn
    assert part_docs.read_part_inventory(js, "p0001") == whole
    doc.unlink()  # none
    assert part_docs.read_part_inventory(js, "p0001") == whole
    # the inventory run again with bigger parts: inventory.json is another file; p0002's old document is removed
    # and no part's stale document is believed, even one left in place by hand
    stale = part_docs.part_doc_path(js, "p0000").read_text()
    cli.stage_inventory(str(run), 4, str(tmp_path / "t" / "inv.parquet"), str(js), str(tmp_path / "t" / "p.parquet"))
    assert sorted(p.name for p in (work / part_docs.FOLDER).iterdir()) == ["p0000.json", "p0001.json"]
    part_docs.part_doc_path(js, "p0000").write_text(stale)
    again = read_inventory(str(js))
    assert part_docs.read_part_inventory(js, "p0000") == again and len(again["parts"]["p0000"]) == 4
    assert json.loads(part_docs.part_doc_path(js, "p0001").read_text())["units"] == part_units(again, "p0001")
