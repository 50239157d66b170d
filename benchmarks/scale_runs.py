"""Generated runs of many files for ``bench_scale.py``: a DCP-like run of many rank files, or many small file units.

Both make the newest unit damaged, so the right rollback point is the unit before it:

* :func:`dcp_run`: ``saves`` folders ``step-N`` written the way ``torch.distributed.checkpoint``'s
  ``FileSystemWriter`` lays them out (torch/distributed/checkpoint/filesystem.py, metadata.py): one
  ``__<rank>_0.distcp`` per rank holding its chunk of ``model.weight`` as a ``torch.save`` blob (rank 0 also
  the ``step`` bytes item), and ``.metadata``, a pickle of ``Metadata`` naming each item's file, offset and
  length.  The newest save has one rank file truncated (``dcp_shard_too_short``).
* :func:`file_names`: the same names, each file one small ``torch.save`` blob (the same bytes): what the
  inventory alone reads (names, sizes, first bytes), fast to write at 200,000 files.
* :func:`file_units`: ``units`` single-file checkpoints ``ckpt_NNNNNNN.pt`` of the tiny nanoGPT of
  :mod:`ckptaudit.demo` (model, AdamW state, scheduler, RNG, ``iter_num`` = the step in the name), each a real
  ``torch.save`` of its own; one weight differs per step.  The newest is cut to 55 % of its bytes.

Generation runs in this process (``import torch``); the audit runs in fresh processes.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Tuple


def _blob(obj) -> bytes:
    import torch

    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


def dcp_run(run: Path, saves: int, ranks: int, every: int = 100) -> Tuple[float, str, str]:
    """Write the run; return (seconds, the damaged newest unit, the expected rollback unit)."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties, TensorStorageMetadata)

    t0 = time.perf_counter()
    run.mkdir(parents=True)
    rows = 4
    chunks = [_blob(torch.full((rows, 4), float(r))) for r in range(ranks)]
    for s in range(1, saves + 1):
        step = s * every
        d = run / f"step-{step}"
        d.mkdir()
        sdm = {"model.weight": TensorStorageMetadata(
                   TensorProperties(dtype=torch.float32), torch.Size([ranks * rows, 4]),
                   [ChunkStorageMetadata(torch.Size([r * rows, 0]), torch.Size([rows, 4])) for r in range(ranks)]),
               "step": BytesStorageMetadata()}
        storage = {}
        step_blob = _blob(step)
        for r in range(ranks):
            data = chunks[r]
            storage[MetadataIndex("model.weight", torch.Size([r * rows, 0]), r)] = _StorageInfo(
                f"__{r}_0.distcp", 0, len(data))
            if r == 0:
                storage[MetadataIndex("step")] = _StorageInfo("__0_0.distcp", len(data), len(step_blob))
                data = data + step_blob
            (d / f"__{r}_0.distcp").write_bytes(data)
        (d / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata=sdm, storage_data=storage)))
    newest = run / f"step-{saves * every}" / f"__{ranks // 2}_0.distcp"
    os.truncate(newest, newest.stat().st_size // 2)
    return time.perf_counter() - t0, f"step-{saves * every}", f"step-{(saves - 1) * every}"


def file_units(run: Path, units: int) -> Tuple[float, str, str]:
    """Write the run; return (seconds, the damaged newest unit, the expected rollback unit)."""
    import torch

    from ckptaudit import demo

    t0 = time.perf_counter()
    run.mkdir(parents=True)
    args = dict(demo.DEFAULT_MODEL_ARGS, n_layer=1, n_head=2, n_embd=16, block_size=16)
    got = {}
    with tempfile.TemporaryDirectory() as scratch:  # nothing of the training goes into the run
        demo.train(Path(scratch), max_steps=1, save_every=1, seed=1, model_args=args,
                   config=dict(eval_iters=1, batch_size=2), save=lambda ckpt, path: got.update(ckpt=ckpt))
    ckpt = got["ckpt"]
    weight = next(v for v in ckpt["model"].values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    first = float(weight.view(-1)[0])
    for step in range(1, units + 1):
        ckpt["iter_num"] = step
        weight.view(-1)[0] = first + step * 1e-6
        (run / f"ckpt_{step:07d}.pt").write_bytes(demo.serialize(ckpt))
    newest = run / f"ckpt_{units:07d}.pt"
    os.truncate(newest, int(newest.stat().st_size * 0.55))
    return time.perf_counter() - t0, newest.name, f"ckpt_{units - 1:07d}.pt"


def file_names(run: Path, units: int) -> Tuple[float, str, str]:
    """``units`` files ``ckpt_NNNNNNN.pt``, each the same small torch.save blob, the newest cut to 55 %: for
    timing the inventory alone.  Returns (seconds, the damaged newest unit, the expected rollback unit)."""
    import torch

    t0 = time.perf_counter()
    run.mkdir(parents=True)
    data = _blob({"w": torch.zeros(4), "iter_num": 1})
    for step in range(1, units + 1):
        (run / f"ckpt_{step:07d}.pt").write_bytes(data)
    newest = run / f"ckpt_{units:07d}.pt"
    os.truncate(newest, int(len(data) * 0.55))
    return time.perf_counter() - t0, newest.name, f"ckpt_{units - 1:07d}.pt"
