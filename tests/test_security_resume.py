"""Benign pickle imports are judged by what the producer's own resume does with the file (ckptaudit.security.resume)."""

from __future__ import annotations

import json
import pickle

import pytest

from ckptaudit import findings
from ckptaudit.pickle_walk import walk
from ckptaudit.pipeline import audit_in_process
from ckptaudit.security import scan
from ckptaudit.security.resume import resume_load

from .test_frameworks import fixture_cache  # noqa: F401 - the session fixture of the generated framework runs

np = pytest.importorskip("numpy")


def _rng_blob(extra=None) -> bytes:
    """A pickle shaped like transformers' rng_state.pth data.pkl: numpy's RNG state (uint32 array)."""
    state = {"numpy": np.random.get_state(), "python": (3, (1, 2), None)}
    if extra is not None:
        state["extra"] = extra
    return pickle.dumps(state, protocol=2)


def test_hf_rng_file_with_only_trainer_allowed_numpy_is_info_without_repair():
    res = resume_load("hf-trainer", "checkpoint-5/rng_state.pth")
    _, fs = scan(walk(_rng_blob()), path="checkpoint-5/rng_state.pth", member="rng_state/data.pkl", resume=res)
    assert [(f.kind, f.severity, f.repair) for f in fs] == [("pickle_global_allowed_by_resume", "info", "")]
    assert fs[0].detail["benign"] == ("'numpy._core.multiarray._reconstruct', 'numpy.dtype', "
                                      "'numpy.dtypes.UInt32DType', 'numpy.ndarray'")
    assert findings.usable_for(fs) == "resume"


def test_hf_rng_file_with_a_global_outside_the_trainer_allowlist_keeps_a_warning_naming_only_it():
    res = resume_load("hf-trainer", "checkpoint-5/rng_state.pth")
    _, fs = scan(walk(_rng_blob(extra=np.float64(1.5))), path="p", member="m", resume=res)
    assert [(f.kind, f.severity) for f in fs] == [("non_allowlisted_global_benign", "warning")]
    # message and repair list the same names: exactly what the Trainer's safe_globals() lacks
    assert fs[0].detail["allow"] == "'numpy._core.multiarray.scalar', 'numpy.dtypes.Float64DType'"
    assert fs[0].repair == ("import numpy._core.multiarray\nimport numpy.dtypes\nimport torch.serialization\n"
                            "torch.serialization.add_safe_globals([numpy._core.multiarray.scalar, "
                            "numpy.dtypes.Float64DType])")
    assert "needs exactly 'numpy._core.multiarray.scalar', 'numpy.dtypes.Float64DType' allowed" in fs[0].message


def test_without_a_resume_loader_message_and_repair_name_the_same_globals():
    _, fs = scan(walk(_rng_blob()), path="p", member="m")
    assert fs[0].kind == "non_allowlisted_global_benign"
    assert fs[0].detail["allow"] == ("'numpy._core.multiarray._reconstruct', 'numpy.dtype', "
                                     "'numpy.dtypes.UInt32DType', 'numpy.ndarray'")
    assert fs[0].repair == ("import numpy._core.multiarray\nimport numpy.dtypes\nimport torch.serialization\n"
                            "torch.serialization.add_safe_globals([numpy._core.multiarray._reconstruct, numpy.dtype, "
                            "numpy.dtypes.UInt32DType, numpy.ndarray])")


def test_file_the_resume_never_unpickles_is_info_but_code_execution_stays_an_error():
    import argparse

    res = resume_load("hf-trainer", "checkpoint-5/training_args.bin")
    assert res is not None and res.never
    _, fs = scan(walk(pickle.dumps(argparse.Namespace(lr=1.0), protocol=2)), path="p", member="m", resume=res)
    assert [(f.kind, f.severity, f.repair) for f in fs] == [("pickle_global_not_loaded_on_resume", "info", "")]
    evil = b"\x80\x02cposix\nsystem\nX\x02\x00\x00\x00idq\x85R."
    _, fs = scan(walk(evil), path="p", member="m", resume=res)
    assert [f.kind for f in fs] == ["malicious_pickle_code_exec"]


