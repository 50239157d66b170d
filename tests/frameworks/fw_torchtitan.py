"""torchtitan fixtures: its own ``CheckpointManager`` saves and loads the run, on 2 gloo ranks (CPU).

What is torchtitan's own (torchtitan 0.3.0, read in its installed source):

* ``CheckpointManager`` (``components/checkpointer/dcp.py``) built from its ``Config`` with the defaults for
  what it saves (``folder="checkpoint"``, ``keep_latest_k=10``, ``async_mode="disabled"``,
  ``last_save_model_only=True``, ``export_dtype="float32"``; ``checkpointer/base.py`` :222-273, ``dcp.py``
  :114-128) and ``enable=True``, ``interval=10``; given the pieces as the Trainer gives them (``trainer.py``
  :590-603): ``model_parts``, ``optimizers``, ``lr_schedulers``, ``dataloader``,
  ``states={"train_state": trainer}``.  It saves ``step-N`` folders (``_create_checkpoint_id`` :686-690) with
  the model's entries at the root (``_flattened_model_states_sd`` :692-713), and at the last step the model
  alone (``_save_last_step`` :745-792).
* ``OptimizersContainer`` from ``default_adamw(lr=8e-4)`` (``components/optimizer/optimizer.py`` :378-397; its
  ``state_dict`` is ``get_flat_optimizer_state_dict``'s ``state.<fqn>.<name>`` / ``param_groups.<fqn>.<key>``,
  ``utils.py`` :77-96), its default ``implementation="fused"`` (torch's fused AdamW runs on the CPU too).
* ``LRSchedulersContainer.Config(warmup_steps=2)`` built for the run's steps (``lr_scheduler.py`` :90-194: a
  ``LambdaLR`` of ``linear_warmup_stable_decay``; its ``state_dict`` is ``{"last_epoch": N}``, :226-231).
* ``ParallelAwareDataloader`` (``components/dataloader.py`` :55-167, torchdata's ``StatefulDataLoader``; its
  state is ``{"dp_rank_<r>": pickle.dumps(...), "world_size": 2}``) over a small token stream per rank.
* FSDP2 through torchtitan's own ``apply_fsdp_to_decoder`` (``distributed/fsdp.py`` :110-310, what
  ``parallelize_llama`` calls) on a 1-D CPU mesh named ``fsdp``.
* The train state is the Trainer's own ``state_dict`` (``trainer.py`` :1078-1083: ``step``, ``ntokens_seen``),
  and the loop is ``Trainer.train``'s (:1013-1050): ``load(step=config.checkpoint.load_step)``, then per step
  ``step += 1``, one train step, ``save(step, last_step=(step == training.steps))``.

Re-enacted, because torchtitan 0.3.0 cannot do it here (CPU-only torch 2.13, no triton):

* The model.  ``import torchtitan.models.llama3`` (the ``debugmodel`` flavour) and ``torchtitan.models.common``
  both fail: ``models/common/decoder.py`` imports ``moe`` → ``token_dispatcher`` →
  ``distributed/minimal_async_ep/kernels.py`` → ``import triton`` (ModuleNotFoundError).  A tiny decoder of
  plain torch modules with the attribute names ``apply_fsdp_to_decoder`` uses (``tok_embeddings``, ``layers``,
  ``norm``, ``lm_head``, ``enable_weight_tying``) stands in; what is saved is its ``state_dict`` through
  torchtitan's ``ModelWrapper``, as for any model.
* The mesh.  ``ParallelDims.build_mesh`` uses ``tools/utils.py``'s ``device_type``, ``"cuda"`` on a machine
  without one (:55), so the mesh is ``init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))``.
* Gradient reduction.  ``disable_fsdp_gradient_division`` (``fsdp.py`` :27-41) sets a divide factor of 1.0,
  which FSDP reduces with ``ReduceOp.PREMUL_SUM``, which gloo lacks; ``set_force_sum_reduction_for_comms(True)``
  makes it a plain sum, the same values (a factor of 1).  Nothing saved depends on it.
* The Trainer itself (it needs a tokenizer, a Hugging Face dataset and a CUDA device): its loop and state are
  written out here from ``trainer.py`` as cited above, one micro-batch per step.

The truth of each fixture is torchtitan's own resume: fresh ranks build the same pieces and call
``CheckpointManager.load()`` (``checkpoint.load_step = -1``: ``_find_load_step`` :640-684 picks the highest
``step-N`` holding a ``.metadata``), recording the step it picked, whether it raised, and what it restored
(``train_state.step``, the schedulers' ``last_epoch``, the AdamW step, the dataloader position) against what
was saved.  When it fails, ``load(step=N)`` (``--checkpoint.load_step N``) is probed from the next newest
step down until one restores the full state: that step is where torchtitan resumes the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REQUIRES = ["torchtitan", "torchdata"]

FRAMEWORK = "torchtitan"
PRODUCER = "torchtitan"
WORLD = 2
EVERY = 10
MODEL = {"vocab": 64, "dim": 16, "n_layers": 2}
SEQ = 16
BATCH = 4


# --------------------------------------------------------------------------- the job (in each rank)

def _pieces(run: str, steps: int, rank: int):
    """torchtitan's pieces as its Trainer builds them (see the module docstring): ``(model, optimizers,
    lr_schedulers, dataloader, train_state, checkpointer)``."""
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.dataloader import ParallelAwareDataloader
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw
    from torchtitan.distributed.fsdp import apply_fsdp_to_decoder

    class Block(nn.Module):
        def __init__(self, d: int):
            super().__init__()
            self.attention_norm, self.ffn_norm = nn.RMSNorm(d), nn.RMSNorm(d)
            self.wqkv, self.wo = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
            self.w1, self.w2 = nn.Linear(d, 2 * d, bias=False), nn.Linear(2 * d, d, bias=False)

        def forward(self, h):
            q, k, v = self.wqkv(self.attention_norm(h)).chunk(3, -1)
            a = nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=True)
            h = h + self.wo(a[:, 0])
            return h + self.w2(nn.functional.silu(self.w1(self.ffn_norm(h))))

    class Decoder(nn.Module):
        enable_weight_tying = False

        def __init__(self, vocab: int, dim: int, n_layers: int):
            super().__init__()
            self.tok_embeddings = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleDict({str(i): Block(dim) for i in range(n_layers)})
            self.norm, self.lm_head = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens)
            for block in self.layers.values():
                h = block(h)
            return self.lm_head(self.norm(h))

    class Tokens(torch.utils.data.IterableDataset):
        def __iter__(self):
            g = torch.Generator().manual_seed(1000 + rank)
            while True:
                t = torch.randint(0, MODEL["vocab"], (SEQ + 1,), generator=g)
                yield {"input": t[:-1]}, t[1:]

    class TrainState:  # the Trainer's own state_dict / load_state_dict (trainer.py :1078-1083)
        def __init__(self):
            self.step, self.ntokens_seen = 0, 0

        def state_dict(self):
            return {"step": self.step, "ntokens_seen": self.ntokens_seen}

        def load_state_dict(self, sd):
            self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]

    torch.manual_seed(0)
    model = Decoder(**MODEL)
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("fsdp",))
    apply_fsdp_to_decoder(model, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM (module docstring)
    model.train()
    optimizers = default_adamw(lr=8e-4).build(model_parts=[model])
    lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optimizers, training_steps=steps)
    dataloader = ParallelAwareDataloader(Tokens(), dp_rank=rank, dp_world_size=WORLD, batch_size=BATCH)
    train_state = TrainState()
    checkpointer = CheckpointManager.Config(enable=True, interval=EVERY).build(
        dataloader=dataloader, model_parts=[model], optimizers=optimizers, lr_schedulers=lr_schedulers,
        states={"train_state": train_state}, sd_adapter=None, base_folder=run)
    return model, optimizers, lr_schedulers, dataloader, train_state, checkpointer


def _opt_step(optimizers) -> float | None:
    """The AdamW ``step`` of the first parameter that has state (every parameter steps together)."""
    for opt in optimizers.optimizers:
        for st in opt.state.values():
            if "step" in st:
                return float(st["step"])
    return None


def _loader_position(dataloader) -> int:
    """Batches the rank's StatefulDataLoader reports yielded (``_num_yielded`` of its state; 0 for a fresh one;
    after ``load_state_dict`` and before the next ``iter`` torchdata 0.11 reports a count that is not the saved
    one, so a resume is judged by it being non-zero)."""
    import pickle

    sd = dataloader.state_dict()
    return int(pickle.loads(sd[f"dp_rank_{dataloader.dp_rank}"]).get("_num_yielded", -1))


def _install_kill(kill: dict, rank: int) -> None:
    """SIGKILL this rank halfway through its write into ``kill["step_dir"]/kill["file"]``: DCP's
    ``FileSystem.create_stream`` yields :class:`tests.frameworks._dist.KillingWriter` over the real file for that
    one stream, cutting it at half the size of the same file of ``kill["size_from"]`` (the save before: the same
    shapes, so the same size)."""
    import contextlib

    from torch.distributed.checkpoint import filesystem

    from . import _dist

    if rank != kill["rank"]:
        return
    orig = filesystem.FileSystem.create_stream

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        p = Path(path)
        with orig(self, path, mode) as stream:
            if "w" in mode and p.name == kill["file"] and p.parent.name == kill["step_dir"]:
                after = (p.parent.parent / kill["size_from"] / p.name).stat().st_size // 2
                yield _dist.KillingWriter(stream, after, Path(kill["note"]),
                                          {"file": str(p), "how": "DCP FileSystem.create_stream stream cut after "
                                                                  f"{after} bytes, then SIGKILL"})
            else:
                yield stream

    filesystem.FileSystem.create_stream = create_stream


def _train(run: str, making: str, steps: int, stop_after: int | None = None, kill: dict | None = None) -> None:
    """``Trainer.train``'s loop (trainer.py :1013-1050) for ``steps`` steps; with ``stop_after``, rank 0 SIGKILLs
    itself once that step's save returned on every rank (a preemption between steps)."""
    import warnings

    import torch
    import torch.distributed as dist
    from torch import nn

    from . import _dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if kill:
        _install_kill(kill, rank)
    model, optimizers, lr_schedulers, dataloader, ts, checkpointer = _pieces(run, steps, rank)
    checkpointer.load(step=-1)
    batches = iter(dataloader)
    while ts.step < steps:
        ts.step += 1
        optimizers.zero_grad()
        inputs, labels = next(batches)
        loss = nn.functional.cross_entropy(model(inputs["input"]).flatten(0, 1), labels.flatten())
        loss.backward()
        optimizers.step()
        lr_schedulers.step()
        ts.ntokens_seen += labels.numel()
        saved = checkpointer.save(ts.step, last_step=(ts.step == steps))
        if saved and rank == 0:
            with open(making, "a") as f:
                f.write(json.dumps({"step": ts.step, "loss": float(loss), "last_epoch": lr_schedulers.schedulers[0].last_epoch,
                                    "lr": lr_schedulers.schedulers[0].get_last_lr(), "ntokens_seen": ts.ntokens_seen,
                                    "optimizer_step": _opt_step(optimizers), "loader_batches": _loader_position(dataloader),
                                    "model_only": ts.step == steps}) + "\n")
        if stop_after is not None and ts.step == stop_after:
            dist.barrier()
            if rank == 0:
                _dist._die(None, {})
    checkpointer.close()
    dist.barrier()
    dist.destroy_process_group()


