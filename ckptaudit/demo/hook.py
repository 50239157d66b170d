"""The demo trainer's restore hook for the drill: resume a checkpoint as ``train(restore="full")`` does."""

from __future__ import annotations

import random

import numpy as np
import torch

from ..drill.contract import SimpleRestored
from .checkpoint import PathLike
from .model import build_model
from .train import DEFAULT_CONFIG, demo_data, get_batch, make_scheduler, get_rng_state, lr_multiplier, set_rng_state


class NotADemoCheckpoint(KeyError):
    """The unit is not a checkpoint of the bundled demo trainer: the drill's configuration (``drill.hook``) is
    wrong, not the unit.  ``hook_mismatch`` tells the drill child to report it as such (exit 3)."""

    hook_mismatch = True

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _check_is_torch_file(path: PathLike) -> None:
    """Raise :class:`NotADemoCheckpoint` unless ``path`` is a file that starts like ``torch.save`` output (a zip
    or a pickle): a folder unit (a Trainer ``checkpoint-N/``, a DCP or DeepSpeed folder) or another format is
    another trainer's, while a torch file that then fails to load is a damaged demo checkpoint."""
    import os

    if os.path.isdir(path):
        raise NotADemoCheckpoint(f"{path}: a folder, not the single torch.save file the demo trainer writes")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return  # torch.load reports it
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise NotADemoCheckpoint(f"{path}: not a torch.save file (starts with {head!r}): not a demo checkpoint")


def _demo_checkpoint(path: PathLike) -> dict:
    """The demo checkpoint at ``path``, read with ``torch.load(weights_only=True)`` onto the CPU; raises
    :class:`NotADemoCheckpoint` when it is no torch.save file, no dict, or lacks what the trainer resumes."""
    _check_is_torch_file(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict):
        raise NotADemoCheckpoint(f"{path}: expected a checkpoint dict, found {type(ckpt).__name__}")
    missing = sorted({"model", "optimizer", "model_args", "config"} - set(ckpt))
    if missing:
        raise NotADemoCheckpoint(f"{path}: the demo trainer cannot resume without {missing!r}")
    return ckpt


def _restore_rng(rng, seed: int) -> None:
    """The saved RNG states, or every generator seeded from ``seed`` when the checkpoint has none."""
    if rng is not None:
        set_rng_state(rng)
        return
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def restore_hook(path: PathLike, device: str = "cpu"):
    """Restore hook of the demo trainer for ``ckptaudit drill`` (``drill.hook:
    "ckptaudit.demo:restore_hook"``): resume the checkpoint at ``path`` on ``device`` the way
    :func:`train` does with ``restore="full"`` and return a :class:`ckptaudit.drill.Restored`.

    Reads the file with ``torch.load(path, map_location="cpu", weights_only=True)`` (CPU first:
    ``torch.set_rng_state`` takes a CPU ByteTensor; ``load_state_dict`` then copies onto ``device``).
    Like a typical resume script it tolerates a missing ``scheduler`` (the schedule restarts from
    step 0) and a missing ``rng`` (seeds from ``config["seed"]``); the drill reports what each costs.

    ``saved["loss"]`` is the checkpoint's ``loss`` (train loss of the save step's batch, nats),
    compared with the mean loss over fixed train windows (``block_size`` tokens at every 16th offset:
    no RNG); without ``loss``, ``best_val_loss`` over fixed validation windows (every 8th offset).
    ``batches`` draws with :func:`get_batch` from torch's global RNG as training does;
    ``train_step`` is the loop body of :func:`train_loop`; ``lr_at(s)`` is ``learning_rate *
    lr_multiplier(s, ...)`` per param group.  Bit-exact on CPU with one intra-op thread (the drill
    child sets it), so ``deterministic`` is True there.
    Raises :class:`NotADemoCheckpoint` (a KeyError) if ``path`` is a folder or no torch.save file, or the
    checkpoint is not a dict with ``model``,
    ``optimizer``, ``model_args`` and ``config``, or its ``model_args`` lack a key of the demo model.
    """
    dev = torch.device(device)
    ckpt = _demo_checkpoint(path)
    cfg = dict(DEFAULT_CONFIG)
    cfg.update(ckpt["config"])
    model_args = dict(ckpt["model_args"])
    try:
        model = build_model(model_args).to(dev)
    except KeyError as e:  # "model_args lacks [...]": another trainer's checkpoint
        raise NotADemoCheckpoint(f"{path}: {e.args[0] if e.args else e}") from e
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    scheduler = make_scheduler(optimizer, cfg)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if ckpt.get("scheduler") is not None:
        scheduler.load_state_dict(ckpt["scheduler"])
    _restore_rng(ckpt.get("rng"), int(cfg.get("seed", 1337)))
    step = int(ckpt["iter_num"]) if "iter_num" in ckpt else int(scheduler.last_epoch)
    model.train()

    train_data, val_data = demo_data()
    block, bs = model_args["block_size"], cfg["batch_size"]
    if ckpt.get("loss") is not None:
        data, stride, loss, source = train_data, 16, float(ckpt["loss"]), "loss (train loss of the save step)"
    else:
        data, stride, loss, source = val_data, 8, ckpt.get("best_val_loss"), "best_val_loss"
    ix = range(0, len(data) - block - 1, stride)
    loss_batch = (torch.stack([data[i : i + block] for i in ix]).to(dev),
                  torch.stack([data[i + 1 : i + 1 + block] for i in ix]).to(dev))  # (n_windows, block) each

    def batches():
        while True:
            x, y = get_batch(train_data, bs, block)
            yield x.to(dev), y.to(dev)

    def train_step(batch):
        x, y = batch
        _, l = model(x, y)
        l.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(l.item()), float(gn.item())

    @torch.no_grad()
    def eval_loss(batch):
        model.eval()
        try:
            return float(model(*batch)[1].item())
        finally:
            model.train()

    sched_kw = dict(warmup_iters=cfg["warmup_iters"], lr_decay_iters=cfg["lr_decay_iters"],
                    learning_rate=cfg["learning_rate"], min_lr=cfg["min_lr"])

    def lr_at(s):
        return [cfg["learning_rate"] * lr_multiplier(s, **sched_kw) for _ in optimizer.param_groups]

    saved = dict(ckpt)
    saved.update(rng=ckpt.get("rng"), scheduler=ckpt.get("scheduler"), loss=loss, loss_source=source)
    return SimpleRestored(model=model, optimizer=optimizer, scheduler=scheduler, scaler=None, step=step,
                          saved=saved, loss_batch=loss_batch, batches=batches(), train_step=train_step,
                          eval_loss=eval_loss, deterministic=dev.type == "cpu", lr_at=lr_at,
                          rng_state=get_rng_state)