def test_weights_only_false_loader_needs_no_allowlist():
    import argparse

    res = resume_load("deepspeed", "global_step10/mp_rank_00_model_states.pt")
    assert res is not None and not res.weights_only
    _, fs = scan(walk(pickle.dumps(argparse.Namespace(lr=1.0), protocol=2)), path="p", member="m", resume=res)
    assert [(f.kind, f.severity) for f in fs] == [("pickle_global_allowed_by_resume", "info")]
    assert resume_load("hf-trainer", "checkpoint-5/optimizer.pt") is None  # plain weights-only, no allowlist


@pytest.mark.parametrize("name, contracts", [("hf_trainer_clean", "on"), ("hf_trainer_clean", "off"),
                                             ("accelerate_clean", "on")])
def test_clean_framework_run_has_no_security_warning(name, contracts, fixture_cache, tmp_path,  # noqa: F811
                                                     monkeypatch):
    d = fixture_cache / name
    if (d / "skipped.json").exists():
        pytest.skip(json.loads((d / "skipped.json").read_text())["reason"])
    if contracts == "off":
        monkeypatch.setenv("CKPTAUDIT_PRODUCER_CONTRACTS", "0")
    else:
        monkeypatch.delenv("CKPTAUDIT_PRODUCER_CONTRACTS", raising=False)
    truth = json.loads((d / "truth.json").read_text())
    v = audit_in_process(d / "run", truth["audit_config"], out_dir=tmp_path / "out")
    sec = [(u["unit"], f["kind"], f["severity"]) for u in v["units"] for f in u["findings"] if f["layer"] == "security"]
    assert sec, "the run's RNG files import numpy globals: an info finding says the resume allows them"
    assert [s for s in sec if s[2] != "info"] == []
    assert not any("Before using" in r for r in v["reasons"]), v["reasons"]
    assert not any(f["repair"] for u in v["units"] for f in u["findings"] if f["layer"] == "security")


class _WritesAFile:
    """Pickled as ``torch.serialization.save({}, <path>)``: a global on no list (neither data nor a known
    danger) that overwrites any file when called — one of issue 24's gadgets."""

    def __reduce__(self):
        import torch

        return (torch.save, ({}, "/tmp/ckptaudit-gadget-ran"))


def test_an_unknown_global_is_an_error_where_the_resume_unpickles_without_restriction(tmp_path):
    """DeepSpeed's resume reads mp_rank_XX_model_states.pt with torch.load(weights_only=False): the gadget
    would run there, so the unit is unusable; in a plain torch.save file the resume's weights_only=True
    refuses the name, which stays a warning about a load that fails."""
    import torch

    from ckptaudit.pipeline import audit_in_process

    ds = tmp_path / "ds"
    g = ds / "global_step100"
    g.mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(2)}, "global_steps": 100, "extra": _WritesAFile()},
               g / "mp_rank_00_model_states.pt")
    plain = tmp_path / "plain"
    plain.mkdir()
    torch.save({"model": {"w": torch.ones(2)}, "iter_num": 100, "extra": _WritesAFile()}, plain / "ckpt_000100.pt")
    v = audit_in_process(ds, {}, out_dir=tmp_path / "a1")
    (u,) = v["units"]
    (f,) = [f for f in u["findings"] if f["kind"] == "unrestricted_load_imports_unknown"]
    assert (f["severity"], f["layer"], u["usable_for"]) == ("error", "security", "none")
    assert "'torch.serialization.save'" in f["message"] and "weights_only=False" in f["message"]
    v = audit_in_process(plain, {}, out_dir=tmp_path / "a2")
    (u,) = v["units"]
    kinds = {f["kind"] for f in u["findings"]}
    assert "unknown_pickle_global" in kinds and "unrestricted_load_imports_unknown" not in kinds
    import os

    assert not os.path.exists("/tmp/ckptaudit-gadget-ran")
