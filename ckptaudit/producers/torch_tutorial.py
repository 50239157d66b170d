"""The PyTorch tutorial "Saving and loading a general checkpoint": ``model_state_dict`` and
``optimizer_state_dict`` in one ``torch.save`` dict, with ``epoch`` and often ``step``."""

from __future__ import annotations

from .contract import Contract, Producer

CONTRACT = Contract(
    producer="torch-tutorial", framework="torch", versions="PyTorch tutorial 'general checkpoint'",
    layouts=("torch-zip", "torch-legacy"), match_keys=("model_state_dict", "optimizer_state_dict"),
    keys={"weights": ("model_state_dict",), "optimizer": ("optimizer_state_dict",)},
    step_at=("*:step", "*:global_step"), epoch_at=("*:epoch",),
    saves=frozenset({"weights", "optimizer"}),
)

PRODUCER = Producer(key="torch-tutorial", name="a PyTorch general checkpoint", layouts=(), contracts=(CONTRACT,))
