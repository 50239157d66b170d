"""Issue 24's gadget corpus in every file role of real framework runs: judged by what the resume's loader does.

Each placement takes a clean run written by the framework itself (tests/frameworks), adds the gadgets of
:mod:`tests.gadgets` to one pickle-bearing file of one of its units, and audits the copy.  ``loads`` says how
that framework's own resume unpickles the file, read from its code (installed versions; the function is cited
with each placement):

* ``UNRESTRICTED`` (``torch.load(weights_only=False)``, no allowlist): every gadget is named in an error and
  the unit is unusable (``usable_for: none``).
* ``RESTRICTED`` (``torch.load(weights_only=True)``, with or without the framework's own allowed globals):
  every gadget is still named, and the unit is not called resumable: that load would fail.
* ``NEVER`` (the resume does not unpickle the file: HF ``training_args.bin``): every gadget is still named,
  since loading the file by hand would run them.  What the unit's verdict should be is asserted on its own
  (see :func:`test_a_file_the_resume_never_unpickles_does_not_make_the_unit_unusable`).

To keep CI time down, placements of one fixture that sit in *different units* share one copied run and one
audit (``group``); each placement keeps its own test and assertions, and the test checks that no other file
of its unit carries a security warning or error, so the unit's verdict is this file's doing.
"""

from __future__ import annotations

import json
import shutil
from typing import Dict, NamedTuple, Tuple

import pytest

from ckptaudit.pipeline import audit_in_process
from ckptaudit.security.resume import resume_load

from .gadgets import CORPUS, inject
from .test_frameworks import fixture_cache  # noqa: F401 - the session fixture that generates the runs

UNRESTRICTED, RESTRICTED, NEVER = "weights_only=False", "weights_only=True", "never"


class Placement(NamedTuple):
    fixture: str
    file: str  # run-relative
    loads: str  # how the framework's resume unpickles it: UNRESTRICTED | RESTRICTED | NEVER
    group: str  # placements of one fixture and group share a copied run (each in its own unit)
    source: str  # the resume code that decides ``loads`` (installed framework version)


_DS_MODEL = ("deepspeed 0.19.8 DeepSpeedEngine._load_checkpoint: SDLoaderFactory.get_sd_loader(..., "
             "checkpoint_engine).load -> TorchCheckpointEngine.load: torch.load(weights_only=False)")
_DS_ZERO3_MODEL = (_DS_MODEL + "; ZeRO-3: _get_ckpt_name names zero_pp_rank_<dp rank>_..._model_states.pt, "
                   "each dp rank loads its own")
_DS_OPTIM = ("deepspeed 0.19.8 DeepSpeedEngine._load_zero_checkpoint -> _get_all_zero_checkpoint_state_dicts: "
             "dp rank i loads zero_pp_rank_i_..._optim_states.pt (every rank's file under elastic_checkpoint) "
             "with TorchCheckpointEngine.load: torch.load(weights_only=False)")
_ACC_LOAD = ("accelerate 1.16.0 checkpointing.load_accelerator_state: accelerate.utils.other.load, "
             "torch.load(weights_only=True) with TORCH_SAFE_GLOBALS")
_HF5 = "transformers 5.24.0 Trainer."
_HF4 = "transformers 4.57.6 Trainer."
_HF_OPT = ("_load_optimizer_and_scheduler: check_torch_load_is_safe(); "
           "torch.load(optimizer.pt / scheduler.pt, weights_only=True)")
_HF_ARGS = ("training_args.bin is only written (torch.save(self.args, TRAINING_ARGS_NAME)); no torch.load of "
            "it anywhere in transformers/")
_PL = ("lightning 2.6.6 _CheckpointConnector.resume_start -> Strategy.load_checkpoint -> "
       "TorchCheckpointIO.load_checkpoint -> cloud_io._load: torch.load(weights_only=None) -> torch 2.13's "
       "default, weights_only=True (Trainer.fit(weights_only=None))")