def _probe(run: str, steps: int, out: str, load_step: int = -1) -> None:
    """torchtitan's resume of the run: fresh pieces, ``CheckpointManager.load(step=load_step)``; rank 0 writes
    the step it took, whether it raised, and what was restored."""
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    _model, optimizers, lr_schedulers, dataloader, ts, checkpointer = _pieces(run, steps, rank)
    picked = checkpointer._find_load_step() if load_step == -1 else load_step
    res = {"load_step": load_step, "picked": picked, "ok": False, "error": None}
    try:
        res["loaded"] = bool(checkpointer.load(step=load_step))
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException; the outcome is the truth
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        msg = [line for line in str(e).strip().splitlines() if "Error:" in line] or str(e).strip().splitlines()
        res["error"] = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
    res.update(train_state_step=ts.step, ntokens_seen=ts.ntokens_seen,
               last_epoch=lr_schedulers.schedulers[0].last_epoch, optimizer_step=_opt_step(optimizers),
               loader_batches=_loader_position(dataloader))
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    checkpointer.close()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- parent side

def _launch(fn: str, kwargs: dict, logs: Path, expect_killed: int | None = None) -> dict:
    from . import _dist

    codes = _dist.launch("tests.frameworks.fw_torchtitan", fn, WORLD, kwargs, logs)
    _dist.check_codes(codes, logs, expect_killed=expect_killed)
    return codes


