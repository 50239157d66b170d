"""torchtitan: ``CheckpointManager``'s ``step-<N>`` DCP folders, judged as its ``load()`` resumes them.

Sources: torchtitan 0.3.0 (the installed wheel; pytorch/torchtitan ``torchtitan/components/checkpointer/``),
line numbers of that version; torch 2.13 ``distributed/checkpoint``.

Recognition.  ``CheckpointManager._create_checkpoint_id`` (``dcp.py`` :686-690) saves step ``N`` into
``<dump_folder>/<checkpoint.folder>/step-N`` (``folder`` defaults to ``checkpoint``, ``base.py`` :229), each a
DCP folder (``dcp.save``, ``dcp.py`` :309-314; ``async_mode`` ``"disabled"`` by default, :116).  So a DCP unit
named ``step-<N>`` is resumed by torchtitan (:func:`claims`, the unit-level claim that words its resume), and a
DCP tree holding a ``train_state`` item is torchtitan's (:data:`CONTRACT`); any other DCP folder is plain
``dcp.save`` (:mod:`.dcp`).

What each key family means (the items of the saved state dict, flattened by DCP; ``dcp.py`` :150-158 and
:692-713 ``_flattened_model_states_sd``):

* weights: the model's own keys at the root (``tok_embeddings.weight``, ``layers.0.…``): ``ModelWrapper``
  (``base.py`` :85-143) merges every model part's ``state_dict()``; torchtitan before the flattening kept them
  under ``model.``;
* ``optimizer.state.<fqn>.<name>``: the per-parameter moments and step of each optimizer
  (``OptimizersContainer.state_dict``, ``components/optimizer/optimizer.py`` :306-318 →
  ``utils.get_flat_optim_state_dict`` :77-96: AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``);
  ``optimizer.param_groups.<fqn>.<key>``: each parameter's group hyper-parameters (``lr``, ``betas``,
  ``initial_lr`` set by the scheduler, …), one copy per parameter, no ``params`` list;
* ``lr_scheduler.last_epoch``: the schedulers' position alone (``LRSchedulersContainer.state_dict``,
  ``lr_scheduler.py`` :226-231; ``load_state_dict`` :233-247 recomputes each ``LambdaLR``'s rate from it);
* ``dataloader.dp_rank_<r>`` (a pickle of torchdata's ``StatefulDataLoader`` state, one per data-parallel rank)
  and ``dataloader.world_size`` (``components/dataloader.py`` :140-167: a resume at another data-parallel
  degree fails an assertion);
* ``train_state.step`` and ``train_state.ntokens_seen``: the Trainer's own state (``trainer.py`` :1078-1083);
* no RNG state: ``CheckpointManager`` saves none.

The resume contract.  ``Trainer.train`` calls ``checkpointer.load(step=config.checkpoint.load_step)``
(``trainer.py`` :1018).  With ``load_step = -1`` (the default, ``base.py`` :259) ``_find_load_step``
(``dcp.py`` :640-684) takes the highest ``step-N`` that holds a ``.metadata`` (or a
``model.safetensors.index.json``), whatever is in it; ``--checkpoint.load_step N`` takes ``step-N``
(:554-567).  Every state is loaded in one ``dcp.load`` (``_states_to_load`` :715-743, ``dcp_load`` :330-376):
DCP's ``DefaultLoadPlanner`` is strict (``create_default_local_load_plan`` raises ``Missing key in checkpoint
state_dict`` for an item the job asks for and ``.metadata`` lacks), so a unit missing the optimizer,
scheduler, dataloader or train state does not resume at all; only ``exclude_from_loading`` (non-model states)
relaxes that.  ``.metadata`` is read with ``pickle.load`` (``FileSystemReader.read_metadata``), every non-tensor
item with ``torch.load(weights_only=False)`` (``DefaultLoadPlanner.load_bytes``): the DCP scan's own judgement.

The last save.  With ``last_save_model_only=True`` (the default, ``base.py`` :247) the save at the last
training step holds the model alone, in ``export_dtype`` (``_save_last_step`` :745-792): a unit to warm-start
from (``initial_load_path`` with ``initial_load_model_only``), never one ``load()`` resumes; but
``_find_load_step`` still takes it, so the resume of a finished run fails until ``--checkpoint.load_step``
names the last full save.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from .contract import Contract, FileRole, Producer
from .paths import base, parent

#: The name of a save's folder (``_create_checkpoint_id``), and its step (``_find_load_step``'s ``step-(\d+)``).
STEP_FOLDER = re.compile(r"step-(\d+)")
#: What ``_find_load_step`` requires of a step folder besides its name: one of these files.
COMMITTED = (".metadata", "model.safetensors.index.json")

CONTRACT = Contract(
    producer="torchtitan", framework="torchtitan", versions="torchtitan>=0.1,<0.4 (tested 0.3.0)",
    layouts=("dcp",), match_keys=("train_state",),
    files=(FileRole(".metadata", "mixed", "dcp.load (FileSystemReader.read_metadata: pickle.load)"),
           FileRole("*.distcp", "mixed", "dcp.load (DefaultLoadPlanner; non-tensor items torch.load(weights_only=False))")),
    keys={"weights": ("", "model"), "optimizer": ("optimizer",), "scheduler": ("lr_scheduler",),
          "sampler": ("dataloader",), "step": ("train_state",)},
    step_at=("*:train_state.step",),
    # a full save holds all four (the model-only last save has no train_state: no contract, judged weights-only)
    saves=frozenset({"weights", "optimizer", "scheduler", "step"}), never_saves=frozenset({"rng"}),
)


def claims(unit: dict) -> bool:
    """A DCP unit whose folder is named ``step-<N>`` is resumed by torchtitan's ``CheckpointManager``."""
    return (unit.get("layout") or "") == "dcp" and STEP_FOLDER.fullmatch(base(unit["unit"])) is not None