PLACEMENTS = [
    # DeepSpeed ZeRO-2: weights (mp_rank_00_model_states.pt) and each dp rank's optimizer partition
    Placement("deepspeed_zero2_clean", "global_step30/mp_rank_00_model_states.pt", UNRESTRICTED, "a", _DS_MODEL),
    Placement("deepspeed_zero2_clean", "global_step20/zero_pp_rank_0_mp_rank_00_optim_states.pt", UNRESTRICTED,
              "a", _DS_OPTIM),
    Placement("deepspeed_zero2_clean", "global_step10/zero_pp_rank_1_mp_rank_00_optim_states.pt", UNRESTRICTED,
              "a", _DS_OPTIM),
    # DeepSpeed ZeRO-3: per-rank model states, and optimizer files that hold the partitioned weights
    Placement("deepspeed_zero3_clean", "global_step30/zero_pp_rank_0_mp_rank_00_model_states.pt", UNRESTRICTED,
              "a", _DS_ZERO3_MODEL),
    Placement("deepspeed_zero3_clean", "global_step20/zero_pp_rank_1_mp_rank_00_model_states.pt", UNRESTRICTED,
              "a", _DS_ZERO3_MODEL),
    Placement("deepspeed_zero3_clean", "global_step10/zero_pp_rank_1_mp_rank_00_optim_states.pt", UNRESTRICTED,
              "a", _DS_OPTIM),
    # accelerate save_state: custom objects, optimizer, RNG, scheduler (model.safetensors holds no pickle)
    Placement("accelerate_clean", "checkpoints/checkpoint_11/custom_checkpoint_0.pkl", UNRESTRICTED, "a",
              "accelerate 1.16.0 checkpointing.load_custom_state: load(..., weights_only=False)"),
    Placement("accelerate_clean", "checkpoints/checkpoint_10/optimizer.bin", RESTRICTED, "a", _ACC_LOAD),
    Placement("accelerate_clean", "checkpoints/checkpoint_9/random_states_0.pkl", RESTRICTED, "a", _ACC_LOAD),
    Placement("accelerate_clean", "checkpoints/checkpoint_8/scheduler.bin", RESTRICTED, "a", _ACC_LOAD),
    # HF Trainer 5.x (model.safetensors holds no pickle)
    Placement("hf_trainer_clean", "checkpoint-30/optimizer.pt", RESTRICTED, "a", _HF5 + _HF_OPT),
    Placement("hf_trainer_clean", "checkpoint-20/scheduler.pt", RESTRICTED, "a", _HF5 + _HF_OPT),
    Placement("hf_trainer_clean", "checkpoint-10/rng_state.pth", RESTRICTED, "a",
              _HF5 + "_load_rng_state: torch.load(rng_file, weights_only=True) inside trainer_pt_utils.safe_globals()"),
    Placement("hf_trainer_clean", "checkpoint-30/training_args.bin", NEVER, "b", _HF5 + " " + _HF_ARGS),
    # HF Trainer 4.57 (its own interpreter; same files)
    Placement("hf_trainer_tf4_clean", "checkpoint-30/optimizer.pt", RESTRICTED, "a", _HF4 + _HF_OPT),
    Placement("hf_trainer_tf4_clean", "checkpoint-20/scheduler.pt", RESTRICTED, "a", _HF4 + _HF_OPT),
    # 4.57 passes no weights_only here: torch's default decides (True from torch 2.6 on, as installed; before
    # 2.6, safe_globals() is a nullcontext and this load is unrestricted)
    Placement("hf_trainer_tf4_clean", "checkpoint-10/rng_state.pth", RESTRICTED, "a",
              _HF4 + "_load_rng_state: torch.load(rng_file) inside trainer.safe_globals(), torch's default "
              "weights_only=True"),
    Placement("hf_trainer_tf4_clean", "checkpoint-30/training_args.bin", NEVER, "b", _HF4 + " " + _HF_ARGS),
    # Lightning ModelCheckpoint: each .ckpt is a unit; Trainer.fit(ckpt_path=path | "last" | "best")
    Placement("lightning_clean", "checkpoints/epoch=2-step=30.ckpt", RESTRICTED, "a", _PL),
    Placement("lightning_clean", "checkpoints/last.ckpt", RESTRICTED, "a", _PL),
    Placement("lightning_clean", "checkpoints/best-epoch=0-step=10.ckpt", RESTRICTED, "a", _PL),
    # plain torch.save loops: the user's script, torch.load with torch 2.13's default weights_only=True
    Placement("plain_nanogpt_clean", "ckpt_000030.pt", RESTRICTED, "a",
              "nanoGPT train.py: torch.load(ckpt_path, map_location=device), torch's default weights_only=True"),
    Placement("plain_tutorial_clean", "checkpoint_30.pt", RESTRICTED, "a",
              "PyTorch tutorial 'general checkpoint': torch.load(PATH), torch's default weights_only=True"),
]
ERRORS = ("malicious_pickle_code_exec", "unrestricted_load_imports_unknown")
IDS = [f"{p.fixture}:{p.file.split('/')[-1]}" for p in PLACEMENTS]

_CLEAN: Dict[str, dict] = {}
_AUDITS: Dict[Tuple[str, str], dict] = {}


def _source(cache, fixture):
    src = cache / fixture
    if (src / "skipped.json").exists():
        pytest.fail(json.loads((src / "skipped.json").read_text())["reason"])
    return src, json.loads((src / "truth.json").read_text())["audit_config"]


def _clean(cache, tmp_factory, fixture: str) -> dict:
    """The clean fixture's verdict, audited once per session (the audit leaves the run as it is:
    tests/test_frameworks asserts it)."""
    if fixture not in _CLEAN:
        src, cfg = _source(cache, fixture)
        _CLEAN[fixture] = audit_in_process(src / "run", cfg, out_dir=tmp_factory.mktemp("clean") / "audit")
    return _CLEAN[fixture]


