"""Megatron-Core ``torch_dist`` fixtures: runs saved by megatron-core's own ``dist_checkpointing.save`` on 2 gloo ranks.

The job (2 ranks, CPU, gloo; tensor and pipeline parallel size 1, so data parallel size 2): a tiny ``GPTModel``
(``MODEL_ARGS``) built with megatron's local layer spec (``get_gpt_layer_local_spec``), Megatron's fp32 optimizer
(``FP32Optimizer`` over torch ``AdamW``, what ``get_megatron_optimizer`` builds without fp16/bf16 or the distributed
optimizer) and its ``OptimizerParamScheduler``; 30 iterations, a save every 10.  The gradients are all-reduced over
the data-parallel group by hand (what Megatron's DDP wrapper does).

megatron-core 0.16.1 ships no ``megatron.training``, so ``save_checkpoint`` / ``load_checkpoint`` of
``megatron/training/checkpointing.py`` (NVIDIA/Megatron-LM ``core_v0.16.1``) are re-enacted here with the
library's own calls, in the same order:

* ``save_checkpoint`` (checkpointing.py:471-803): the RNG state as ``ShardedObject("rng_state", …)`` (``get_rng_state``,
  :336-388), ``generate_state_dict`` (:877-952: ``args``, ``checkpoint_version`` 3.0, ``iteration``, ``model`` =
  ``model.sharded_state_dict(metadata=…)``, ``optimizer`` = ``optimizer.sharded_state_dict(state_dict, metadata=…)``,
  ``opt_param_scheduler``, ``rng_state``), ``num_floating_point_operations_so_far``; rank 0 creates
  ``iter_{N:07d}`` (``get_checkpoint_name`` :162-201), the default ``torch_dist`` strategy wrapped in
  ``FullyParallelSaveStrategyWrapper`` over the data-parallel group (the default: ``--no-ckpt-fully-parallel-save``
  turns it off), ``dist_checkpointing.save(state_dict, checkpoint_name, save_strategy, validate_access_integrity=True,
  content_metadata=…)`` (:636-640), a barrier, then rank 0 writes ``latest_checkpointed_iteration.txt`` with the
  iteration (``iter_finalize_fn`` :714-724).  ``dist_checkpointing.save`` (0.16.1 serialization.py:314-439) writes
  ``common.pt`` (rank 0, ``torch.save``), every rank's ``__R_N.distcp`` and rank 0's ``.metadata`` (through
  ``.metadata.tmp`` and a rename), then ``metadata.json``.
* ``load_checkpoint`` (:1479-1928): the tracker read by ``read_metadata`` (:291-333; ``--ckpt-step`` overrides it,
  :1189-1191), ``_get_checkpoint_format`` (:1134-1157: ``metadata.json`` makes ``torch_dist``; no ``.metadata`` and no
  ``mp_rank_0*`` raises), ``load_common_state_dict`` on rank 0 (``common.pt``, ``torch.load`` with torch's default
  ``weights_only=True`` and megatron's ``safe_globals.py`` allowlist), then ``dist_checkpointing.load(sharded_state_dict,
  checkpoint_name, load_strategy, strict=…)`` (:1130) with the model, optimizer (``is_loading=True``) and RNG entries.
  No tracker: Megatron starts from random (:1209-1222).

Since NVIDIA/Megatron-LM commit 40b1fd37 (2026-07-08, "deprecate common strategy") no ``common.pt`` is written:
``save`` puts the common state into the DCP files as ``ShardedObject("common_state", state_dict, (1,), (0,))``
(``common_state/shard_0_1``) and ``load_common_state_dict`` reads it back with ``dcp.load(…, no_dist=True)`` and
``torch.load(weights_only=True)`` (serialization.py:198-229 at HEAD, d98e8a64); the fixture without ``common.pt``
re-enacts those two functions with 0.16.1's own parts (``save_preprocess``, the strategy's ``save``, ``save_config``).

Integrity manifests (``integrity.json``, Megatron-Core >= 0.17.1; facts: ``shared/formats/megatron-integrity.md``)
are written here by :func:`write_integrity` exactly as that release writes them, and verified by
:func:`verify_integrity` as its ``load(verify_integrity=True)`` does (a verifier written from the facts).

CPU: megatron-core's checkpointing and model code address the GPU in a few places (``FP32Optimizer.__init__``
``torch.tensor(…, device='cuda')``, ``state_dict_saver.py:252`` ``torch.cuda.current_device()``, the CUDA RNG tracker of
``tensor_parallel/random.py``); :func:`_cpu_shim` routes them to the CPU.  The bytes written are those the same save
writes from CPU tensors.  Gradient clipping is off (``--clip-grad 0``: its CUDA-only multi-tensor path asserts CUDA).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

REQUIRES = ["megatron.core"]

FRAMEWORK = "megatron-core"
PRODUCER = "Megatron-Core torch_dist"
MODEL_ARGS = {"num_layers": 2, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 64, "seq_len": 8}
WORLD = 2
MICRO = 2
ITERS = 30
EVERY = 10
TRACKER = "latest_checkpointed_iteration.txt"
#: what ``_build_sharded_state_dict_metadata`` (checkpointing.py:401-434) gives without the distributed optimizer
CONTENT_METADATA = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
INTEGRITY = "integrity.json"


# --------------------------------------------------------------------------- integrity.json (>= 0.17.1 format)

def write_integrity(folder: Path) -> dict:
    """Write ``folder/integrity.json`` as Megatron-Core >= 0.17.1 ``save_integrity_manifest`` does: ``{"algorithm":
    "sha256", "files": {bare name: lowercase hex sha256}}`` over every regular top-level file but itself,
    ``indent=2``, keys sorted, a plain write.  Returns the manifest."""
    files = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and not p.is_symlink() and p.name != INTEGRITY:
            files[p.name] = hashlib.sha256(p.read_bytes()).hexdigest()
    manifest = {"algorithm": "sha256", "files": files}
    (folder / INTEGRITY).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def verify_integrity(folder: Path) -> str | None:
    """What Megatron-Core >= 0.17.1 ``load(…, verify_integrity=True)`` decides for ``folder``: None when it loads,
    else the reason it raises ``CheckpointingException`` (no manifest, an unreadable one, another algorithm, a listed
    file missing or with another SHA-256).  Files not listed are ignored."""
    path = folder / INTEGRITY
    if not path.exists():
        return f"{INTEGRITY} missing"
    try:
        manifest = json.loads(path.read_text())
        listed = manifest["files"]
    except (ValueError, KeyError, TypeError) as e:
        return f"{INTEGRITY} unreadable: {type(e).__name__}: {e}"
    if manifest.get("algorithm", "sha256") != "sha256":
        return f"unsupported algorithm {manifest.get('algorithm')!r}"
    for name, want in sorted(listed.items()):
        p = folder / name
        if not p.is_file():
            return f"{name} listed but missing"
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        if h.hexdigest() != want:
            return f"hash mismatch for {name}"
    return None


# --------------------------------------------------------------------------- in the ranks

def _cpu_shim() -> None:
    """Route megatron-core's few GPU addresses to the CPU (see the module docstring); the RNG tracker keeps CPU
    generator states.  Called first in every rank."""
    import torch
    from torch.overrides import TorchFunctionMode

    class _CudaOnCpu(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            if func is torch.Tensor.cuda:
                return args[0]
            return func(*args, **kwargs)

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    _CudaOnCpu().__enter__()


def _setup():
    """Process group, model-parallel state, model, optimizer and scheduler of the job (every rank)."""
    _init()
    return _build()


def _init() -> None:
    """Once per rank process: the CPU shim, the gloo process group and the model-parallel state."""
    import warnings

    warnings.filterwarnings("ignore")
    _cpu_shim()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    import megatron.core.tensor_parallel.random as mrandom
    from megatron.core import parallel_state as ps

    mrandom._set_cuda_rng_state = lambda *a, **k: None
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    ps.initialize_model_parallel(1, 1)


def _build():
    """The job's model, optimizer and scheduler, from the seeds of a fresh start (every rank)."""
    import torch
    import megatron.core.tensor_parallel.random as mrandom
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups
    from megatron.core.optimizer.optimizer import FP32Optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    mrandom.model_parallel_cuda_manual_seed(0)
    cfg = TransformerConfig(num_layers=MODEL_ARGS["num_layers"], hidden_size=MODEL_ARGS["hidden_size"],
                            num_attention_heads=MODEL_ARGS["num_attention_heads"], use_cpu_initialization=True,
                            hidden_dropout=0.0, attention_dropout=0.0)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(),
                     vocab_size=MODEL_ARGS["vocab_size"], max_sequence_length=MODEL_ARGS["seq_len"])
    ocfg = OptimizerConfig(optimizer="adam", lr=3e-3, min_lr=3e-4, weight_decay=0.01, clip_grad=0.0)
    groups = _get_param_groups([model], ocfg, None)  # Megatron's groups (wd_mult, lr_mult, …), as its optimizer's
    opt = FP32Optimizer(torch.optim.AdamW(groups, lr=3e-3, weight_decay=0.01), ocfg, lambda o, c: None)
    sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=3e-3, min_lr=3e-4, lr_warmup_steps=5,
                                    lr_decay_steps=ITERS, lr_decay_style="cosine", start_wd=0.01, end_wd=0.01,
                                    wd_incr_steps=ITERS, wd_incr_style="constant")
    return model, opt, sched