def _resume(dest: Path, run: Path, steps: int, saves: list) -> dict:
    """torchtitan's own resume of ``run``: ``load()`` first; if it raises, ``load(step=N)`` from the next newest
    saved step down.  Returns the probes and the step where the full state came back."""
    probes = []
    for i, n in enumerate([-1] + sorted((s["step"] for s in saves), reverse=True)):
        if i and (n >= probes[0]["picked"] or probes[-1]["ok"]):
            continue
        out = dest / f"probe{len(probes)}.json"
        _launch("_probe", {"run": str(run), "steps": steps, "out": str(out), "load_step": n},
                dest / f"logs-probe{len(probes)}")
        p = json.loads(out.read_text())
        p["error"] = p["error"] and p["error"].replace(f"{run}/", "")  # run-relative, as the truth's other paths
        probes.append(p)
    by_step = {s["step"]: s for s in saves}
    resumed = None
    for p in probes:
        s = by_step.get(p["picked"])
        p["restored_full_state"] = bool(p["ok"] and s and not s["model_only"] and p["train_state_step"] == s["step"]
                                        and p["last_epoch"] == s["last_epoch"]
                                        and p["optimizer_step"] == s["optimizer_step"]
                                        and p["loader_batches"] > 0)
        if p["restored_full_state"] and resumed is None:
            resumed = p["picked"]
    return {"probes": probes, "resumed_step": resumed}