def _audits(cache, tmp_factory, p: Placement) -> Tuple[dict, dict]:
    """(the clean fixture's verdict, the verdict of the copy with the gadgets of ``p``'s whole group), each
    audited once per session."""
    key = (p.fixture, p.group)
    if key not in _AUDITS:
        src, cfg = _source(cache, p.fixture)
        d = tmp_factory.mktemp(f"{p.fixture}-{p.group}")
        shutil.copytree(src / "run", d / "run", symlinks=True)
        for q in PLACEMENTS:
            if (q.fixture, q.group) == key:
                inject(d / "run" / q.file)
        _AUDITS[key] = audit_in_process(d / "run", cfg, out_dir=d / "audit")
    return _clean(cache, tmp_factory, p.fixture), _AUDITS[key]


def _unit_of(v: dict, rel: str) -> dict:
    return next(u for u in v["units"] if rel == u["unit"] or rel.startswith(u["unit"].rstrip("/") + "/"))


def test_groups_keep_one_placement_per_unit(fixture_cache, tmp_path_factory):  # noqa: F811
    """A shared run stays attributable: no two placements of a group sit in one unit."""
    seen: Dict[Tuple[str, str, str], Placement] = {}
    for p in PLACEMENTS:
        k = (p.fixture, p.group, _unit_of(_clean(fixture_cache, tmp_path_factory, p.fixture), p.file)["unit"])
        assert k not in seen, (p, seen[k])
        seen[k] = p


@pytest.mark.parametrize("p", PLACEMENTS, ids=IDS)
def test_every_gadget_is_named_in_every_file_role(fixture_cache, tmp_path_factory, p):  # noqa: F811
    clean, v = _audits(fixture_cache, tmp_path_factory, p)
    before = _unit_of(clean, p.file)
    assert before["usable_for"] == "resume"  # the framework's own unit, before the gadgets
    # the audit's own table of resume loaders says what the framework's code says
    res = resume_load(before["layout"], p.file)
    assert {UNRESTRICTED: res is not None and not res.weights_only and not res.never,
            RESTRICTED: res is None or (res.weights_only and not res.never),
            NEVER: res is not None and res.never}[p.loads], (p.loads, res)

    u = _unit_of(v, p.file)
    assert u["unit"] == before["unit"]
    on_file = [f for f in u["findings"] if f.get("path") == p.file and f["layer"] == "security"]
    kinds = ERRORS if p.loads == UNRESTRICTED else (*ERRORS, "unknown_pickle_global")
    named = {n for f in on_file if f["kind"] in kinds for n in (f.get("detail") or {}).get("imports", [])}
    missing = sorted(g.qualname for g in CORPUS if g.qualname not in named)
    assert not missing, (missing, [(f["kind"], f["message"][:200]) for f in on_file])
    # attributable: no other file of the unit has a security warning or error
    others = [(f["kind"], f.get("path")) for f in u["findings"]
              if f["layer"] == "security" and f["severity"] != "info" and f.get("path") != p.file]
    assert not others, others
    if p.loads == UNRESTRICTED:
        assert u["usable_for"] == "none", u["findings"]
        assert {f["kind"] for f in on_file if f["severity"] == "error"} <= set(ERRORS) and \
            any(f["kind"] == "unrestricted_load_imports_unknown" for f in on_file)
    elif p.loads == RESTRICTED:
        assert u["usable_for"] != "resume", u["findings"]
        assert not any(f["kind"] == "unrestricted_load_imports_unknown" for f in on_file), on_file
    else:  # the resume never loads it: no finding may say it does
        assert not any(f["kind"] == "unrestricted_load_imports_unknown" for f in on_file), on_file


@pytest.mark.parametrize("p", [p for p in PLACEMENTS if p.loads == NEVER],
                         ids=[i for i, p in zip(IDS, PLACEMENTS) if p.loads == NEVER])
def test_a_planted_payload_in_a_file_the_resume_never_unpickles_still_bars_the_unit(
        fixture_cache, tmp_path_factory, p):  # noqa: F811
    """``training_args.bin`` is never unpickled by the resume, so no finding says the resume would run it; but a
    unit someone planted a known code-running payload in is not one to resume from (issue 12's rule: a
    dangerous finding caps the unit at none), and the file is named as what loading it by hand would do."""
    _, v = _audits(fixture_cache, tmp_path_factory, p)
    u = _unit_of(v, p.file)
    on_file = [f for f in u["findings"] if f.get("path") == p.file and f["layer"] == "security"]
    assert u["usable_for"] == "none", [(f["kind"], f["severity"], f.get("caps")) for f in u["findings"]]
    assert any(f["kind"] == "malicious_pickle_code_exec" and f["severity"] == "error" for f in on_file), on_file
