"""FSDP2 + torch.distributed.checkpoint fixtures, in torchtitan's layout, on 2 gloo ranks (CPU).

The job: a tiny MLP (``MODEL_ARGS``), each ``nn.Linear`` and the root wrapped with
``torch.distributed.fsdp.fully_shard`` on a 1-D CPU device mesh of 2 ranks,
``torch.optim.AdamW``, a ``LambdaLR`` linear warmup (a ``functools.partial``, as
torchtitan's ``linear_warmup_linear_decay``), a ``DistributedSampler`` loader; 30 steps,
``dcp.save(states, checkpoint_id=run/"checkpoint"/f"step-{step}")`` every 10 with
the default ``FileSystemWriter`` (one ``__R_0.distcp`` per rank, ``.metadata`` written
by rank 0 last, through ``.metadata.tmp`` and a rename).

``states`` mirrors what torchtitan's ``CheckpointManager`` saves (the version that
keeps the model under ``"model"``; its ``_find_load_step`` resumes from the highest
``step-N`` that has a ``.metadata``):

* ``"model"``: ``get_model_state_dict(model)`` (DTensor shards)
* ``"optimizer"``: ``get_optimizer_state_dict(model, opt, options=StateDictOptions(flatten_optimizer_state_dict=True))``
  (``state.<fqn>.exp_avg``, ``param_groups.<fqn>.lr``, …)
* ``"lr_scheduler"``: the ``LambdaLR``'s ``state_dict()`` (``last_epoch``, ``_step_count``, ``base_lrs``, …)
* ``"dataloader"``: ``{"dp_rank_R": pickle.dumps(loader state), "world_size": 2}`` (each rank its own key)
* ``"train_state"``: ``{"step": tensor(int32), "global_avg_losses"/"global_max_losses"/"log_steps": BytesIO of torch.save(list)}``

No RNG state is saved (torchtitan saves none either).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REQUIRES = ["torch"]

FRAMEWORK = "fsdp2-dcp"
PRODUCER = "torch.distributed.checkpoint"
MODEL_ARGS = {"d_in": 8, "hidden": 32, "d_out": 1}
WORLD = 2
MICRO = 8
STEPS = 30
EVERY = 10


def _warmup(step: int, warmup: int = 10, total: int = STEPS) -> float:
    if step < warmup:
        return (step + 1) / (warmup + 1)
    return max(0.0, 1.0 - (step - warmup) / (total - warmup + 1))


def _states(model, opt, sched, loader_state: dict, train_state: dict, rank: int):
    import functools  # noqa: F401  (kept local: no framework import at module level)
    import io
    import pickle

    import torch
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    from torch.distributed.checkpoint.stateful import Stateful

    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=True)

    class ModelWrapper(Stateful):  # torchtitan's loads: the inverse of each state_dict (the restart test's)
        def state_dict(self):
            return get_model_state_dict(model)

        def load_state_dict(self, sd):
            set_model_state_dict(model, sd)

    class OptimizersContainer(Stateful):
        def state_dict(self):
            return get_optimizer_state_dict(model, opt, options=options)

        def load_state_dict(self, sd):
            set_optimizer_state_dict(model, opt, sd, options=options)

    class LRSchedulersContainer(Stateful):
        def state_dict(self):
            return sched.state_dict()

        def load_state_dict(self, sd):
            sched.load_state_dict(sd)

    class ParallelAwareDataloader(Stateful):
        def state_dict(self):
            return {f"dp_rank_{rank}": pickle.dumps(dict(loader_state)), "world_size": WORLD}

        def load_state_dict(self, sd):
            loader_state.update(pickle.loads(sd[f"dp_rank_{rank}"]))  # the test's own run: trusted

    class TrainState(Stateful):
        def state_dict(self):
            out = {"step": torch.tensor(train_state["step"], dtype=torch.int32)}
            for k in ("global_avg_losses", "global_max_losses", "log_steps"):
                b = io.BytesIO()
                torch.save(list(train_state[k]), b)
                out[k] = b
            return out

        def load_state_dict(self, sd):
            train_state["step"] = int(sd["step"])
            for k in ("global_avg_losses", "global_max_losses", "log_steps"):
                sd[k].seek(0)
                train_state[k] = torch.load(sd[k], weights_only=True)

    return {"train_state": TrainState(), "model": ModelWrapper(), "optimizer": OptimizersContainer(),
            "dataloader": ParallelAwareDataloader(), "lr_scheduler": LRSchedulersContainer()}


def _install_kill(kill: dict, rank: int) -> None:
    """SIGKILL this rank halfway through the first write into the named file of the named step."""
    from torch.distributed.checkpoint import filesystem

    from . import _dist

    if rank != kill["rank"]:
        return
    orig = filesystem.FileSystem.create_stream

    import contextlib

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        p = Path(path)
        with orig(self, path, mode) as stream:
            if p.name == kill["file"] and p.parent.name == kill["step_dir"] and "w" in mode:
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


def _train(run: str, making: str, kill: dict | None = None, resume_log: str | None = None) -> None:
    """The job (optionally SIGKILLed in a save).  ``resume_log``: a restart, ``dcp.load(states,
    checkpoint_id=ckptaudit.integrations.dcp.last_good(run))`` (rank 0 picks, the ranks share its pick), the
    batches of the epoch already trained skipped; rank 0 writes where it started and the step-30 loss there."""
    import functools
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if kill:
        _install_kill(kill, rank)
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(MODEL_ARGS["d_in"], MODEL_ARGS["hidden"]), nn.Tanh(),
                          nn.Linear(MODEL_ARGS["hidden"], MODEL_ARGS["hidden"]), nn.Tanh(),
                          nn.Linear(MODEL_ARGS["hidden"], MODEL_ARGS["d_out"]))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=8e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, functools.partial(_warmup, warmup=10, total=STEPS))

    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, MODEL_ARGS["d_in"], generator=g)
    y = torch.sin(x @ torch.linspace(-1, 1, MODEL_ARGS["d_in"]).unsqueeze(1))
    ds = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(ds, batch_size=MICRO, sampler=sampler)
    loader_state = {"epoch": 0, "batches_yielded": 0, "sampler_seed": 0}
    train_state = {"step": 0, "global_avg_losses": [], "global_max_losses": [], "log_steps": []}
    states = _states(model, opt, sched, loader_state, train_state, rank)
    ckpt = Path(run) / "checkpoint"

    step, skip, started = 0, 0, None
    if resume_log:
        from ckptaudit.integrations.dcp import last_good

        picked = [last_good(run) if rank == 0 else None]
        dist.broadcast_object_list(picked, src=0)
        started = picked[0]
        dcp.load(states, checkpoint_id=started)
        step, skip = train_state["step"], loader_state["batches_yielded"]
        started_step = step
    while step < STEPS:
        sampler.set_epoch(loader_state["epoch"])
        for i, (xb, yb) in enumerate(loader):
            if i < skip:
                continue
            step += 1
            loss = nn.functional.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            loader_state["batches_yielded"] = i + 1
            train_state["step"] = step
            lt = loss.detach().clone()
            dist.all_reduce(lt)
            avg = float(lt) / WORLD
            train_state["global_avg_losses"].append(avg)
            train_state["global_max_losses"].append(avg)
            train_state["log_steps"].append(step)
            if step % EVERY == 0:
                dcp.save(states, checkpoint_id=str(ckpt / f"step-{step}"))
                if rank == 0:
                    with open(making, "a") as f:
                        f.write(json.dumps({"step": step, "loss": avg, "lr": sched.get_last_lr(),
                                            "scheduler_last_epoch": sched.last_epoch,
                                            "epoch": loader_state["epoch"]}) + "\n")
            if step >= STEPS:
                break
        else:
            loader_state["epoch"] += 1
            loader_state["batches_yielded"] = 0
        skip = 0
    if resume_log and rank == 0:
        Path(resume_log).write_text(json.dumps({"from": started, "started_step": started_step,
                                                "final_loss": train_state["global_avg_losses"][-1], "step": step}))
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- parent side

def _run(dest: Path, kill: dict | None = None, run: Path | None = None, resume_log: str | None = None) -> tuple:
    from . import _dist

    run = run or dest / "run"
    run.mkdir(parents=True, exist_ok=True)
    making = dest / "making.jsonl"
    logs = dest / "logs"
    codes = _dist.launch("tests.frameworks.fw_fsdp_dcp", "_train", WORLD,
                         {"run": str(run), "making": str(making), "kill": kill, "resume_log": resume_log}, logs)
    _dist.check_codes(codes, logs, expect_killed=kill["rank"] if kill else None)
    saves = [json.loads(l) for l in making.read_text().splitlines()] if making.exists() else []
    return run, saves, codes


def _files(run: Path) -> list:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def _truth(name: str, description: str, recommendation: str, rollback, damaged: dict, details: dict) -> dict:
    return {"fixture": name, "framework": FRAMEWORK, "producer": PRODUCER, "description": description,
            "audit_config": {"expected_model_args": dict(MODEL_ARGS), "target": {"world_size": WORLD}},
            "expect": {"recommendation": recommendation, "rollback": rollback, "clean": not damaged,
                       "damaged": damaged},
            "details": {"saved_world_size": WORLD, **details}}


def make_clean(dest: Path) -> dict:
    run, saves, _ = _run(dest)
    return _truth("fsdp2_dcp_clean",
                  "Clean 30-step FSDP2 (fully_shard, 2 gloo ranks) run, model + flattened optimizer + LambdaLR + "
                  "dataloader + train_state saved with torch.distributed.checkpoint.save into checkpoint/step-N "
                  "every 10 steps.",
                  "resume", "checkpoint/step-30", {}, {"files": _files(run), "saves": saves})


def make_missing_shard(dest: Path) -> dict:
    run, saves, _ = _run(dest)
    victim = run / "checkpoint" / "step-30" / "__1_0.distcp"
    size = victim.stat().st_size
    victim.unlink()
    return _truth("fsdp2_dcp_missing_rank1_shard",
                  f"Clean FSDP2 + DCP run, then rank 1's data file of the newest save "
                  f"(checkpoint/step-30/__1_0.distcp, {size} bytes: its half of every weight and optimizer "
                  f"moment, its dataloader entry) deleted; .metadata still lists it.",
                  "resume", "checkpoint/step-20", {"checkpoint/step-30": {"layer": "file", "usable_for": "none"}},
                  {"files": _files(run), "saves": saves, "deleted": str(victim.relative_to(run))})


def make_sigkill_before_metadata(dest: Path) -> dict:
    note = dest / "kill.json"
    run, saves, codes = _run(dest, kill={"rank": 0, "step_dir": "step-30", "file": ".metadata.tmp",
                                         "note": str(note)})
    k = json.loads(note.read_text())
    return _truth("fsdp2_dcp_sigkill_before_metadata",
                  f"FSDP2 + DCP; in the step-30 save both ranks finished their __R_0.distcp, then rank 0 was "
                  f"SIGKILLed halfway through writing .metadata.tmp in FileSystemWriter.finish "
                  f"({k['bytes_written']} of {k['first_write_bytes']} bytes), so step-30 has no .metadata "
                  f"(torchtitan's _find_load_step skips it and resumes from step-20).",
                  "resume", "checkpoint/step-20", {"checkpoint/step-30": {"layer": "file", "usable_for": "none"}},
                  {"files": _files(run), "saves": saves, "exit_codes": codes,
                   "kill": {**k, "file": os.path.relpath(k["file"], run)}})


FIXTURES = {
    "fsdp2_dcp_clean": make_clean,
    "fsdp2_dcp_missing_rank1_shard": make_missing_shard,
    "fsdp2_dcp_sigkill_before_metadata": make_sigkill_before_metadata,
}
