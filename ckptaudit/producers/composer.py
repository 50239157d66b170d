"""MosaicML Composer: ``CheckpointSaver``'s ``ep{epoch}-ba{batch}-rank{rank}.pt`` files and its ``latest`` link.

Sources: the mosaicml 0.32.1 wheel (which wrote the tests' run) and mosaicml/composer at commit
6405188805a0054b4551ec49e4919c54c971d0e8 (0.33.0.dev0); the line numbers are the same in both unless said.

* ``composer/callbacks/checkpoint_saver.py`` :255 ``filename='ep{epoch}-ba{batch}-rank{rank}.pt'``, :259
  ``latest_filename='latest-rank{rank}.pt'``.  ``_save_checkpoint`` (:436-486): ``checkpoint.save_checkpoint``
  (:445), and only once it returned the old link is removed (:476) and ``os.symlink`` makes the new one, to the
  new file's path relative to the link's folder (:485).  ``{batch}`` is ``state.timestamp.batch``, the batches
  trained; ``{epoch}`` the epochs.
* ``composer/utils/checkpoint.py`` ``_save_checkpoint``: ``{'state': state.state_dict(), 'rng':
  reproducibility.get_rng_state()}`` (:1041 in 0.32.1, :1091 at the commit); ``_write_checkpoint_file`` writes
  the final name in place, ``open(filename, 'wb')`` and ``torch.save`` (:1137 in 0.32.1, :1187), no temporary
  name: a kill inside the save leaves the newest file cut under its own name, the link still on the save
  before.  A monolithic (not FSDP-sharded) save is written by global rank 0 alone.
* ``composer/core/state.py`` :544-557 ``serialized_attributes``, ``state_dict`` :1028: ``model``, ``optimizers``
  and ``schedulers`` ({class name: state_dict}), ``algorithms``, ``callbacks``, ``scaler``, ``timestamp``
  ({"Timestamp": ``Timestamp.state_dict()``, ``composer/core/time.py`` :579-595: ``batch``, ``epoch``…),
  ``rank_zero_seed``, ``run_name``, ``dataset_state``, ``integrations``, ``metadata``.
* Resume, ``composer/trainer/trainer.py``: with ``Trainer(autoresume=True)`` (:1618-1701) the load path is
  ``save_folder/latest-rank{rank}.pt`` whenever that exists (``_get_autoresume_checkpoint`` :1851-1931), whatever
  ``load_path`` says (:1690); otherwise ``Trainer(load_path=...)`` loads the file it names (:1703).  The load,
  ``checkpoint._torch_load_with_validation``: ``torch.load(weights_only=False)`` in 0.32.1 (:118); since commit
  640518880 (#3937, not in a release yet) ``weights_only=True`` with ``_COMPOSER_CHECKPOINT_SAFE_GLOBALS``
  (timedelta, numpy arrays and dtypes, TorchVersion: :66-92, :143-159).
* The weights are the ``ComposerModel``'s state dict: ``ComposerClassifier`` keeps the user's network as
  ``self.module`` (``composer/models/tasks/classification.py`` :70), ``HuggingFaceModel`` as ``self.model``
  (``composer/models/huggingface.py`` :124), so every key starts ``module.`` or ``model.``, and the resume loads
  it into the same wrapper (``State.load_model_state``, ``composer/core/state.py`` :1306).
"""

from __future__ import annotations

import posixpath
import re
from typing import Optional, Tuple

from .contract import Contract, Producer, ResumeLoad
from .paths import base, join, parent

#: ``CheckpointSaver``'s default ``filename`` as it names a file, and its ``{batch}``
UNIT_NAMES = r"ep\d+-ba\d+-rank\d+\.pt"
NAME_STEP = r"(?:^|-)ba(\d+)-rank\d+"
#: ``CheckpointSaver``'s default ``latest_filename`` (the link rank 0's autoresume follows)
_LATEST = re.compile(r"^latest-rank0\.pt$")

CONTRACT = Contract(
    producer="composer", framework="composer", versions="mosaicml 0.x (tested 0.32.1)",
    layouts=("composer",), match_keys=("state", "rng"),
    keys={"weights": ("state.model",), "optimizer": ("state.optimizers",), "scheduler": ("state.schedulers",),
          "scaler": ("state.scaler",), "rng": ("rng",), "sampler": ("state.dataset_state",),
          "metadata": ("state.metadata", "state.integrations", "state.callbacks", "state.algorithms")},
    step_at=("*:state.timestamp.Timestamp.batch",), epoch_at=("*:state.timestamp.Timestamp.epoch",),
    saves=frozenset({"weights", "optimizer", "step", "rng"}),
)


def default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """The target of ``latest-rank0.pt`` in ``folder`` (what ``Trainer(autoresume=True)`` loads); no default
    without that link."""
    links = [p for p in v.get("pointers") or [] if parent(p["path"]) == folder and _LATEST.match(base(p["path"]))]
    tag = (links[0].get("target") or "").strip() if links else ""
    if not tag:
        return None, bool(links)
    return (tag if tag.startswith("/") else posixpath.normpath(join(folder, tag))), True


PRODUCER = Producer(
    key="composer", name="Composer", layouts=("composer",), contracts=(CONTRACT,),
    unit_names=UNIT_NAMES, name_step=NAME_STEP,
    resume_loads={"mixed": ResumeLoad("composer checkpoint._torch_load_with_validation: torch.load("
                                      "weights_only=False) (mosaicml 0.32.1)", weights_only=False)},
    resume_call='Trainer(..., load_path="{path}", autoresume=False)',
    default_call="Trainer(..., autoresume=True)",
    default_pick=default_pick,
    reader_kinds=("file",),
    model_prefixes=("module.", "model."),
    pip_names={"composer": "mosaicml"},
)
