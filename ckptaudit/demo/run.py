"""The demo run: train, then stage the incident (``make_demo_run``), and its command line."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from .checkpoint import PathLike, save_checkpoint
from .incident import crash_save, flip_byte_in_tensor_record
from .train import ckpt_name, train


@dataclass
class DemoRun:
    """A staged incident.  ``steps``: every save step, oldest first; ``truncated``,
    ``flipped``: file names (in ``run_dir``) of the killed newest save and of the bit-rotted
    one; ``flipped_offset``: absolute byte offset of the flipped byte in ``flipped``;
    ``intact``: names of the undamaged checkpoints; ``losses``: train loss (nats) at each
    save step, including the truncated one; ``truncated_bytes``: size of ``truncated``;
    ``flipped_member``: zip member holding the flipped byte."""

    run_dir: Path
    steps: List[int]
    truncated: str
    flipped: str
    flipped_offset: int
    intact: List[str]
    losses: Dict[int, float]
    truncated_bytes: int = 0
    flipped_member: str = ""


def make_demo_run(out_dir: PathLike, *, max_steps: int = 600, save_every: int = 100, seed: int = 1337,
                  incident: bool = True) -> DemoRun:
    """Train the demo run into ``out_dir`` and, if ``incident``, stage the crash.

    Saves at steps ``save_every, 2*save_every, ... <= max_steps``.  With ``incident``:
    the save at the last of those steps (``max_steps`` when it is a multiple of
    ``save_every``) is made by :func:`crash_save` (truncated at 55 % of its size, no
    sidecar), and the save at step ``save_every * (n_saves // 2)`` (300 with defaults) gets
    one byte flipped by :func:`flip_byte_in_tensor_record` (its sidecar keeps the original
    hash).  Without ``incident`` every save is intact and ``truncated``/``flipped`` are "".

    Takes ~5 s with defaults on one core (~3.5 s of it training; ~1.2 s is torch's one-time
    lazy import of ``torch._dynamo`` on the first ``torch.optim`` construction in a process).
    Raises FileExistsError if ``out_dir`` already holds ``ckpt_*`` files, ValueError if
    ``incident`` and fewer than 3 saves would be made.
    """
    out_dir = Path(out_dir)
    n_saves = max_steps // save_every
    if incident and n_saves < 3:
        raise ValueError(f"incident needs >= 3 saves, got {n_saves} (max_steps={max_steps}, save_every={save_every})")
    if out_dir.exists():
        stale = sorted(p.name for p in out_dir.glob("ckpt_*"))
        if stale:
            raise FileExistsError(f"{out_dir}: expected no ckpt_* files, found {stale}")
    last = n_saves * save_every
    flipped_step = save_every * (n_saves // 2)
    cut = {}

    def writer(ckpt, path):
        if incident and ckpt["iter_num"] == last:
            cut["bytes"] = crash_save(ckpt, path)
        else:
            save_checkpoint(ckpt, path)

    res = train(out_dir, max_steps=max_steps, save_every=save_every, seed=seed, save=writer)
    steps = sorted(res.losses)
    names = {s: ckpt_name(s) for s in steps}
    if not incident:
        return DemoRun(out_dir, steps, "", "", 0, [names[s] for s in steps], res.losses)
    offset, member = flip_byte_in_tensor_record(out_dir / names[flipped_step])
    intact = [names[s] for s in steps if s not in (last, flipped_step)]
    return DemoRun(out_dir, steps, names[last], names[flipped_step], offset, intact, res.losses,
                   truncated_bytes=cut["bytes"], flipped_member=member)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m ckptaudit.demo OUT_DIR [--max-steps N] [--save-every N] [--seed N]
    [--no-incident]``: build the demo run and print what was staged.  Returns 0."""
    p = argparse.ArgumentParser(prog="python -m ckptaudit.demo", description='A real, tiny training run with a real crash: the bundled demo and a test fixture.')
    p.add_argument("out_dir")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--no-incident", action="store_true")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    run = make_demo_run(a.out_dir, max_steps=a.max_steps, save_every=a.save_every, seed=a.seed,
                        incident=not a.no_incident)
    dt = time.perf_counter() - t0
    print(f"demo run in {run.run_dir} ({dt:.1f} s): saves at steps {run.steps}")
    for s in run.steps:
        print(f"  step {s:6d}  loss {run.losses[s]:.4f}  {ckpt_name(s)}")
    if run.truncated:
        print(f"truncated: {run.truncated} ({run.truncated_bytes} bytes, writer killed with SIGKILL, no sidecar)")
        print(f"flipped:   {run.flipped} (byte {run.flipped_offset} in {run.flipped_member}; sidecar keeps old hash)")
    return 0
