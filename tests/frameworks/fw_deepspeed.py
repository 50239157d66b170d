"""DeepSpeed fixtures: runs written by ``DeepSpeedEngine.save_checkpoint`` on 2 gloo ranks (CPU).

The job: a tiny MLP (``MODEL_ARGS``) wrapped by ``deepspeed.initialize`` with a plain
``torch.optim.AdamW`` (``"zero_force_ds_cpu_optimizer": false``, so no CPU-Adam op is
built), DeepSpeed's own ``WarmupLR`` scheduler from the config, fp32, micro batch 8 per
rank, ZeRO stage 1, 2 or 3; 30 steps, ``engine.save_checkpoint(run)`` every 10 with the
default tag (``global_stepN``) and ``save_latest=True``.  Default layout::

    run/latest                                         "global_step30"
    run/zero_to_fp32.py, run/zero_to_torch.py          recovery scripts (copied by rank 0)
    run/global_stepN/mp_rank_00_model_states.pt        stage 1/2: module weights, scheduler, counters
    run/global_stepN/zero_pp_rank_R_mp_rank_00_model_states.pt   stage 3: one per rank
    run/global_stepN/zero_pp_rank_R_mp_rank_00_optim_states.pt   each rank's optimizer partition

``DeepSpeedEngine.save_checkpoint`` has no barrier between a rank's own files and rank
0 writing ``latest``: rank 0 writes ``latest`` as soon as its own files are done.  The
staged kill uses that: rank 1 is SIGKILLed halfway through its optimizer partition of
the newest save, after rank 0 has written ``latest`` (rank 1 waits for it, as a slower
rank does).

Needs: ``DS_ACCELERATOR=cpu`` (set here for the ranks), the gloo backend
(``deepspeed.init_distributed(dist_backend="gloo")``).  On the CPU accelerator DeepSpeed's
``TorchBackend`` JIT-builds its ``deepspeed_shm_comm`` op at init (``build_shm_op``; ~50 s the first
time here), so the ranks get ``TORCH_EXTENSIONS_DIR=<repo>/.fixture-cache/torch_extensions`` and
every later fixture loads the built op.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REQUIRES = ["deepspeed"]

FRAMEWORK = "deepspeed"
MODEL_ARGS = {"d_in": 8, "hidden": 32, "d_out": 1}
WORLD = 2
MICRO = 8


def _config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_force_ds_cpu_optimizer": False,
        "scheduler": {"type": "WarmupLR",
                      "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2, "warmup_num_steps": 10}},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": False,
    }


def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(MODEL_ARGS["d_in"], MODEL_ARGS["hidden"]), nn.Tanh(),
                         nn.Linear(MODEL_ARGS["hidden"], MODEL_ARGS["hidden"]), nn.Tanh(),
                         nn.Linear(MODEL_ARGS["hidden"], MODEL_ARGS["d_out"]))


def _engine(stage: int):
    import logging

    import deepspeed
    import torch

    deepspeed.utils.logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo")
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=_config(stage))
    return engine


def _batch(rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(MICRO, MODEL_ARGS["d_in"], generator=g)
    w = torch.linspace(-1, 1, MODEL_ARGS["d_in"]).unsqueeze(1)
    return x, torch.sin(x @ w)


def _train(run: str, stage: int, making: str, kill: dict | None = None) -> None:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if kill and rank == kill["rank"]:
        from . import _dist

        latest = Path(run) / "latest"

        def match(path: str) -> bool:
            if not path.endswith(os.path.join(kill["tag"], kill["file"])):
                return False
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if latest.exists() and latest.read_text().strip() == kill["tag"]:
                    break
                time.sleep(0.02)
            return True

        _dist.kill_torch_save(match, fraction=0.5, note=Path(kill["note"]))

    engine = _engine(stage)
    for step in range(1, 31):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        if step % 10 == 0:
            engine.save_checkpoint(run)
            if rank == 0:
                with open(making, "a") as f:
                    f.write(json.dumps({"tag": f"global_step{engine.global_steps}", "global_steps": engine.global_steps,
                                        "loss": float(loss), "lr": engine.get_lr()}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


def _probe_load(run: str, stage: int, out: str, last_good: bool = False) -> None:
    """What ``engine.load_checkpoint(run)`` (the tag ``latest`` names) does for a job of this
    world size: first a full resume, then a warm start (``load_module_only=True``).
    Each rank writes ``out.rankR``: in ZeRO-1/2 each rank reads only its own partition.
    ``last_good``: the tag is ``ckptaudit.integrations.deepspeed.last_good_tag(run)`` (rank 0 picks, the
    ranks share its pick) instead of ``latest``."""
    import torch.distributed as dist

    engine = _engine(stage)
    tag = None
    if last_good:
        from ckptaudit.integrations.deepspeed import last_good_tag

        picked = [last_good_tag(run) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(picked, src=0)
        tag = picked[0]
    res = []
    for full in (True, False):
        r = {"world_size": dist.get_world_size(), "mode": "resume" if full else "load_module_only"}
        try:
            path, _ = engine.load_checkpoint(run, tag=tag, load_module_only=not full)
            r.update(ok=path is not None, loaded=str(path), global_steps=engine.global_steps)
        except Exception as e:  # noqa: BLE001 - the point is to record it
            r.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        res.append(r)
        dist.barrier()
    Path(f"{out}.rank{os.environ['RANK']}").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def _continue(run: str, stage: int, out: str, until: int = 30) -> None:
    """The restart of a ``_train`` job with the one line: the same engine, then
    ``engine.load_checkpoint(run, tag=last_good_tag(run))`` on every rank (each rank audits the folder itself,
    as a job's own restart code would), then the same per-step batches (``_batch(rank, step)``) from the step
    after the loaded one up to ``until``, ``save_checkpoint`` every 10 steps as ``_train`` does.  Rank 0 writes
    ``out`` (JSON): each rank's tag, the path loaded, ``engine.global_steps`` right after the load, rank 0's loss
    per step (the forward of that step, as ``_train`` records it), the lr at the end and the last step."""
    import torch
    import torch.distributed as dist

    from ckptaudit.integrations.deepspeed import last_good_tag

    rank = int(os.environ["RANK"])
    engine = _engine(stage)
    tag = last_good_tag(run)
    path, _ = engine.load_checkpoint(run, tag=tag)
    started = engine.global_steps
    tags = [None] * dist.get_world_size()
    dist.all_gather_object(tags, tag)
    losses = {}
    for step in range(started + 1, until + 1):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses[step] = float(loss)
        if step % 10 == 0:
            engine.save_checkpoint(run)
    if rank == 0:
        Path(out).write_text(json.dumps({"tags": tags, "loaded": None if path is None else str(path),
                                         "started_step": started, "global_steps": engine.global_steps,
                                         "losses": losses, "lr": engine.get_lr()}))
    dist.barrier()
    dist.destroy_process_group()


# --------------------------------------------------------------------------- parent side

def _env() -> dict:
    from . import _dist

    return {"DS_ACCELERATOR": "cpu",
            "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                   str(_dist.REPO / ".fixture-cache" / "torch_extensions"))}


def _run(dest: Path, stage: int, kill: dict | None = None) -> tuple:
    from . import _dist

    run = dest / "run"
    run.mkdir(parents=True, exist_ok=True)
    making = dest / "making.jsonl"
    logs = dest / "logs"
    codes = _dist.launch("tests.frameworks.fw_deepspeed", "_train", WORLD,
                         {"run": str(run), "stage": stage, "making": str(making), "kill": kill}, logs, env=_env())
    _dist.check_codes(codes, logs, expect_killed=kill["rank"] if kill else None)
    saves = [json.loads(l) for l in making.read_text().splitlines()] if making.exists() else []
    return run, saves, codes


def _probe(dest: Path, run: Path, stage: int, world: int, last_good: bool = False) -> list:
    from . import _dist

    out = dest / f"probe_ws{world}.json"
    logs = dest / f"logs_probe_ws{world}"
    codes = _dist.launch("tests.frameworks.fw_deepspeed", "_probe_load", world,
                         {"run": str(run), "stage": stage, "out": str(out), "last_good": last_good}, logs,
                         env=_env())
    _dist.check_codes(codes, logs)
    per_rank = [json.loads(Path(f"{out}.rank{r}").read_text().replace(str(run) + os.sep, "run/"))
                for r in range(world)]
    # one entry per attempt: ok on every rank, and the errors of the ranks that raised
    res = []
    for i, attempt in enumerate(per_rank[0]):
        rows = [pr[i] for pr in per_rank]
        res.append({"world_size": world, "mode": attempt["mode"], "ok": all(r["ok"] for r in rows),
                    "loaded": rows[0].get("loaded"), "global_steps": rows[0].get("global_steps"),
                    "errors": {str(k): r["error"] for k, r in enumerate(rows) if "error" in r}})
    return res


def _restart(dest: Path, run: Path, stage: int, until: int = 30) -> dict:
    """Run ``_continue`` on ``WORLD`` ranks; return what rank 0 wrote (``losses`` keyed by int step)."""
    from . import _dist

    out = dest / "continued.json"
    logs = dest / "logs_continue"
    codes = _dist.launch("tests.frameworks.fw_deepspeed", "_continue", WORLD,
                         {"run": str(run), "stage": stage, "out": str(out), "until": until}, logs, env=_env())
    _dist.check_codes(codes, logs)
    r = json.loads(out.read_text())
    r["losses"] = {int(k): v for k, v in r["losses"].items()}
    return r


def _probe_text(probes: list) -> str:
    full, module = probes
    if full.get("ok") or not module.get("ok"):
        raise RuntimeError(f"unexpected DeepSpeed behaviour: {probes}")
    errs = "; ".join(f"rank {k}: {v}" for k, v in sorted(full["errors"].items()))
    return (f"load_checkpoint raises ({errs}); load_module_only=True loads the module weights "
            f"of {module['loaded']}.")


def _maybe_probe(dest: Path, run: Path, stage: int, world: int) -> tuple:
    """Opt-in (``CKPTAUDIT_FIXTURE_PROBES=1``): resume the fixture with DeepSpeed itself."""
    if os.environ.get("CKPTAUDIT_FIXTURE_PROBES") != "1":
        return None, ""
    probes = _probe(dest, run, stage, world)
    return probes, f" DeepSpeed on {world} ranks: " + _probe_text(probes)


def _files(run: Path) -> list:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def _truth(name: str, stage: int, description: str, recommendation: str, rollback, damaged: dict,
           details: dict, target: dict | None = None) -> dict:
    return {"fixture": name, "framework": FRAMEWORK, "producer": FRAMEWORK, "description": description,
            "audit_config": {"expected_model_args": dict(MODEL_ARGS),
                             "target": target or {"world_size": WORLD, "zero_stage": stage}},
            "expect": {"recommendation": recommendation, "rollback": rollback, "clean": not damaged,
                       "damaged": damaged},
            "details": {"zero_stage": stage, "saved_world_size": WORLD, **details}}


def _clean(stage: int):
    def make(dest: Path) -> dict:
        run, saves, _ = _run(dest, stage)
        return _truth(f"deepspeed_zero{stage}_clean", stage,
                      f"Clean 30-step DeepSpeed ZeRO-{stage} run on 2 gloo ranks (fp32, torch AdamW, WarmupLR), "
                      f"save_checkpoint every 10 steps with default tags; latest = global_step30.",
                      "resume", "global_step30", {}, {"files": _files(run), "saves": saves})

    make.__name__ = f"make_zero{stage}_clean"
    return make


def make_zero2_missing_optim_partition(dest: Path) -> dict:
    run, saves, _ = _run(dest, 2)
    victim = run / "global_step30" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    size = victim.stat().st_size
    victim.unlink()
    probes, note = _maybe_probe(dest, run, 2, WORLD)
    return _truth("deepspeed_zero2_missing_optim_partition", 2,
                  f"Clean ZeRO-2 run on 2 ranks, then rank 1's optimizer partition of the newest tag "
                  f"(global_step30/zero_pp_rank_1_mp_rank_00_optim_states.pt, {size} bytes) deleted. The module "
                  f"weights (mp_rank_00_model_states.pt, fp32) are intact; latest still names global_step30.{note}",
                  "resume", "global_step20", {"global_step30": {"layer": "file", "usable_for": "warm-start"}},
                  {"files": _files(run), "saves": saves, "deleted": str(victim.relative_to(run)), "probes": probes})


def make_zero2_sigkill_latest(dest: Path) -> dict:
    note = dest / "kill.json"
    kill = {"rank": 1, "tag": "global_step30", "file": "zero_pp_rank_1_mp_rank_00_optim_states.pt",
            "note": str(note)}
    run, saves, codes = _run(dest, 2, kill=kill)
    k = json.loads(note.read_text())
    latest = (run / "latest").read_text().strip()
    if latest != "global_step30":
        raise RuntimeError(f"latest is {latest!r}: the kill did not land after rank 0 wrote latest")
    probes, note = _maybe_probe(dest, run, 2, WORLD)
    return _truth("deepspeed_zero2_sigkill_latest", 2,
                  f"ZeRO-2 on 2 ranks; during the step-30 save rank 1 was SIGKILLed halfway through its optimizer "
                  f"partition (zero_pp_rank_1_mp_rank_00_optim_states.pt, {k['bytes_written']} of {k['size']} bytes) "
                  f"after rank 0 had finished its files and written latest = global_step30. Rank 0's "
                  f"mp_rank_00_model_states.pt (fp32 weights) and optimizer partition are complete.{note}",
                  "resume", "global_step20", {"global_step30": {"layer": "file", "usable_for": "warm-start"}},
                  {"files": _files(run), "saves": saves, "kill": {**k, "file": os.path.relpath(k["file"], run)},
                   "exit_codes": codes, "latest": latest, "probes": probes})


def make_zero2_world_size_change(dest: Path) -> dict:
    run, saves, _ = _run(dest, 2)
    probes, probe_note = _maybe_probe(dest, run, 2, 4)  # a 4-rank DeepSpeed job: ~30 s on 2 cores
    probe_note = probe_note or (" DeepSpeed's own check (engine._load_zero_checkpoint): a DP world size other "
                                "than the saved one raises ZeRORuntimeException unless the optimizer states are "
                                "not loaded or the checkpoint is converted to a universal checkpoint.")
    tags = ["global_step10", "global_step20", "global_step30"]
    return _truth("deepspeed_zero2_world_size_change", 2,
                  f"Clean ZeRO-2 run saved on 2 ranks, audited for a resume on 4 ranks (ZeRO-2).{probe_note}",
                  "warm-start", "global_step30", {t: {"layer": "structure", "usable_for": "warm-start"} for t in tags},
                  {"files": _files(run), "saves": saves, "probes": probes},
                  target={"world_size": 4, "zero_stage": 2})


FIXTURES = {
    "deepspeed_zero1_clean": _clean(1),
    "deepspeed_zero2_clean": _clean(2),
    "deepspeed_zero3_clean": _clean(3),
    "deepspeed_zero2_missing_optim_partition": make_zero2_missing_optim_partition,
    "deepspeed_zero2_sigkill_latest": make_zero2_sigkill_latest,
    "deepspeed_zero2_world_size_change": make_zero2_world_size_change,
}