def _run(dest: Path, steps: int, stop_after: int | None = None, kill: dict | None = None) -> tuple:
    run = dest / "run"
    run.mkdir(parents=True, exist_ok=True)
    making = dest / "making.jsonl"
    killed = 0 if stop_after is not None else (kill["rank"] if kill else None)
    codes = _launch("_train", {"run": str(run), "making": str(making), "steps": steps, "stop_after": stop_after,
                               "kill": kill}, dest / "logs", expect_killed=killed)
    saves = [json.loads(line) for line in making.read_text().splitlines()] if making.exists() else []
    return run, saves, codes


def _files(run: Path) -> list:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def _truth(name: str, description: str, resume: dict, damaged: dict, details: dict) -> dict:
    step = resume["resumed_step"]
    if step is None:
        raise RuntimeError(f"{name}: torchtitan resumed the full state from no step: {resume['probes']}")
    return {"fixture": name, "framework": FRAMEWORK, "producer": PRODUCER, "description": description,
            "audit_config": {"target": {"world_size": WORLD}},
            "expect": {"recommendation": "resume", "rollback": f"checkpoint/step-{step}",
                       "clean": not any(d["usable_for"] == "none" for d in damaged.values()), "damaged": damaged},
            "details": {"saved_world_size": WORLD, "torchtitan_resume": resume, **details}}


