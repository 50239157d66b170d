"""Lightning: ``ModelCheckpoint`` ``.ckpt`` files, and ``last.ckpt`` as the configured resume entry.

Sources (lightning 2.6): ``fabric/utilities/cloud_io.py::_load`` (``torch.load`` with the caller's
``weights_only``, default None: torch's default) and ``trainer/connectors/checkpoint_connector.py``.
``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` as a second full save (``_save_last_checkpoint`` →
``_save_checkpoint``); ``save_last="link"`` makes a symbolic link.  ``trainer.fit(model, ckpt_path="last")``
loads the most recently written ``last*.ckpt`` of the checkpoint folder (``ModelCheckpoint._find_last_checkpoints``,
``_CheckpointConnector._parse_ckpt_path``; ``CHECKPOINT_NAME_LAST`` + ``FILE_EXTENSION``, ``-v<N>`` versions).
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from .contract import Contract, FileRole, PointerFile, Producer, RequiredKeys
from .paths import base, join, parent

CONTRACT = Contract(
    producer="lightning", framework="lightning", versions="lightning>=2.0,<3 (tested 2.6.6)",
    layouts=("lightning", "torch-zip"), match_keys=("pytorch-lightning_version", "state_dict"),
    files=(FileRole("*.ckpt", "mixed", "torch.load (weights_only per Trainer.fit; torch's default)"),),
    keys={"weights": ("state_dict",), "optimizer": ("optimizer_states",), "scheduler": ("lr_schedulers",),
          "scaler": ("native_amp_scaling_state",), "sampler": ("loops",),
          "metadata": ("hyper_parameters", "callbacks", "datamodule_hyper_parameters")},
    step_at=("*:global_step",), epoch_at=("*:epoch",),
    saves=frozenset({"weights", "optimizer", "step"}), never_saves=frozenset({"rng"}),
)

_ATTRIBUTE_DICT = ("Lightning hparams container, a dict subclass with attribute access and no __setstate__ "
                   "(seen as hyper_parameters in Lightning checkpoints). torch 2.13 allows SETITEM(S) only on "
                   "exact dict/OrderedDict/Counter (_weights_only_unpickler.py _check_set_item_target), so "
                   "allowlisting the class itself still fails: the repair maps the name to dict and loads "
                   "the hparams as a plain dict")
#: (obj, "pickled.name") form: torch matches the name in the file, here mapped to dict
BENIGN_GLOBALS = {n: (f'(dict, "{n}")', _ATTRIBUTE_DICT) for n in (
    "pytorch_lightning.utilities.parsing.AttributeDict", "lightning.fabric.utilities.data.AttributeDict",
    "lightning.pytorch.utilities.parsing.AttributeDict")}

#: What ``trainer.fit(model, ckpt_path=...)`` reads from the file before it trains (lightning 2.6.6, trainer/
#: connectors/checkpoint_connector.py): ``resume_start`` (:84) passes it to ``_pl_migrate_checkpoint``, whose
#: ``_get_version`` indexes ``checkpoint["pytorch-lightning_version"]`` (utilities/migration/utils.py:164);
#: ``restore_optimizers_and_schedulers`` raises ``KeyError`` without ``optimizer_states`` (:374, under the default
#: ``strategy.lightning_restore_optimizer``) or ``lr_schedulers`` (:381, an empty list when the job has none).
#: ``dump_checkpoint`` (:415-470) always writes ``epoch``, ``global_step``, the version, ``state_dict`` and
#: ``loops``, and leaves ``callbacks``, ``optimizer_states`` and ``lr_schedulers`` out of a ``weights_only`` save.
REQUIRED_KEYS = RequiredKeys(
    keys={"pytorch-lightning_version": "raises KeyError in _pl_migrate_checkpoint before any state is restored",
          "optimizer_states": "raises KeyError ('Trying to restore optimizer state but checkpoint contains only "
                              "the model')",
          "lr_schedulers": "raises KeyError ('Trying to restore learning rate scheduler state but checkpoint "
                           "contains only the model')"},
    format_keys=frozenset({"pytorch-lightning_version", "state_dict", "loops", "optimizer_states", "lr_schedulers",
                           "callbacks", "epoch", "global_step", "hparams_name", "hyper_parameters"}),
    min_format_keys=3,
    weights_only_without=frozenset({"callbacks", "optimizer_states", "lr_schedulers"}),
    source="lightning 2.6.6 trainer/connectors/checkpoint_connector.py :84, :374, :381 and "
           "utilities/migration/utils.py:164",
    repair={"pytorch-lightning_version":
            "import torch, lightning\n"
            "ckpt = torch.load({file!r}, map_location=\"cpu\", weights_only=True)\n"
            "ckpt[\"pytorch-lightning_version\"] = lightning.__version__  # no migration\n"
            "torch.save(ckpt, {fixed!r})"},
)

_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")
#: The call that loads the resume entry.
ENTRY_CALL = 'trainer.fit(model, ckpt_path="last")'


def is_entry(unit: str) -> bool:
    """True for the file ``ckpt_path="last"`` resumes from (``last.ckpt``, ``last-v1.ckpt``)."""
    return bool(_LAST.match(base(unit)))


def claims(unit: dict) -> bool:
    """A ``.ckpt`` file of a plain layout (damaged or unrecognised) is resumed as Lightning's own."""
    return base(unit["unit"]).endswith(".ckpt") and (unit.get("layout") or "") in ("torch-zip", "single-file")


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """The newest ``last*.ckpt`` in ``folder``, or the target of a ``save_last="link"`` link."""
    last = sorted(u["unit"] for u in v.get("units") or [] if parent(u["unit"]) == folder and is_entry(u["unit"]))
    links = [p for p in v.get("pointers") or [] if is_entry(p["path"]) and parent(p["path"]) == folder]
    if not last and links:  # save_last="link": the link's target (relative to its folder)
        tag = (links[-1].get("target") or "").strip()
        return (join(folder, tag) if folder and tag else tag or None), True
    return (last[-1] if last else None), bool(last)


PRODUCER = Producer(
    key="lightning", name="Lightning", layouts=("lightning",), contracts=(CONTRACT,),
    resume_call='trainer.fit(model, ckpt_path="{path}")',
    default_call=ENTRY_CALL,
    default_pick=default_pick,
    claims=claims,
    reader_kinds=("file",),
    entry=is_entry,
    entry_call=ENTRY_CALL,
    unit_suffix=".ckpt",
    pointers=(PointerFile("last.ckpt", "Lightning last checkpoint"),),
    version_keys={"pytorch-lightning_version": "lightning"},
    version_dists={"lightning": "pytorch-lightning"},
    pip_names={"lightning": "lightning", "pytorch_lightning": "pytorch-lightning"},
    benign_globals=BENIGN_GLOBALS,
    required_keys=REQUIRED_KEYS,
)
