"""transformers 4.57 ``Trainer`` runs, generated through a second interpreter.

transformers 4.x and 5.x cannot share one environment, so these fixtures run
under ``PYTHON`` (a venv whose own site-packages hold transformers 4.57 and take
precedence); generate.py skips them, printing ``PYTHON_SETUP``, when it is absent.
Same training and save settings as fw_hf_trainer.py.
"""

from __future__ import annotations

from pathlib import Path

from . import fw_hf_trainer as H

REQUIRES = ["transformers", "accelerate", "safetensors"]
PYTHON = ".fixture-cache/venv-tf4/bin/python"
PYTHON_SETUP = ("python3 -m venv --system-site-packages .fixture-cache/venv-tf4 && "
                ".fixture-cache/venv-tf4/bin/pip install torch==2.13.0 'transformers==4.57.*' accelerate safetensors")


def _check_version():
    import transformers

    if not transformers.__version__.startswith("4."):
        raise RuntimeError(f"{PYTHON} imports transformers {transformers.__version__} ({transformers.__file__}), "
                           f"not 4.x")


def clean(dest: Path) -> dict:
    _check_version()
    return H.clean(dest, name="hf_trainer_tf4_clean")


def kill_in_optimizer_save(dest: Path) -> dict:
    _check_version()
    return H.kill_in_optimizer_save(dest, name="hf_trainer_tf4_kill_in_optimizer_save")


def kill_in_model_save(dest: Path) -> dict:
    _check_version()
    return H.kill_in_model_save(dest, name="hf_trainer_tf4_kill_in_model_save")


def missing_scheduler(dest: Path) -> dict:
    _check_version()
    return H.missing_scheduler(dest, name="hf_trainer_tf4_missing_scheduler")


FIXTURES = {
    "hf_trainer_tf4_clean": clean,
    "hf_trainer_tf4_kill_in_optimizer_save": kill_in_optimizer_save,
    "hf_trainer_tf4_kill_in_model_save": kill_in_model_save,
    "hf_trainer_tf4_missing_scheduler": missing_scheduler,
}