def make_clean(dest: Path) -> dict:
    steps = 30
    run, saves, _ = _run(dest, steps)
    resume = _resume(dest, run, steps, saves)
    first = resume["probes"][0]
    return _truth(
        "torchtitan_clean",
        f"Clean torchtitan run of {steps} steps on 2 gloo ranks, CheckpointManager with its default settings "
        f"(interval 10): step-10 and step-20 hold the full training state, step-30 is the last step's save, "
        f"model only (last_save_model_only=True). torchtitan's load() takes step-{first['picked']} and "
        f"{'raises ' + first['error'] if not first['ok'] else 'loads'}; --checkpoint.load_step 20 restores the "
        f"full state.",
        resume, {"checkpoint/step-30": {"layer": "state", "usable_for": "warm-start"}},
        {"files": _files(run), "saves": saves})


def make_preempted(dest: Path) -> dict:
    steps = 40
    run, saves, codes = _run(dest, steps, stop_after=30)
    resume = _resume(dest, run, steps, saves)
    return _truth(
        "torchtitan_preempted",
        f"torchtitan run configured for {steps} steps, preempted after step 30's save returned on both ranks "
        f"(rank 0 SIGKILLed between steps): step-10/20/30 hold the full state; torchtitan's load() resumes "
        f"step-{resume['probes'][0]['picked']}.",
        resume, {}, {"files": _files(run), "saves": saves, "exit_codes": codes})


def make_missing_rank_file(dest: Path) -> dict:
    steps = 40
    run, saves, codes = _run(dest, steps, stop_after=30)
    victim = run / "checkpoint" / "step-30" / "__1_0.distcp"
    size = victim.stat().st_size
    victim.unlink()
    resume = _resume(dest, run, steps, saves)
    first = resume["probes"][0]
    return _truth(
        "torchtitan_missing_rank_file",
        f"torchtitan run preempted after step 30, then rank 1's data file of the newest save "
        f"(checkpoint/step-30/__1_0.distcp, {size} bytes) deleted; .metadata still lists it. torchtitan's load() "
        f"takes step-{first['picked']} and {'raises ' + str(first['error']) if not first['ok'] else 'loads'}.",
        resume, {"checkpoint/step-30": {"layer": "file", "usable_for": "none"}},
        {"files": _files(run), "saves": saves, "exit_codes": codes, "deleted": str(victim.relative_to(run))})


def make_sigkill_mid_save(dest: Path) -> dict:
    steps = 40
    note = dest / "kill.json"
    kill = {"rank": 1, "step_dir": "step-30", "file": "__1_0.distcp", "size_from": "step-20", "note": str(note)}
    run, saves, codes = _run(dest, steps, kill=kill)
    k = json.loads(note.read_text())
    resume = _resume(dest, run, steps, saves)
    return _truth(
        "torchtitan_sigkill_mid_save",
        f"torchtitan run; in the step-30 save rank 1 was SIGKILLed inside its write of __1_0.distcp "
        f"({k['bytes_written']} bytes on disk), so step-30 has no .metadata; torchtitan's load() skips it "
        f"(_find_load_step) and resumes step-{resume['probes'][0]['picked']}.",
        resume, {"checkpoint/step-30": {"layer": "file", "usable_for": "none"}},
        {"files": _files(run), "saves": saves, "exit_codes": codes,
         "kill": {**k, "file": os.path.relpath(k["file"], run)}})


FIXTURES = {
    "torchtitan_clean": make_clean,
    "torchtitan_preempted": make_preempted,
    "torchtitan_missing_rank_file": make_missing_rank_file,
    "torchtitan_sigkill_mid_save": make_sigkill_mid_save,
}
