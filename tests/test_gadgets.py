"""Issue 24's gadget corpus in every file role of real framework runs: judged by what the resume's loader does.

Each placement takes a clean run written by the framework itself (tests/frameworks), adds the 49 gadgets of
:mod:`tests.gadgets` to one file of its newest unit, and audits the copy.  Where the resume unpickles that
file without an allowlist (DeepSpeed's model and optimizer states: ``TorchCheckpointEngine.load``,
``weights_only=False``; accelerate's ``load_custom_state``) every gadget is named in an error and the unit
is unusable.  Where the resume's loader is ``weights_only=True`` (plain, Lightning, the HF Trainer, accelerate's
own state files) every gadget is still named, and the unit is not called resumable: that load would fail.
"""

import json
import shutil

import pytest

from ckptaudit.pipeline import audit_in_process

from .gadgets import CORPUS, inject
from .test_frameworks import fixture_cache  # noqa: F401 - the session fixture that generates the runs

#: (framework fixture, file of its newest unit, the resume unpickles it without an allowlist)
PLACEMENTS = [
    ("deepspeed_zero2_clean", "global_step30/mp_rank_00_model_states.pt", True),
    ("deepspeed_zero2_clean", "global_step30/zero_pp_rank_0_mp_rank_00_optim_states.pt", True),
    ("accelerate_clean", "custom_checkpoint_0.pkl", True),
    ("accelerate_clean", "optimizer.bin", False),
    ("accelerate_clean", "random_states_0.pkl", False),
    ("hf_trainer_clean", "optimizer.pt", False),
    ("hf_trainer_clean", "rng_state.pth", False),
    ("hf_trainer_clean", "scheduler.pt", False),
    ("lightning_clean", "epoch=2-step=30.ckpt", False),
    ("plain_nanogpt_clean", "ckpt_000030.pt", False),
]
ERRORS = ("malicious_pickle_code_exec", "unrestricted_load_imports_unknown")


def _newest_file(run, v, tail):
    for u in sorted(v["units"], key=lambda u: (u["step"] or -1), reverse=True):
        rel = tail if "/" in tail and (run / tail).exists() else None
        if rel is None:
            base = run / u["unit"]
            cands = [p for p in (base.rglob(tail) if base.is_dir() else [base]) if p.name == tail.split("/")[-1]]
            if cands:
                rel = cands[0].relative_to(run).as_posix()
        if rel:
            return u["unit"], rel
    raise AssertionError(f"no {tail} in {[u['unit'] for u in v['units']]}")


@pytest.mark.parametrize("fixture, tail, unrestricted", PLACEMENTS, ids=[f"{f}:{t.split('/')[-1]}" for f, t, _ in PLACEMENTS])
def test_every_gadget_is_named_in_every_file_role(fixture_cache, tmp_path, fixture, tail, unrestricted):  # noqa: F811
    src = fixture_cache / fixture
    if (src / "skipped.json").exists():
        pytest.fail(json.loads((src / "skipped.json").read_text())["reason"])
    cfg = json.loads((src / "truth.json").read_text())["audit_config"]
    run = tmp_path / "run"
    shutil.copytree(src / "run", run, symlinks=True)
    clean = audit_in_process(run, cfg, out_dir=tmp_path / "clean")
    unit, rel = _newest_file(run, clean, tail)
    before = next(u for u in clean["units"] if u["unit"] == unit)
    assert before["usable_for"] == "resume"  # the framework's own unit, before the gadgets
    inject(run / rel)
    v = audit_in_process(run, cfg, out_dir=tmp_path / "audit")
    u = next(u for u in v["units"] if u["unit"] == unit)
    on_file = [f for f in u["findings"] if f.get("path") == rel and f["layer"] == "security"]
    kinds = ERRORS if unrestricted else (*ERRORS, "unknown_pickle_global")
    named = {n for f in on_file if f["kind"] in kinds for n in (f.get("detail") or {}).get("imports", [])}
    missing = sorted(g.qualname for g in CORPUS if g.qualname not in named)
    assert not missing, (missing, [(f["kind"], f["message"][:200]) for f in on_file])
    if unrestricted:
        assert u["usable_for"] == "none", u["findings"]
        assert {f["kind"] for f in on_file if f["severity"] == "error"} <= set(ERRORS) and \
            any(f["kind"] == "unrestricted_load_imports_unknown" for f in on_file)
    else:
        assert u["usable_for"] != "resume", u["findings"]
