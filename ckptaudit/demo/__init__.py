"""A real, tiny training run with a real crash: the bundled demo and a test fixture.

:func:`train` trains a nanoGPT-style character-level GPT (~105k parameters) on a
few KB of built-in public-domain text, on CPU, and every ``save_every`` steps
writes ``ckpt_{step:06d}.pt`` in nanoGPT's checkpoint schema (``model``,
``optimizer``, ``model_args``, ``iter_num``, ``best_val_loss``, ``config``; see
karpathy/nanoGPT ``train.py``) plus ``scheduler``, ``rng`` and ``loss``, and a
``sha256sum``-format sidecar ``ckpt_{step:06d}.pt.sha256``.  The writer is a
well-behaved one: bytes go to a temporary name, are fsynced, then ``os.replace``
puts them in place, and only then is the sidecar written.

:func:`make_demo_run` stages the incident on top of such a run:

1. the newest save (step ``max_steps``) is done by a forked child that writes
   ``torch.save`` output *directly to the final name* (a naive writer) and is
   killed with SIGKILL once ``truncate_fraction`` of the expected bytes are on
   disk: a genuinely truncated zip without a central directory and without a
   sidecar;
2. one older checkpoint gets one byte flipped in the middle of a tensor data
   record (``archive/data/<n>``), so ``torch.load`` still succeeds but the
   sidecar hash and the zip CRC-32 both disagree.

Everything is deterministic for a fixed seed: two runs give byte-identical
files.  This package imports torch at import time; import it lazily from CLIs.

The package: :mod:`.text` (corpus), :mod:`.model` (GPT, ``build_model``), :mod:`.train`,
:mod:`.checkpoint` (``serialize``, ``save_checkpoint``), :mod:`.incident`, :mod:`.run`
(``make_demo_run``, ``main``) and :mod:`.hook` (``restore_hook`` for the drill).  The
strings ``"ckptaudit.demo:build_model"`` and ``"ckptaudit.demo:restore_hook"`` resolve here.
"""

from ..stages.hash import sha256_file  # noqa: F401 - re-exported (the demo's own copy is gone)
from .checkpoint import PathLike, canonical, save_checkpoint, serialize  # noqa: F401
from .hook import restore_hook  # noqa: F401
from .incident import StallingWriter, crash_save, flip_byte_in_tensor_record  # noqa: F401
from .model import DEFAULT_MODEL_ARGS, GPT, MLP, Block, CausalSelfAttention, LayerNorm, build_model  # noqa: F401
from .run import DemoRun, main, make_demo_run  # noqa: F401
from .text import TEXT, VOCAB  # noqa: F401
from .train import (DEFAULT_CONFIG, EXTRA_KEYS, UPSTREAM_KEYS, TrainResult, demo_data, estimate_loss,  # noqa: F401
                    get_batch, make_scheduler, train_loop, ckpt_name, get_rng_state, lr_multiplier, set_rng_state,
                    train)
