"""torch.distributed.checkpoint (DCP) folders, as torchtitan writes them (``step-N``).

Sources: torch 2.13 ``torch/distributed/checkpoint`` (a ``.metadata`` pickle read with ``pickle.load``, and
``*.distcp`` data files per rank); torchtitan ``components/checkpoint.py`` (``step-N`` folders whose state
holds ``train_state.step``).  Resume: ``torch.distributed.checkpoint.load(state_dict, checkpoint_id=…)``.
"""

from __future__ import annotations

from .contract import Contract, FileRole, Producer

CONTRACT = Contract(
    producer="torchtitan", framework="torch.distributed.checkpoint", versions="torch>=2.4 (tested 2.13.0)",
    layouts=("dcp",), match_keys=("train_state",),
    files=(FileRole(".metadata", "metadata", "torch.distributed.checkpoint.load"),
           FileRole("*.distcp", "mixed", "torch.distributed.checkpoint.load")),
    keys={"weights": ("model",), "optimizer": ("optimizer",), "scheduler": ("lr_scheduler",),
          "sampler": ("dataloader",)},
    step_at=("*:train_state.step",),
    saves=frozenset({"weights", "optimizer", "step"}),
)

PRODUCER = Producer(
    key="dcp", name="torch.distributed.checkpoint", layouts=("dcp",), folder_adapters=((30, "dcp:ADAPTER"),), contracts=(CONTRACT,),
    roles=(("mixed", r"\.metadata"),),
    resume_call='torch.distributed.checkpoint.load(state_dict, checkpoint_id="{path}")',
    claim_files=(".metadata", "*.distcp"),
)
