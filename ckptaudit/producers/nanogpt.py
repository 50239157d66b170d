"""nanoGPT's ``train.py``: one ``ckpt.pt`` dict with ``model``, ``optimizer``, ``model_args`` and ``iter_num``.

Source: nanoGPT ``train.py`` (2023-): the learning rate is a function of ``iter_num`` (``get_lr``), not a
saved scheduler; no RNG state is saved.
"""

from __future__ import annotations

from .contract import Contract, Producer

CONTRACT = Contract(
    producer="nanogpt", framework="nanoGPT", versions="nanoGPT train.py (2023-)",
    layouts=("torch-zip", "torch-legacy"), match_keys=("model", "optimizer", "model_args", "iter_num"),
    keys={"weights": ("model",), "optimizer": ("optimizer",), "metadata": ("model_args", "config")},
    step_at=("*:iter_num",),
    saves=frozenset({"weights", "optimizer", "step"}),
    never_saves=frozenset({"scheduler", "rng"}),
)

PRODUCER = Producer(key="nanogpt", name="nanoGPT", layouts=(), contracts=(CONTRACT,))
