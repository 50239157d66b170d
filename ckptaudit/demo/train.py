"""The demo's trainer: data, LR schedule, RNG state and the training loop that saves ``ckpt_{step:06d}.pt``."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from .checkpoint import PathLike, save_checkpoint
from .model import DEFAULT_MODEL_ARGS, build_model
from .text import TEXT, VOCAB

#: The keys of the loop this demo follows (karpathy/nanoGPT train.py's checkpoint), in its order.
UPSTREAM_KEYS = ("model", "optimizer", "model_args", "iter_num", "best_val_loss", "config")


#: Keys this trainer adds to nanoGPT's schema.
EXTRA_KEYS = ("scheduler", "rng", "loss")

#: Default training config (plain types only; stored as ``config`` in every checkpoint).
#: Absolute paths are deliberately absent so that runs in different folders are byte-identical.
DEFAULT_CONFIG: Dict[str, Any] = dict(
    dataset="sonnets_char",
    batch_size=8,
    learning_rate=3e-3,
    min_lr=3e-4,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.99,
    grad_clip=1.0,
    eval_iters=4,
    val_fraction=0.1,
)


def demo_data() -> tuple:
    """(train, val): 1-D int64 token tensors of :data:`TEXT`, split 90/10 by position."""
    ids = torch.tensor([VOCAB.index(c) for c in TEXT], dtype=torch.long)
    n = int(len(ids) * (1 - DEFAULT_CONFIG["val_fraction"]))
    return ids[:n], ids[n:]


def get_batch(data, batch_size: int, block_size: int):
    """(x, y): two (batch_size, block_size) int64 tensors, y = x shifted by one.  Draws
    offsets from torch's global RNG (as nanoGPT does), so ``rng`` in a checkpoint matters."""
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


