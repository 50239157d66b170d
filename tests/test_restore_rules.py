"""A producer's resume rules about combinations and counts of files (ckptaudit/components/restore_rules.py).

The real runs are tests/frameworks fixtures (hf_trainer*_missing_scheduler, accelerate_missing_custom_checkpoint),
each with the framework's own resume probed at generation; here, the run-level choice of the count that
Accelerate's ``load_state`` must find, on inventory units as the inventory writes them.
"""

from __future__ import annotations

from ckptaudit.components import restore_rules


def _unit(i: int, n_custom: int, in_progress: bool = False) -> dict:
    d = f"checkpoints/checkpoint_{i}"
    files = [f"{d}/model.safetensors", f"{d}/optimizer.bin", f"{d}/random_states_0.pkl"]
    files += [f"{d}/custom_checkpoint_{k}.pkl" for k in range(n_custom)]
    return {"unit": d, "layout": "accelerate", "files": files, "step_from_name": i,
            "in_progress": "temp files" if in_progress else None}


def _flagged(units):
    return {u: (f.detail["have"], f.detail["want"]) for u, f in restore_rules.count_mismatches(units)}


def test_a_unit_missing_a_registered_object_file_is_flagged_against_the_run():
    units = [_unit(0, 2), _unit(1, 2), _unit(2, 1), _unit(3, 2)]
    assert _flagged(units) == {"checkpoints/checkpoint_2": (1, 2)}


def test_an_object_registered_later_makes_the_older_units_the_mismatched_ones():
    """The job that resumes is the code of the newest save: it registers what the newest unit holds."""
    units = [_unit(0, 1), _unit(1, 1), _unit(2, 1), _unit(3, 2)]
    assert _flagged(units) == {f"checkpoints/checkpoint_{i}": (1, 2) for i in range(3)}


def test_the_newest_cut_short_is_flagged_and_a_unit_being_written_is_not_judged():
    units = [_unit(0, 1), _unit(1, 1), _unit(2, 0), _unit(3, 0, in_progress=True)]
    assert _flagged(units) == {"checkpoints/checkpoint_2": (0, 1)}


def test_equal_counts_and_other_layouts_give_nothing():
    assert _flagged([_unit(0, 1), _unit(1, 1)]) == {}
    assert _flagged([{**_unit(0, 0), "layout": "hf-trainer"}, {**_unit(1, 3), "layout": "hf-trainer"}]) == {}
    assert _flagged([_unit(0, 0), _unit(1, 0)]) == {}  # nothing registered anywhere
