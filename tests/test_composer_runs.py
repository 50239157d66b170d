"""MosaicML Composer runs: ``ep{epoch}-ba{batch}-rank{rank}.pt`` files and the ``latest-rank0.pt`` link its
autoresume follows (``ckptaudit/producers/composer.py``).

Source: mosaicml 0.32.1 and mosaicml/composer at commit 6405188805a0054b4551ec49e4919c54c971d0e8:
``composer/callbacks/checkpoint_saver.py`` :255/:259 (the default names), :436-486 ``_save_checkpoint`` (the link
moved after the save returns, :476/:485); ``composer/utils/checkpoint.py`` ``_write_checkpoint_file`` (the final
name written in place); ``composer/trainer/trainer.py`` :1618-1701 (``autoresume`` loads
``save_folder/latest-rank{rank}.pt``, whatever ``load_path`` says).

The runs in tests/producer_runs/composer_* were written by Composer itself (mosaicml 0.32.1 on torch 2.13.0+cpu,
tests/producer_runs/make_composer_runs.py): a clean run, and the same run SIGKILLed inside its third save.  That
script also ran Composer's own ``Trainer(autoresume=True)`` on them: batch 30 for the clean run, batch 20 for the
killed one, and an OSError once the clean run's ep3-ba30-rank0.pt is cut to 9,000 bytes.  mosaicml is not in the
project's environment, so the tests read those files and never import it.
"""

from __future__ import annotations

import os

from ckptaudit import producers
from ckptaudit.pipeline import audit_in_process
from ckptaudit.producers import composer
from ckptaudit.units import step_from_name

from .conftest import copy_producer_run, unit_rows

CK = "checkpoints"


def _kinds(v, unit):
    return sorted(f["kind"] for u in v["units"] if u["unit"] == unit for f in u["findings"])


def test_the_batch_in_the_name_is_the_step():
    assert [step_from_name(n) for n in ("ep1-ba10-rank0.pt", "ep12-ba1200-rank3.pt", "ba7-rank0.pt")] == [10, 1200, 7]
    assert producers.zip_layout("ep1-ba10-rank0.pt") == "composer"
    assert producers.zip_layout("epoch=0-step=10.ckpt") == "lightning" and producers.zip_layout("a.pt") is None


def test_clean_run(tmp_path):
    v = audit_in_process(copy_producer_run("composer_clean", tmp_path), out_dir=tmp_path / "out")
    assert unit_rows(v) == {f"{CK}/ep1-ba10-rank0.pt": ("composer", 10, "resume"),
                        f"{CK}/ep2-ba20-rank0.pt": ("composer", 20, "resume"),
                        f"{CK}/ep3-ba30-rank0.pt": ("composer", 30, "resume")}
    assert v["rollback"] == {"unit": f"{CK}/ep3-ba30-rank0.pt", "step": 30}
    assert v["pointers"] == [{"path": f"{CK}/latest-rank0.pt", "target": "ep3-ba30-rank0.pt", "ok": True, "kind": ""}]
    # ComposerClassifier's own "module." prefix is what Composer's resume loads into: no key_prefix_mismatch;
    # the step is state.timestamp.Timestamp.batch, no missing_step
    assert _kinds(v, f"{CK}/ep3-ba30-rank0.pt") == ["pickle_global_allowed_by_resume", "sidecar_missing"]
    assert v["resume_hint"] is None


def test_killed_inside_the_third_save(tmp_path):
    """SIGKILL inside the save of batch 30: the file is cut under its own name, the link still on batch 20."""
    v = audit_in_process(copy_producer_run("composer_killed", tmp_path), out_dir=tmp_path / "out")
    assert unit_rows(v)[f"{CK}/ep3-ba30-rank0.pt"] == ("composer", 30, "none")
    assert "truncated_zip_no_central_directory" in _kinds(v, f"{CK}/ep3-ba30-rank0.pt")
    assert v["rollback"] == {"unit": f"{CK}/ep2-ba20-rank0.pt", "step": 20}
    assert v["pointers"] == [{"path": f"{CK}/latest-rank0.pt", "target": "ep2-ba20-rank0.pt", "ok": True, "kind": ""}]
    assert not v.get("pointer_findings") and v["resume_hint"] is None  # autoresume takes batch 20 itself


def test_link_to_a_cut_newest_file(tmp_path):
    """The newest file cut after its save (a copy, a full disk): autoresume follows the link into it and fails."""
    run = copy_producer_run("composer_clean", tmp_path)
    os.truncate(run / CK / "ep3-ba30-rank0.pt", 9000)
    v = audit_in_process(run, out_dir=tmp_path / "out")
    assert v["rollback"] == {"unit": f"{CK}/ep2-ba20-rank0.pt", "step": 20}
    [pf] = v["pointer_findings"]
    assert (pf["kind"], pf["severity"]) == ("symlink_target_unusable", "error")
    assert "latest-rank0.pt is a symbolic link to 'ep3-ba30-rank0.pt'" in pf["message"]
    assert v["resume_hint"] == (
        f'Resume from {CK}/ep2-ba20-rank0.pt explicitly: Trainer(..., load_path="{run}/{CK}/ep2-ba20-rank0.pt", '
        f"autoresume=False); Composer's default Trainer(..., autoresume=True) would take {CK}/ep3-ba30-rank0.pt.")


def test_default_pick_is_the_links_target():
    v = {"pointers": [{"path": "ck/latest-rank0.pt", "target": "ep2-ba20-rank0.pt"},
                      {"path": "ck/latest-rank1.pt", "target": "ep9-ba90-rank1.pt"}]}
    assert composer.default_pick(v, "ck") == ("ck/ep2-ba20-rank0.pt", True)
    assert composer.default_pick(v, "other") == (None, False)
