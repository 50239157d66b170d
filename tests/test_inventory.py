"""Inventory finds units, pointers and leftovers by name and layout."""

import os
import shutil

import pytest

from ckptaudit import inventory

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
    assert inventory.auto_units_per_job(1) == 1
    assert inventory.auto_units_per_job(16) == 1
    assert inventory.auto_units_per_job(17) == 2
    assert inventory.auto_units_per_job(1000) == 64
    assert inventory.auto_units_per_job(4096) == 256


def _sized(sizes):
    from types import SimpleNamespace

    return [SimpleNamespace(unit=f"u{i:05d}", size_bytes=s, part="") for i, s in enumerate(sizes)]


def test_auto_packs_small_units_into_one_part_and_keeps_big_ones_apart():
    from ckptaudit.parts import SMALL_PART_BYTES, assign_parts

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
    from ckptaudit.parts import assign_parts

    gib = 1 << 30
    assert [len(v) for v in assign_parts(_sized([9 * gib] * 3), "auto", None).values()] == [3]
    assert [len(v) for v in assign_parts(_sized([9 * gib] * 17), "auto", None).values()] == [16, 1]
    assert [len(v) for v in assign_parts(_sized([gib] * 1000), "auto", None).values()] == [64] * 15 + [40]
    assert [len(v) for v in assign_parts(_sized([9 * gib] * 3), 1, None).values()] == [1, 1, 1]


def test_auto_parts_only_change_at_the_end_as_the_run_grows():
    from ckptaudit.parts import assign_parts

    sizes = [(i % 7) * (50 << 20) for i in range(16)]
    before = assign_parts(_sized(sizes[:10]), "auto")
    after = assign_parts(_sized(sizes), "auto")
    last = max(before)
    assert {k: v for k, v in before.items() if k != last} == {k: v for k, v in after.items() if k < last}
    assert after[last][:len(before[last])] == before[last]


def test_missing_run_folder_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        inventory.discover(tmp_path / "missing")
