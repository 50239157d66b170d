"""torch.distributed.checkpoint (DCP) folders written by a plain ``dcp.save``: a ``.metadata`` and ``*.distcp`` rank files.

Sources: torch 2.13 ``torch/distributed/checkpoint`` (``filesystem.py``: a ``.metadata`` pickle read with
``pickle.load`` by ``FileSystemReader.read_metadata`` :926, ``__<rank>_<n>.distcp`` data files written by
``_write_item`` :320; ``.metadata`` is written last, through ``.metadata.tmp`` and a rename).  What a plain
DCP state dict holds is the caller's choice: no key is required and none has a fixed meaning, so this
producer identifies every DCP unit that no framework's contract claims (torchtitan's ``train_state``, its
``step-<N>`` folders: :mod:`.torchtitan`), and its components are found by their shape alone.  Resume:
``torch.distributed.checkpoint.load(state_dict, checkpoint_id=…)``, whose default planner is strict (an item
the state dict asks for and ``.metadata`` lacks raises).
"""

from __future__ import annotations

from .contract import Contract, FileRole, Producer

CONTRACT = Contract(
    producer="torch.distributed.checkpoint", framework="torch.distributed.checkpoint",
    versions="torch>=2.4 (tested 2.13.0)", layouts=("dcp",), match_files=(".metadata", "*.distcp"),
    files=(FileRole(".metadata", "mixed", "torch.distributed.checkpoint.load"),
           FileRole("*.distcp", "mixed", "torch.distributed.checkpoint.load")),
)

PRODUCER = Producer(
    key="dcp", name="torch.distributed.checkpoint", layouts=("dcp",), folder_adapters=((30, "dcp:ADAPTER"),), contracts=(CONTRACT,),
    roles=(("mixed", r"\.metadata"),),
    resume_call='torch.distributed.checkpoint.load(state_dict, checkpoint_id="{path}")',
    claim_files=(".metadata", "*.distcp"),
)