def lr_multiplier(it: int, *, warmup_iters: int, lr_decay_iters: int, learning_rate: float, min_lr: float) -> float:
    """LambdaLR factor at scheduler step ``it`` (= optimizer steps done): nanoGPT's
    ``get_lr`` (linear warm-up over ``warmup_iters`` steps, cosine decay to ``min_lr`` at
    ``lr_decay_iters``, flat after) divided by ``learning_rate``."""
    if it < warmup_iters:
        return (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr / learning_rate
    ratio = (it - warmup_iters) / max(1, lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return (min_lr + coeff * (learning_rate - min_lr)) / learning_rate


def make_scheduler(optimizer, config: Dict[str, Any]):
    """nanoGPT's schedule (linear warm-up, cosine decay to ``min_lr``) as a ``LambdaLR`` over ``optimizer``, from ``config``."""
    kw = dict(
        warmup_iters=config["warmup_iters"],
        lr_decay_iters=config["lr_decay_iters"],
        learning_rate=config["learning_rate"],
        min_lr=config["min_lr"],
    )

    def fn(it):  # a plain function: LambdaLR.state_dict stores None for it
        return lr_multiplier(it, **kw)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)


@torch.no_grad()
def estimate_loss(model, train_data, val_data, config, block_size) -> Dict[str, float]:
    """Mean loss over ``eval_iters`` random batches per split (draws from the global RNG)."""
    out = {}
    model.eval()
    for split, data in (("train", train_data), ("val", val_data)):
        losses = [
            model(*get_batch(data, config["batch_size"], block_size))[1].item()
            for _ in range(config["eval_iters"])
        ]
        out[split] = float(sum(losses) / len(losses))
    model.train()
    return out


def get_rng_state() -> Dict[str, Any]:
    """torch, numpy and python RNG states in ``weights_only``-loadable types:
    ``torch``: uint8 tensor (5056 bytes for the CPU Mersenne Twister); ``numpy``: dict with
    ``bit_generator`` str, ``state`` int64 tensor (624,), ``pos``, ``has_gauss`` ints and
    ``cached_gaussian`` float; ``python``: :func:`random.getstate` (a tuple of ints)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": str(name),
            "state": torch.from_numpy(np.asarray(keys, dtype=np.int64).copy()),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
    }


def set_rng_state(rng: Dict[str, Any]) -> None:
    """Inverse of :func:`get_rng_state`."""
    torch.set_rng_state(rng["torch"])
    n = rng["numpy"]
    np.random.set_state(
        (n["bit_generator"], n["state"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    py = rng["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))


@dataclass
class TrainResult:
    """What :func:`train` did.  ``saved``: checkpoint paths in save order; ``losses``:
    train loss (mean cross-entropy, nats) at each save step; ``iter_num``: optimizer steps
    counted at the end (after a ``restore="weights"`` restart, counted from 0)."""

    run_dir: Path
    saved: List[Path]
    losses: Dict[int, float]
    iter_num: int
    model: Any = field(repr=False, default=None)


def ckpt_name(step: int) -> str:
    """``ckpt_{step:06d}.pt``."""
    return f"ckpt_{step:06d}.pt"


def train(
    out_dir: PathLike,
    *,
    max_steps: int,
    save_every: int,
    seed: int = 1337,
    start_from: Optional[PathLike] = None,
    restore: str = "full",
    model_args: Optional[Dict[str, Any]] = None,
    config: Optional[Dict[str, Any]] = None,
    on_step: Optional[Callable[[int, torch.nn.Module, Any], None]] = None,
    mutate: Optional[Callable[[int, Dict[str, Any]], Optional[Dict[str, Any]]]] = None,
    save: Optional[Callable[[Dict[str, Any], Path], None]] = None,
    on_save: Optional[Callable[[int, Path, Dict[str, Any]], None]] = None,
    filename: Callable[[int], str] = ckpt_name,
    num_threads: int = 1,
) -> TrainResult:
    """Train the demo GPT up to step ``max_steps`` and save every ``save_every`` steps.

    A *step* is one optimizer update; the checkpoint saved after step ``s`` has
    ``iter_num == s`` and ``scheduler["last_epoch"] == s`` and is named ``filename(s)``.

    ``start_from``: a checkpoint (or a bare model state_dict) to start from.  ``restore="full"`` resumes faithfully
    (model, optimizer, scheduler, RNG, ``iter_num``, ``best_val_loss``; continuing gives the
    same bytes as never stopping); ``restore="weights"`` loads only ``model`` and starts
    step counting, optimizer, scheduler (warm-up again) from scratch: a restart that
    resets the step.  Hooks, for building broken runs in tests:

    * ``on_step(step, model, optimizer)`` after every optimizer step (e.g. write NaN into a
      parameter to inject a real divergence at step k);
    * ``mutate(step, ckpt) -> ckpt | None`` on the checkpoint dict before saving (drop
      ``optimizer``, return ``ckpt["model"]`` for weights only, poison a tensor, rewrite
      ``iter_num``); returning None skips that save;
    * ``save(ckpt, path)`` replaces the writer (default :func:`save_checkpoint`);
    * ``on_save(step, path, ckpt)`` after each save.

    Seeds torch, numpy and python ``random`` with ``seed`` (unless fully restoring) and
    sets torch's intra-op threads to ``num_threads`` for the call (restored after), so
    results are bit-reproducible on one machine.  Raises ValueError on bad arguments,
    KeyError if ``restore="full"`` and ``start_from`` lacks a key of the schema.
    """
    if max_steps < 1 or save_every < 1:
        raise ValueError(f"max_steps and save_every must be >= 1, got {max_steps} and {save_every}")
    if restore not in ("full", "weights"):
        raise ValueError(f"restore must be 'full' or 'weights', got {restore!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save = save or save_checkpoint
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        return train_loop(out_dir, max_steps, save_every, seed, start_from, restore, model_args, config,
                      on_step, mutate, save, on_save, filename)
    finally:
        torch.set_num_threads(prev_threads)


def _start_state(start_from, restore: str) -> Optional[dict]:
    """The checkpoint training starts from (a bare state_dict becomes ``{"model": it}``), None without one;
    ``KeyError`` when a full restore lacks a key nanoGPT's loop saves."""
    if start_from is None:
        return None
    src = torch.load(start_from, weights_only=True)
    if "model" not in src:  # a bare state_dict (weights-only file)
        src = {"model": src}
    if restore == "full":
        missing = sorted(set(UPSTREAM_KEYS + EXTRA_KEYS) - set(src))
        if missing:
            raise KeyError(f"{start_from}: a full restore needs {missing!r}, which the checkpoint lacks")
    return src


def _run_config(src: Optional[dict], restore: str, model_args: Optional[dict], config: Optional[dict],
                **run) -> tuple:
    """``(model_args, config)`` of the run: the model's from the caller, else the start checkpoint's, else the
    defaults; the config restored with a full restore, else a fresh schedule (warm up over 1/12 of the run,
    decay over all of it), with ``run``'s keys and then the caller's ``config`` over it."""
    if src is not None and model_args is None:
        model_args = src.get("model_args")
    cfg = dict(DEFAULT_CONFIG)
    if src is not None and restore == "full":
        cfg.update(src["config"])
    else:
        cfg.update(warmup_iters=max(1, run["max_iters"] // 12), lr_decay_iters=run["max_iters"])
    cfg.update(run)
    cfg.update(config or {})
    return dict(model_args or DEFAULT_MODEL_ARGS), cfg


def _checkpoint(model, optimizer, scheduler, model_args: dict, cfg: dict, iter_num: int, best_val_loss: float,
                loss) -> dict:
    """The checkpoint dict the loop saves: nanoGPT's keys, the scheduler, the RNG states and the step's loss."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": dict(model_args),
        "iter_num": iter_num,
        "best_val_loss": best_val_loss,
        "config": dict(cfg),
        "scheduler": scheduler.state_dict(),
        "rng": get_rng_state(),
        "loss": float(loss.item()),
    }


def train_loop(out_dir, max_steps, save_every, seed, start_from, restore, model_args, config,
           on_step, mutate, save, on_save, filename) -> TrainResult:
    """The body of :func:`train` (its arguments, already checked): returns what was trained and saved."""
    src = _start_state(start_from, restore)
    model_args, cfg = _run_config(src, restore, model_args, config, max_iters=max_steps, save_every=save_every,
                                  seed=seed)

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model = build_model(model_args)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))
    scheduler = make_scheduler(optimizer, cfg)
    iter_num, best_val_loss = 0, float("inf")
    if src is not None:
        model.load_state_dict(src["model"])
        if restore == "full":
            optimizer.load_state_dict(src["optimizer"])
            scheduler.load_state_dict(src["scheduler"])
            set_rng_state(src["rng"])
            iter_num, best_val_loss = int(src["iter_num"]), float(src["best_val_loss"])
    del src

    train_data, val_data = demo_data()
    block_size = model_args["block_size"]
    saved: List[Path] = []
    losses: Dict[int, float] = {}
    model.train()
    while iter_num < max_steps:
        x, y = get_batch(train_data, cfg["batch_size"], block_size)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if on_step is not None:
            on_step(iter_num, model, optimizer)
        if iter_num % save_every:
            continue
        ev = estimate_loss(model, train_data, val_data, cfg, block_size)
        best_val_loss = min(best_val_loss, ev["val"])
        ckpt = _checkpoint(model, optimizer, scheduler, model_args, cfg, iter_num, best_val_loss, loss)
        losses[iter_num] = ckpt["loss"]
        if mutate is not None:
            ckpt = mutate(iter_num, ckpt)
            if ckpt is None:
                continue
        path = out_dir / filename(iter_num)
        save(ckpt, path)
        saved.append(path)
        if on_save is not None:
            on_save(iter_num, path, ckpt)
    return TrainResult(run_dir=out_dir, saved=saved, losses=losses, iter_num=iter_num, model=model)