def _args(iteration: int):
    """The training ``args`` Namespace ``generate_state_dict`` saves (the fields its own resume reads back)."""
    import argparse

    return argparse.Namespace(ckpt_format="torch_dist", tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                              world_size=WORLD, data_parallel_size=WORLD, save_interval=EVERY, train_iters=ITERS,
                              no_save_optim=None, no_save_rng=None, iteration=iteration, **MODEL_ARGS)


def _rng_state():
    """``get_rng_state("torch_dist", …)`` (checkpointing.py:336-388): this rank's generators as a ShardedObject over the
    (pp, tp) grid, one replica per data-parallel rank (no CUDA generator on CPU)."""
    import random

    import numpy as np
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    state = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(),
             "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}
    return ShardedObject("rng_state", [state], (1, 1), (0, 0),
                         replica_id=ps.get_data_parallel_rank(with_context_parallel=True))


def _state_dict(model, opt, sched, iteration: int | None, loading: bool = False, rng: bool = True) -> dict:
    """``generate_state_dict`` (checkpointing.py:877-952) for ``torch_dist``; ``loading``: the optimizer's
    ``is_loading=True`` form; ``opt`` None: no optimizer or scheduler (``--no-load-optim``)."""
    from megatron.core import parallel_state as ps

    meta = dict(CONTENT_METADATA, dp_cp_group=ps.get_data_parallel_group(with_context_parallel=True))
    sd = {"args": _args(iteration or 0), "checkpoint_version": 3.0}
    if iteration is not None:
        sd["iteration"] = iteration
    sd["model"] = model.sharded_state_dict(metadata=meta)
    if opt is not None:
        sd["optimizer"] = opt.sharded_state_dict(sd, is_loading=loading, metadata=meta)
        sd["opt_param_scheduler"] = sched.state_dict()
    if rng:
        sd["rng_state"] = _rng_state()
    return sd