def _commits(u: dict) -> bool:
    """Whether the unit row ``u`` of a step folder holds the file ``_find_load_step`` looks for (a DCP save
    without ``.metadata`` carries ``dcp_metadata_missing``)."""
    return not any(f.get("kind") == "dcp_metadata_missing" for f in u.get("findings") or [])


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """The ``step-N`` unit ``load()`` takes in ``folder`` (``_find_load_step``): the highest step folder with a
    ``.metadata``, or a Hugging Face index (the unit is then the index file inside ``step-N``)."""
    found = []
    for u in v.get("units") or []:
        name = u["unit"]
        if parent(name) == folder and (m := STEP_FOLDER.fullmatch(base(name))) and _commits(u):
            found.append((int(m.group(1)), name))
        elif base(name) in COMMITTED and parent(parent(name)) == folder \
                and (m := STEP_FOLDER.fullmatch(base(parent(name)))):
            found.append((int(m.group(1)), name))
    return (max(found)[1] if found else None), True


def step_of(unit: str) -> Optional[int]:
    """The step ``--checkpoint.load_step`` takes for a unit named ``step-<N>`` (or a file inside one)."""
    for name in (base(unit), base(parent(unit))):
        if m := STEP_FOLDER.fullmatch(name):
            return int(m.group(1))
    return None


PRODUCER = Producer(
    key="torchtitan", name="torchtitan", layouts=(), contracts=(CONTRACT,),
    roles=(("mixed", r"\.metadata"),),
    resume_call=('torchrun … -m torchtitan.train --module … --config … --checkpoint.enable '
                 '--checkpoint.folder "{dir}" --checkpoint.load_step {step}'),
    default_call="CheckpointManager.load() (--checkpoint.load_step -1)",
    default_pick=default_pick,
    claims=claims,
    name_step=r"^step-(\d+)$",
    pip_names={"torchtitan": "torchtitan"},
)