def _save_strategy():
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    return FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy("torch_dist"),
                                            ps.get_data_parallel_group(with_context_parallel=True), False)


def _save_common_inside(state_dict: dict, checkpoint_name: str) -> None:
    """``dist_checkpointing.save`` after commit 40b1fd37 (serialization.py:341-470 at d98e8a64), with 0.16.1's parts:
    the common state as ``ShardedObject("common_state", …)`` among the sharded items, no ``common.pt``."""
    import torch
    from megatron.core.dist_checkpointing.core import CheckpointingConfig, save_config
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.serialization import _CONTENT_METADATA_KEY
    from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess

    strategy = _save_strategy()
    state_dict[_CONTENT_METADATA_KEY] = dict(CONTENT_METADATA)
    sharded, common = save_preprocess(state_dict, True, None)
    sharded["common_state"] = ShardedObject(key="common_state", data=common, global_shape=(1,), global_offset=(0,),
                                            replica_id=torch.distributed.get_rank())
    strategy.save(sharded, checkpoint_name)
    if torch.distributed.get_rank() == 0:
        save_config(CheckpointingConfig(strategy.backend, strategy.version), checkpoint_name)
    torch.distributed.barrier()


def _save_checkpoint(run: Path, iteration: int, model, opt, sched, common_pt: bool = True,
                     kill: dict | None = None) -> None:
    """``save_checkpoint`` for ``torch_dist`` (checkpointing.py:471-803), see the module docstring.  ``kill``:
    ``{"at": "tracker", "iteration": N, "note": path}`` SIGKILLs rank 0 right before it writes the tracker of
    iteration N (the save complete on every rank)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from . import _dist

    rank = dist.get_rank()
    sd = _state_dict(model, opt, sched, iteration)
    sd["num_floating_point_operations_so_far"] = 0
    name = run / f"iter_{iteration:07d}"
    if rank == 0:
        name.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    if common_pt:
        dist_checkpointing.save(sd, str(name), _save_strategy(), validate_access_integrity=True,
                                content_metadata=dict(CONTENT_METADATA))
    else:
        _save_common_inside(sd, str(name))
    dist.barrier()
    if rank == 0:
        if kill and kill.get("at") == "tracker" and kill["iteration"] == iteration:
            _dist._die(Path(kill["note"]), {"how": "SIGKILL of rank 0 after the barrier, before the tracker write",
                                            "iteration": iteration})
        with open(run / TRACKER, "w") as f:  # iter_finalize_fn: a plain open-and-write
            f.write(str(iteration))
    dist.barrier()


def _install_kill_metadata(kill: dict) -> None:
    """SIGKILL rank 0 halfway through its first write of ``.metadata.tmp`` in ``iter_{N}`` (torch's
    ``FileSystemWriter.finish``, which Megatron's ``FileSystemWriterAsync`` inherits)."""
    import contextlib

    from torch.distributed.checkpoint import filesystem

    from . import _dist

    orig = filesystem.FileSystem.create_stream
    step_dir = f"iter_{kill['iteration']:07d}"

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        p = Path(path)
        with orig(self, path, mode) as stream:
            if p.name == ".metadata.tmp" and p.parent.name == step_dir and "w" in mode:
                yield _HalfFirstWrite(stream, Path(kill["note"]), str(p))
            else:
                yield stream

    class _HalfFirstWrite:
        def __init__(self, raw, note, name):
            self._raw, self._note, self._name = raw, note, name

        def write(self, b):
            b = bytes(b)
            half = len(b) // 2
            self._raw.write(b[:half])
            self._raw.flush()
            os.fsync(self._raw.fileno())
            _dist._die(self._note, {"file": self._name, "first_write_bytes": len(b), "bytes_written": half,
                                    "how": "FileSystem.create_stream stream, first write cut in half, SIGKILL"})

        def __getattr__(self, k):
            return getattr(self._raw, k)

    filesystem.FileSystem.create_stream = create_stream


def _batch(rank: int, iteration: int):
    import torch

    g = torch.Generator().manual_seed(1000 * iteration + rank)
    ids = torch.randint(0, MODEL_ARGS["vocab_size"], (MICRO, MODEL_ARGS["seq_len"]), generator=g)
    pos = torch.arange(MODEL_ARGS["seq_len"]).unsqueeze(0).expand(MICRO, -1)
    n = MODEL_ARGS["seq_len"]
    mask = torch.ones(n, n, dtype=torch.bool).triu(1).view(1, 1, n, n)
    return ids, pos, mask


def _weights_digest(model) -> str:
    import torch

    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        if isinstance(v, torch.Tensor):
            h.update(k.encode() + v.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def _train(run: str, making: str, common_pt: bool = True, kill: dict | None = None) -> None:
    """The job: ``ITERS`` iterations, ``_save_checkpoint`` every ``EVERY``; rank 0 logs each save to ``making``."""
    import torch
    import torch.distributed as dist

    model, opt, sched = _setup()
    rank = dist.get_rank()
    if kill and kill.get("at") == "metadata" and rank == 0:
        _install_kill_metadata(kill)
    for iteration in range(1, ITERS + 1):
        ids, pos, mask = _batch(rank, iteration)
        loss = model(ids, pos, mask, labels=ids).mean()
        loss.backward()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= WORLD
        opt.step()
        opt.zero_grad()
        sched.step(increment=1)
        if iteration % EVERY == 0:
            lt = loss.detach().clone()
            dist.all_reduce(lt)
            if rank == 0:
                with open(making, "a") as f:
                    f.write(json.dumps({"iteration": iteration, "loss": float(lt) / WORLD,
                                        "lr": opt.param_groups[0]["lr"],
                                        "weights_sha256": _weights_digest(model)}) + "\n")
            _save_checkpoint(Path(run), iteration, model, opt, sched, common_pt=common_pt, kill=kill)
    dist.barrier()
    dist.destroy_process_group()


def _load_common_inside(self, checkpoint_dir):
    """``load_common_state_dict`` after commit 40b1fd37 (serialization.py:198-229 at d98e8a64): ``common.pt`` when
    present, else the ``common_state`` ShardedObject read with ``dcp.load(…, no_dist=True)``."""
    import io

    import torch
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.dist_checkpointing.strategies.common import COMMON_STATE_FNAME

    if os.path.exists(os.path.join(checkpoint_dir, COMMON_STATE_FNAME)):
        return torch.load(os.path.join(checkpoint_dir, COMMON_STATE_FNAME), map_location="cpu")
    key = ShardedObject("common_state", None, (1,), (0,)).unique_key
    sd = {key: io.BytesIO()}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(str(checkpoint_dir)), no_dist=True)
    loaded = sd[key]
    if isinstance(loaded, io.BytesIO):
        loaded.seek(0)
        loaded = torch.load(loaded, weights_only=True)
    return loaded[0]


def _read_tracker(run: Path):
    """``read_metadata`` (checkpointing.py:291-333): ``(iteration, release)``, or raises as Megatron exits."""
    text = (run / TRACKER).read_text().strip()
    try:
        return int(text), False
    except ValueError:
        if text != "release":
            raise SystemExit(f"ERROR: Invalid metadata file {run / TRACKER}. Exiting")
        return 0, True


def _probe_one(run: str, iteration: int | None = None, optim: bool = True, new_common: bool = False,
               integrity: bool = False) -> dict:
    """``load_checkpoint`` for ``torch_dist`` (checkpointing.py:1479-1928) on every rank, into a model, optimizer and
    scheduler built as a fresh start builds them; returns (the same on every rank): the iteration the tracker names
    (or ``iteration``: ``--ckpt-step``), ``ok`` (on every rank), the iteration loaded, the digest of the weights
    loaded, the error.  ``optim`` False: ``--no-load-optim --no-load-rng``; ``new_common``: the common-state reader
    of Megatron after 40b1fd37; ``integrity``: ``--verify-integrity`` (>= 0.17.1: the manifest checked first)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies import common as mcommon

    from . import _dist

    _dist._seed(0)  # the seeds of a fresh rank process (tests/frameworks/_dist.py), then the job's own
    model, opt, sched = _build()
    load_common = mcommon.TorchCommonLoadStrategy.load_common
    if new_common:
        mcommon.TorchCommonLoadStrategy.load_common = _load_common_inside
    run_p = Path(run)
    res = {"optim": optim, "ckpt_step": iteration}
    try:
        if iteration is None:
            if not (run_p / TRACKER).exists():
                raise FileNotFoundError("no tracker: Megatron starts from random")
            iteration, release = _read_tracker(run_p)
        name = run_p / f"iter_{iteration:07d}"
        res["iteration_named"] = iteration
        # _get_checkpoint_format: torch_dist needs metadata.json; else mp_rank_0* or .metadata, else it raises
        if not (name / "metadata.json").exists():
            os.listdir(name)  # FileNotFoundError for a missing folder, as Megatron's own listdir
            raise NotImplementedError(f"unknown checkpoint format in {name}")
        if integrity and (why := verify_integrity(name)) is not None:
            raise RuntimeError(f"CheckpointingException: integrity verification failed: {why}")
        sd = _state_dict(model, opt if optim else None, sched, 1, loading=True, rng=optim)
        loaded = dist_checkpointing.load(sd, str(name), get_default_load_sharded_strategy(str(name)),
                                         strict="assume_ok_unexpected")
        model.load_state_dict(loaded["model"], strict=False)
        if optim:
            opt.load_state_dict(loaded["optimizer"])
            sched.load_state_dict(loaded["opt_param_scheduler"])
        res.update(ok=True, iteration=loaded.get("iteration"), weights_sha256=_weights_digest(model),
                   keys=sorted(loaded))
    except BaseException as e:  # noqa: BLE001 - the point is to record it (SystemExit too)
        res.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
    finally:
        mcommon.TorchCommonLoadStrategy.load_common = load_common
    oks = [None] * dist.get_world_size()
    dist.all_gather_object(oks, res.get("ok"))
    res["ok"] = all(oks)
    dist.barrier()
    return res


def _probe_load(run: str, out: str, asks: list) -> None:
    """Megatron's resumes of ``run`` on every rank, one launch for all of them (the rank processes start, import and
    join the process group once): for each ask (keywords of :func:`_probe_one`, plus ``fallback``), the resume it
    asks for and, with ``fallback`` where that fails, the same resume of the weights alone (``--no-load-optim
    --no-load-rng``).  Rank 0 writes ``out`` (JSON): one ``{"full": …[, "weights_only": …]}`` per ask, in order."""
    import torch.distributed as dist

    _init()
    results = []
    for ask in asks:
        ask = dict(ask)
        fallback = ask.pop("fallback", False)
        r = {"full": _probe_one(run, **ask)}
        if fallback and not r["full"]["ok"]:
            r["weights_only"] = _probe_one(run, **dict(ask, optim=False))
        results.append(r)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- parent side

def _run(dest: Path, common_pt: bool = True, kill: dict | None = None) -> tuple:
    from . import _dist

    run = dest / "run"
    run.mkdir(parents=True, exist_ok=True)
    making = dest / "making.jsonl"
    logs = dest / "logs"
    codes = _dist.launch("tests.frameworks.fw_megatron_core", "_train", WORLD,
                         {"run": str(run), "making": str(making), "common_pt": common_pt, "kill": kill}, logs,
                         timeout=600)
    _dist.check_codes(codes, logs, expect_killed=0 if kill else None)
    saves = [json.loads(line) for line in making.read_text().splitlines()] if making.exists() else []
    return run, saves, codes


def _resumes(dest: Path, run: Path, saves: list, *asks: dict) -> list:
    """Megatron's resumes of ``run``, all in one launch on ``WORLD`` ranks (:func:`_probe_load`), one result per ask
    (``iteration``: ``--ckpt-step``, else the tracker's; the other keywords of :func:`_probe_one`): ``{"full": …}``
    and, where the full state does not resume, ``"weights_only"``; ``exact``: the loaded weights are the ones
    training saved at that iteration.  An ask with ``"fallback": False`` is one probe, as the ranks wrote it."""
    from . import _dist

    out = dest / "probes.json"
    logs = dest / "logs_probes"
    asks = [dict({"fallback": True}, **a) for a in asks]
    codes = _dist.launch("tests.frameworks.fw_megatron_core", "_probe_load", WORLD,
                         {"run": str(run), "out": str(out), "asks": asks}, logs, timeout=600)
    if not out.exists():
        raise RuntimeError(f"the probes wrote nothing: exit codes {codes}\n{_dist.log_tail(logs)}")
    results = json.loads(out.read_text().replace(str(run) + os.sep, "run/"))
    want = {s["iteration"]: s["weights_sha256"] for s in saves}
    for ask, res in zip(asks, results):
        for r in res.values() if ask["fallback"] else ():
            if r["ok"]:
                r["exact"] = r.get("weights_sha256") == want.get(r.get("iteration"))
    return [res if ask["fallback"] else res["full"] for ask, res in zip(asks, results)]


def _files(run: Path) -> list:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def _it(n: int) -> str:
    return f"iter_{n:07d}"


def _truth(name: str, description: str, recommendation: str, rollback, damaged: dict, details: dict) -> dict:
    return {"fixture": name, "framework": FRAMEWORK, "producer": PRODUCER, "description": description,
            "audit_config": {"target": {"world_size": WORLD}},
            "expect": {"recommendation": recommendation, "rollback": rollback, "clean": not damaged,
                       "damaged": damaged},
            "details": {"saved_world_size": WORLD, **details}}


def _need(cond: bool, what: str, probes) -> None:
    if not cond:
        raise RuntimeError(f"Megatron did not behave as this fixture says ({what}): {json.dumps(probes)[:2000]}")


def _rollback_check(r: dict, iteration: int) -> dict:
    """``r`` (a result of :func:`_resumes` asked with ``iteration``): Megatron resumes ``iteration`` exactly, full state
    (``--ckpt-step``): the rollback point is real."""
    _need(r["full"]["ok"] and r["full"]["exact"] and r["full"]["iteration"] == iteration,
          f"a full resume of {_it(iteration)}", r)
    return r


#: the runs that several fixtures start from (keywords of :func:`_run`): trained once per fixture folder's parent
SHARED_RUNS = {"clean": {}, "killed_in_metadata_30": {"kill": {"at": "metadata", "iteration": 30}}}


def _shared_run(dest: Path, variant: str = "clean") -> tuple:
    """``(run, saves, exit codes, kill note or None)`` of the run ``SHARED_RUNS[variant]``, trained once per fixture
    folder's parent (:mod:`._shared_run`) and copied to ``dest/run`` (the damage is added to the copy); the note's
    ``file`` names the file in the copy, and is written to ``dest/kill.json`` as the killed run wrote it."""
    from . import _shared_run as S

    def make(folder: Path) -> dict:
        kw = json.loads(json.dumps(SHARED_RUNS[variant]))
        if "kill" in kw:
            kw["kill"]["note"] = str(folder / "kill.json")
        _, _, codes = _run(folder, **kw)
        return {"exit_codes": codes}

    folder, facts = S.made_once(dest, f"megatron_core_{variant}", make)
    run = S.copy_run(folder, dest)
    saves = [json.loads(line) for line in (folder / "making.jsonl").read_text().splitlines()]
    codes = {int(r): c for r, c in facts["exit_codes"].items()}
    kill = None
    if (folder / "kill.json").exists():
        kill = json.loads((folder / "kill.json").read_text())
        if "file" in kill:
            kill["file"] = str(run / os.path.relpath(kill["file"], folder / "run"))
        (dest / "kill.json").write_text(json.dumps(kill))
    return run, saves, codes, kill


def _item_data(folder: Path, rank_file: str):
    """``(offset, length, fqn)`` of the ``data/`` record of the first tensor item stored in ``rank_file`` (read with
    torch's own reader: the fixture's own files)."""
    import io
    import warnings
    import zipfile

    from torch.distributed.checkpoint import FileSystemReader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meta = FileSystemReader(str(folder)).read_metadata()
    for idx, info in sorted(meta.storage_data.items(), key=lambda kv: kv[1].offset):
        if info.relative_path != rank_file or not idx.fqn.startswith("decoder.") or "/" in idx.fqn:
            continue
        blob = (folder / rank_file).read_bytes()[info.offset:info.offset + info.length]
        with zipfile.ZipFile(io.BytesIO(blob)) as z:
            rec = next(r for r in z.infolist() if "/data/" in r.filename and r.file_size >= 8)
            n, x = (int.from_bytes(blob[rec.header_offset + o:rec.header_offset + o + 2], "little") for o in (26, 28))
            return info.offset + rec.header_offset + 30 + n + x, rec.file_size, idx.fqn
    raise RuntimeError(f"no tensor item in {rank_file}")


def _flip(folder: Path, rank_file: str) -> dict:
    at, n, fqn = _item_data(folder, rank_file)
    with open(folder / rank_file, "r+b") as f:
        f.seek(at + n // 2)
        b = f.read(1)
        f.seek(at + n // 2)
        f.write(bytes([b[0] ^ 0x10]))
    return {"file": rank_file, "offset": at + n // 2, "tensor": fqn}


def _seal(run: Path) -> None:
    """``integrity.json`` in every iteration folder, as ``--verify-integrity`` (Megatron-Core >= 0.17.1) writes it."""
    for d in sorted(run.glob("iter_*")):
        write_integrity(d)


def make_clean(dest: Path) -> dict:
    run, saves, _, _ = _shared_run(dest)
    probes, = _resumes(dest, run, saves, {})
    _need(probes["full"]["ok"] and probes["full"]["exact"] and probes["full"]["iteration"] == 30, "clean resume", probes)
    return _truth("megatron_core_clean",
                  "Clean 30-iteration Megatron-Core run (tiny GPTModel, FP32Optimizer/AdamW, OptimizerParamScheduler) "
                  "on 2 gloo ranks, saved with dist_checkpointing.save (torch_dist, fully parallel) into iter_N every "
                  "10 iterations, tracker written by rank 0 after each save. Megatron's load_checkpoint resumes "
                  "iteration 30 with the saved weights, optimizer and scheduler.",
                  "resume", _it(30), {}, {"files": _files(run), "saves": saves, "probes": probes})


def _broken_30(dest: Path, run: Path, saves: list, name: str, description: str, details: dict,
               integrity: bool = False, expect_tracker_fails: bool = True, damaged: dict | None = None,
               also: tuple = ()) -> dict:
    """Truth of a run whose iteration 30 Megatron cannot resume: what the tracker's resume does, and a full resume
    of iteration 20 (``--ckpt-step 20``, the rollback point).  ``also``: more asks of :func:`_resumes` in the same
    launch; ``description`` is then a function of their results."""
    kw = {"integrity": True} if integrity else {}
    probes, rollback, *more = _resumes(dest, run, saves, kw, dict(kw, iteration=20), *also)
    if expect_tracker_fails:
        _need(not (probes["full"]["ok"] and probes["full"].get("exact")), "iteration 30 cannot be resumed", probes)
    probes["rollback"] = _rollback_check(rollback, 20)
    if also:
        description = description(*more)
    damaged = {_it(30): {"layer": "file", "usable_for": "none"}} if damaged is None else damaged
    return _truth(name, description, "resume", _it(20), damaged,
                  {"files": _files(run), "saves": saves, "probes": probes, **details})


def make_rank_truncated(dest: Path) -> dict:
    run, saves, _, _ = _shared_run(dest)
    victim = run / _it(30) / "__1_0.distcp"
    size = victim.stat().st_size
    with open(victim, "r+b") as f:
        f.truncate(size // 2)
    return _broken_30(dest, run, saves, "megatron_core_rank_distcp_truncated",
                      f"Clean Megatron-Core run, then rank 1's data file of the newest iteration "
                      f"({_it(30)}/__1_0.distcp) cut to {size // 2} of {size} bytes; the tracker names 30, so "
                      f"load_checkpoint fails there; --ckpt-step 20 resumes iteration 20.",
                      {"truncated": {"file": f"{_it(30)}/__1_0.distcp", "size": size, "kept": size // 2}})


def make_sigkill_before_metadata(dest: Path) -> dict:
    run, saves, codes, k = _shared_run(dest, "killed_in_metadata_30")
    probes, = _resumes(dest, run, saves, {})
    _need(probes["full"]["ok"] and probes["full"]["iteration"] == 20 and probes["full"]["exact"],
          "the tracker still names 20 and resumes it", probes)
    return _truth("megatron_core_sigkill_before_metadata",
                  f"Megatron-Core run; in the save of iteration 30 every rank wrote its data files, then rank 0 was "
                  f"SIGKILLed halfway through .metadata.tmp ({k['bytes_written']} of {k['first_write_bytes']} "
                  f"bytes): {_it(30)} has no .metadata and no metadata.json, the tracker still names 20 and "
                  f"load_checkpoint resumes iteration 20.",
                  "resume", _it(20), {_it(30): {"layer": "file", "usable_for": "none"}},
                  {"files": _files(run), "saves": saves, "exit_codes": codes, "probes": probes,
                   "kill": {**k, "file": os.path.relpath(k["file"], run)}})


def make_tracker_dangling(dest: Path) -> dict:
    run, saves, _, _ = _shared_run(dest)
    shutil.rmtree(run / _it(30))
    return _broken_30(dest, run, saves, "megatron_core_tracker_dangling",
                      f"Clean Megatron-Core run, then {_it(30)} removed (a retention script or a quota purge) while "
                      f"the tracker still names 30: load_checkpoint fails listing the missing folder; --ckpt-step 20 "
                      f"resumes iteration 20 (no unit is damaged: the tracker is the finding).", {"removed": _it(30)},
                      damaged={})


def make_tracker_incomplete(dest: Path) -> dict:
    run, saves, codes, k = _shared_run(dest, "killed_in_metadata_30")
    (run / TRACKER).write_text("30")
    return _broken_30(dest, run, saves, "megatron_core_tracker_incomplete",
                      f"Megatron-Core run SIGKILLed (rank 0) inside the .metadata write of iteration 30, then the "
                      f"tracker set to 30 (a launcher that writes the newest iter_* folder's number into it): "
                      f"load_checkpoint finds no metadata.json in {_it(30)} and raises 'unknown checkpoint format'.",
                      {"exit_codes": codes, "kill": k})


def make_tracker_lagging(dest: Path) -> dict:
    note = dest / "kill.json"
    run, saves, codes = _run(dest, kill={"at": "tracker", "iteration": 30, "note": str(note)})
    probes, newest = _resumes(dest, run, saves, {}, {"iteration": 30})
    _need(probes["full"]["ok"] and probes["full"]["iteration"] == 20, "the lagging tracker resumes 20", probes)
    probes["newest"] = _rollback_check(newest, 30)
    return _truth("megatron_core_tracker_lagging",
                  f"Megatron-Core run whose rank 0 was SIGKILLed after the save of iteration 30 had completed on "
                  f"every rank (past the barrier) and before it wrote the tracker (NeMo Automodel #3390: the "
                  f"pointer left at an older step while a newer one is complete): the tracker names 20, "
                  f"load_checkpoint resumes 20 and repeats 10 iterations; --ckpt-step 30 resumes 30 in full.",
                  "resume", _it(30), {}, {"files": _files(run), "saves": saves, "exit_codes": codes,
                                          "probes": probes, "kill": json.loads(note.read_text())})


def make_flipped_byte(dest: Path) -> dict:
    run, saves, _, _ = _shared_run(dest)
    flip = _flip(run / _it(30), "__1_0.distcp")
    return _broken_30(dest, run, saves, "megatron_core_flipped_byte",
                      f"Clean Megatron-Core run, then one bit flipped in the data of tensor {flip['tensor']} in "
                      f"{_it(30)}/__1_0.distcp (no integrity.json): the blob's record CRC-32 no longer matches.",
                      {"flipped": flip})


def make_flipped_byte_integrity(dest: Path) -> dict:
    run, saves, _, _ = _shared_run(dest)
    _seal(run)
    flip = _flip(run / _it(30), "__1_0.distcp")
    why = verify_integrity(run / _it(30))
    _need(why is not None and why.startswith("hash mismatch"), "verification refuses iteration 30", why)
    return _broken_30(dest, run, saves, "megatron_core_flipped_byte_integrity",
                      f"Megatron-Core run sealed as --verify-integrity (>= 0.17.1) seals it (integrity.json in "
                      f"every iteration), then one bit flipped in tensor {flip['tensor']} of {_it(30)}/__1_0.distcp: "
                      f"the verified load refuses iteration 30 ({why}).",
                      {"flipped": flip, "verification": why}, integrity=True)


def make_stale_shard_integrity(dest: Path) -> dict:
    run, saves, _, _ = _shared_run(dest)
    _seal(run)
    src, dst = run / _it(20) / "__1_0.distcp", run / _it(30) / "__1_0.distcp"
    if src.stat().st_size != dst.stat().st_size:
        raise RuntimeError(f"iteration 20's rank-1 file is not the size of iteration 30's: {src.stat().st_size}")
    shutil.copyfile(src, dst)
    why = verify_integrity(run / _it(30))
    _need(why == "hash mismatch for __1_0.distcp", "verification refuses iteration 30", why)
    details = {"copied": {"from": f"{_it(20)}/__1_0.distcp", "to": f"{_it(30)}/__1_0.distcp"}, "verification": why}

    def description(unverified: dict) -> str:  # the unverified load, probed in the same launch
        details["unverified_load"] = unverified
        return (f"Megatron-Core run sealed with integrity.json, then iteration 20's rank-1 data file copied over "
                f"iteration 30's (same size, valid CRC-32s): Megatron >= 0.17.1 refuses iteration 30 ({why}); an "
                f"unverified load {'loads it with iteration-20 values mixed in' if unverified['ok'] else 'fails'}.")

    return _broken_30(dest, run, saves, "megatron_core_stale_shard_integrity", description, details, integrity=True,
                      also=({"fallback": False},))


def make_torn_integrity(dest: Path) -> dict:
    run, saves, _, _ = _shared_run(dest)
    _seal(run)
    manifest = run / _it(30) / INTEGRITY
    text = manifest.read_bytes()
    manifest.write_bytes(text[: len(text) // 2])  # rank 0's plain write cut short (no temp file, no fsync)
    why = verify_integrity(run / _it(30))
    _need(why is not None and why.startswith(f"{INTEGRITY} unreadable"), "verification refuses iteration 30", why)
    return _broken_30(dest, run, saves, "megatron_core_torn_integrity",
                      f"Megatron-Core run sealed with integrity.json; iteration 30's manifest torn to "
                      f"{len(text) // 2} of {len(text)} bytes (written with a plain open-and-write): the verified "
                      f"load of iteration 30 raises ({why}).", {"verification": why}, integrity=True)


def make_no_common_pt(dest: Path) -> dict:
    run, saves, _ = _run(dest, common_pt=False)
    probes, = _resumes(dest, run, saves, {"new_common": True})
    _need(probes["full"]["ok"] and probes["full"]["exact"] and probes["full"]["iteration"] == 30, "resume", probes)
    if any((d / "common.pt").exists() for d in run.glob("iter_*")):
        raise RuntimeError("a common.pt was written")
    return _truth("megatron_core_no_common_pt",
                  "Clean Megatron-Core run saved as Megatron after commit 40b1fd37 (2026-07-08) saves: no common.pt, "
                  "the common state (args, iteration, optimizer param groups, scheduler) is the ShardedObject "
                  "common_state/shard_0_1 inside the DCP files; the new load_common_state_dict reads it and "
                  "load_checkpoint resumes iteration 30.",
                  "resume", _it(30), {}, {"files": _files(run), "saves": saves, "probes": probes})


FIXTURES = {
    "megatron_core_clean": make_clean,
    "megatron_core_rank_distcp_truncated": make_rank_truncated,
    "megatron_core_sigkill_before_metadata": make_sigkill_before_metadata,
    "megatron_core_tracker_dangling": make_tracker_dangling,
    "megatron_core_tracker_incomplete": make_tracker_incomplete,
    "megatron_core_tracker_lagging": make_tracker_lagging,
    "megatron_core_flipped_byte": make_flipped_byte,
    "megatron_core_flipped_byte_integrity": make_flipped_byte_integrity,
    "megatron_core_stale_shard_integrity": make_stale_shard_integrity,
    "megatron_core_torn_integrity": make_torn_integrity,
    "megatron_core_no_common_pt": make_no_common_pt,
}
