"""timm fixtures: runs written by timm 1.0.31's own ``CheckpointSaver``, set up as timm's ``train.py`` sets it up.

The job (``train.py`` of huggingface/pytorch-image-models at commit aa4b5850, the newest in the mirror; its
calls exist unchanged in the installed 1.0.31): ``timm.create_model("test_resnet", num_classes=4,
pretrained=False)`` (timm's own tiny test ResNet, 0.37 M parameters), a ``timm.task.ClassificationTask`` around it
(train.py :960-967), ``create_optimizer_v2(model, **optimizer_kwargs(cfg=args))`` (AdamW, :969-973),
``create_scheduler_v2(optimizer, **scheduler_kwargs(args, ...), updates_per_epoch=...)`` (cosine with one warm-up
epoch, :1080-1084), the task's EMA, ``task.setup_ema(decay, use_warmup)`` -> ``ModelEmaV3`` (:995-1005), a
``NativeScaler`` (``amp_scaler``; train.py makes one for float16 AMP on CUDA, :629-634; here on CPU, with float16
autocast, so that the saver writes its state as on a GPU run), and ``utils.CheckpointSaver(model=model,
optimizer=optimizer, args=args, amp_scaler=loss_scaler, checkpoint_dir=output_dir, recovery_dir=output_dir,
decreasing=False, max_history=args.checkpoint_hist, task=task)`` (:1048-1058) with its defaults: each epoch
``save_checkpoint(epoch, metric=top1)`` (:1195-1197) writes ``tmp.pth.tar``, replaces ``last.pth.tar`` with it,
and hard-links it as ``checkpoint-<epoch>.pth.tar`` (and ``model_best.pth.tar`` when top1 is the best yet)
(``timm/utils/checkpoint_saver.py`` :204-221, :242-247).  The train loop is train.py's ``train_one_epoch``
(:1276-1420: task forward, the scaler's backward and step, ``task.update_ema(step=num_updates)``,
``lr_scheduler.step_update``), 3 updates of 8 random 32x32 images per epoch, and top1 of the EMA model on 16 more
images after each epoch (train.py validates the EMA model when there is one, :1149-1172).

Truth: timm's own resume on the run as train.py does it, ``resume_task_checkpoint(task, path, optimizer,
loss_scaler)`` and ``load_task_ema_checkpoint`` (``timm/task/_helpers.py`` :23-80), and the older
``timm.models.resume_checkpoint(model, path, optimizer, loss_scaler)`` (``timm/models/_helpers.py`` :261-315):
each returns the epoch training continues at (the saved ``epoch`` + 1, as the saved ``version`` is 2), on the file
``--resume`` is given (``last.pth.tar``, and the audit's rollback unit).  The audit's rollback unit must be the
newest file that resume continues faithfully from, and its step that returned epoch.

* ``timm_clean``: 5 epochs, nothing touched.
* ``timm_sigkill_save``: SIGKILL inside ``CheckpointSaver._save``'s ``torch.save`` of epoch 3 into
  ``tmp.pth.tar`` (half its bytes written): ``last.pth.tar`` is still epoch 2's save, ``tmp.pth.tar`` is cut.
* ``timm_nan_divergence``: a corrupt training batch (NaN pixels) in epoch 2 makes the loss NaN; train.py has no
  guard (the scaler-less CPU path, as train.py runs without ``--amp``), the weights and the EMA turn NaN and the
  run keeps saving epochs 2-4.  timm resumes ``last.pth.tar`` at epoch 5 with NaN weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import _torchvision
from . import _util as U

_torchvision.install()  # timm imports torchvision; nothing is imported here

REQUIRES = ["timm"]

MODEL, NUM_CLASSES, IMG = "test_resnet", 4, 32
EPOCHS, UPDATES, BATCH = 5, 3, 8
KILL_EPOCH, NAN_EPOCH = 3, 2


def _args(epochs: int):
    """train.py's parsed arguments for this job (the fields its factories and saver read; the rest default)."""
    import argparse

    return argparse.Namespace(
        model=MODEL, num_classes=NUM_CLASSES, pretrained=False, img_size=IMG, batch_size=BATCH,
        opt="adamw", lr=1e-3, weight_decay=0.05, momentum=0.9, opt_eps=None, opt_betas=None,
        sched="cosine", epochs=epochs, warmup_epochs=1, warmup_lr=1e-5, min_lr=1e-6, cooldown_epochs=0,
        decay_epochs=90, decay_milestones=[90, 180, 270], decay_rate=0.1, sched_on_updates=False,
        model_ema=True, model_ema_decay=0.9, model_ema_warmup=True, model_ema_force_cpu=False,
        amp=True, amp_dtype="float16", checkpoint_hist=10, eval_metric="top1", seed=42,
        resume="", no_resume_opt=False, start_epoch=None, output="", experiment="run", log_interval=50,
    )


def _data(nan_epoch=None):
    """(train batches per epoch, eval batch): random images and labels; with ``nan_epoch``, that epoch's second
    batch holds NaN pixels, as a corrupt decoded image would."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(UPDATES * BATCH, 3, IMG, IMG, generator=g)
    y = torch.randint(0, NUM_CLASSES, (UPDATES * BATCH,), generator=g)
    ex = torch.randn(16, 3, IMG, IMG, generator=g)
    ey = torch.randint(0, NUM_CLASSES, (16,), generator=g)

    def batches(epoch):
        for i in range(UPDATES):
            xb = x[i * BATCH:(i + 1) * BATCH].clone()
            if epoch == nan_epoch and i == 1:
                xb[0, 0, :4, :4] = float("nan")
            yield xb, y[i * BATCH:(i + 1) * BATCH]

    return batches, (ex, ey)


def _job(args, scaler: bool):
    """train.py's set-up: (task, model, optimizer, scheduler, loss scaler, amp autocast)."""
    import contextlib
    from functools import partial

    import torch
    import timm
    from timm.optim import create_optimizer_v2, optimizer_kwargs
    from timm.scheduler import create_scheduler_v2, scheduler_kwargs
    from timm.task import ClassificationTask
    from timm.utils import NativeScaler

    U.seed_all(args.seed)
    model = timm.create_model(args.model, pretrained=args.pretrained, num_classes=args.num_classes)
    task = ClassificationTask(model=model, criterion=torch.nn.CrossEntropyLoss(), device=torch.device("cpu"),
                              verbose=False)
    model = task.get_trainable_module()
    optimizer = create_optimizer_v2(model, **optimizer_kwargs(cfg=args))
    task.setup_ema(decay=args.model_ema_decay, use_warmup=args.model_ema_warmup)
    loss_scaler = NativeScaler(device="cpu") if scaler else None
    autocast = partial(torch.autocast, device_type="cpu", dtype=torch.float16) if scaler else contextlib.nullcontext
    sched, num_epochs = create_scheduler_v2(optimizer, **scheduler_kwargs(args, decreasing_metric=False),
                                            updates_per_epoch=UPDATES)
    return task, model, optimizer, sched, num_epochs, loss_scaler, autocast


def _finite(sd) -> bool:
    import torch

    return all(bool(torch.isfinite(t).all()) for t in sd.values() if torch.is_tensor(t) and t.is_floating_point())


def train(run: str, epochs: int = EPOCHS, kill_epoch=None, nan_epoch=None, note: str = "", scaler: bool = True) -> None:
    """Run the job into ``run`` (train.py's ``output_dir``); ``kill_epoch``: SIGKILL in that epoch's save."""
    import torch
    from timm.utils import CheckpointSaver, accuracy

    args = _args(epochs)
    task, model, optimizer, sched, num_epochs, loss_scaler, autocast = _job(args, scaler)
    os.makedirs(run, exist_ok=True)
    saver = CheckpointSaver(model=model, optimizer=optimizer, args=args, amp_scaler=loss_scaler,
                            checkpoint_dir=run, recovery_dir=run, decreasing=False,
                            max_history=args.checkpoint_hist, task=task)
    if kill_epoch is not None:
        saves = {"n": 0}

        def match(path: str) -> bool:  # the kill_epoch-th write of CheckpointSaver's tmp.pth.tar
            if os.path.basename(path) != "tmp.pth.tar":
                return False
            saves["n"] += 1
            return saves["n"] == kill_epoch + 1

        U.kill_in_torch_save(match, 0.5, Path(note) if note else None)
    batches, (ex, ey) = _data(nan_epoch)
    log = []
    for epoch in range(num_epochs):
        model.train()
        num_updates = epoch * UPDATES
        losses = []
        for xb, yb in batches(epoch):
            with autocast():
                loss = task(xb, yb)["loss"]
            if loss_scaler is not None:
                loss_scaler(loss, optimizer)
            else:
                loss.backward()
                optimizer.step()
            losses.append(float(loss))
            num_updates += 1
            optimizer.zero_grad()
            task.update_ema(step=num_updates)
            sched.step_update(num_updates=num_updates)
        ema = task.get_eval_model(ema=True)
        ema.eval()
        with torch.no_grad():
            top1 = float(accuracy(ema(ex), ey, topk=(1,))[0])
        saver.save_checkpoint(epoch, metric=top1)
        sched.step(epoch + 1, top1)
        log.append({"epoch": epoch, "loss": losses, "top1": top1,
                    "weights_finite": _finite(model.state_dict()), "ema_finite": _finite(ema.state_dict())})
        with open(os.path.join(run, "..", "epochs.jsonl"), "a") as f:
            f.write(json.dumps(log[-1]) + "\n")


def resume(paths: list, out: str, scaler: bool = True) -> None:
    """train.py's resume of each of ``paths``: write ``{file name: what timm's resume functions return and whether
    what they restored is finite, or the error they raise}`` to ``out``."""
    Path(out).write_text(json.dumps({os.path.basename(p): _resume_one(p, scaler) for p in paths}))


def _resume_one(path: str, scaler: bool) -> dict:
    from timm.models import resume_checkpoint
    from timm.task import load_task_ema_checkpoint, resume_task_checkpoint

    args = _args(EPOCHS)
    res = {"path": os.path.basename(path)}
    try:
        task, model, optimizer, _s, _n, loss_scaler, _a = _job(args, scaler)
        res["resume_task_checkpoint"] = resume_task_checkpoint(task, path, optimizer=optimizer,
                                                               loss_scaler=loss_scaler, log_info=False)
        load_task_ema_checkpoint(task, path)
        res["weights_finite"] = _finite(model.state_dict())
        res["ema_finite"] = _finite(task.get_trainable_module(ema=True).state_dict())
        res["optimizer_steps"] = sorted({int(s["step"]) for s in optimizer.state_dict()["state"].values()})
        res["scaler_scale"] = float(loss_scaler.state_dict()["scale"]) if loss_scaler is not None else None
        task2, model2, optimizer2, _s, _n, loss_scaler2, _a = _job(args, scaler)
        res["resume_checkpoint"] = resume_checkpoint(model2, path, optimizer2, loss_scaler2, log_info=False)
        res["ok"] = True
    except Exception as e:  # noqa: BLE001 - the resume's failure is the truth
        res.update(ok=False, error=f"{type(e).__name__}: {e}"[:400])
    return res


def _probe(dest: Path, run: Path, names: list, scaler: bool = True) -> dict:
    """``{name: timm's resume of run/name}``, all in one child process."""
    out = dest / "resume.json"
    U.run_child(f"{__name__}:resume", {"paths": [str(run / n) for n in names], "out": str(out), "scaler": scaler})
    return json.loads(out.read_text())


def _files(run: Path) -> list:
    return sorted(p.name for p in run.iterdir())


def _truth(name, description, expect, details) -> dict:
    t = U.truth(name, "timm", "timm", description, expect)
    t["details"] = details
    return t


def _epochs(dest: Path) -> list:
    return [json.loads(line) for line in (dest / "epochs.jsonl").read_text().splitlines()]


def clean(dest: Path) -> dict:
    run = dest / "run"
    U.run_child(f"{__name__}:train", {"run": str(run)})
    newest = f"checkpoint-{EPOCHS - 1}.pth.tar"
    got = _probe(dest, run, ["last.pth.tar", newest])
    last, rb = got["last.pth.tar"], got[newest]
    if not (last["ok"] and last["resume_task_checkpoint"] == rb["resume_task_checkpoint"] == EPOCHS):
        raise RuntimeError(f"timm's resume of the clean run: {last}, {rb}")
    expect = U.clean_expect(newest)
    expect["rollback_step"] = rb["resume_task_checkpoint"]
    return _truth("timm_clean",
                  f"timm CheckpointSaver run of {EPOCHS} epochs x {UPDATES} updates (test_resnet, AdamW, cosine, "
                  f"ModelEmaV3, NativeScaler), nothing touched: {_files(run)}. timm's resume of last.pth.tar and of "
                  f"{newest} continues at epoch {last['resume_task_checkpoint']}.",
                  expect, {"files": _files(run), "epochs": _epochs(dest), "resume_last": last, "resume_rollback": rb})


def sigkill_save(dest: Path) -> dict:
    run = dest / "run"
    note = dest / "kill.json"
    U.run_child(f"{__name__}:train", {"run": str(run), "kill_epoch": KILL_EPOCH, "note": str(note)},
                expect_kill=True)
    k = json.loads(note.read_text())
    k["file"] = os.path.relpath(k["file"], run)
    prev = f"checkpoint-{KILL_EPOCH - 1}.pth.tar"
    got = _probe(dest, run, ["last.pth.tar", prev])
    last, rb = got["last.pth.tar"], got[prev]
    if not (last["ok"] and last["resume_task_checkpoint"] == rb["resume_task_checkpoint"] == KILL_EPOCH):
        raise RuntimeError(f"timm's resume of the killed run: {last}, {rb}")
    expect = {"recommendation": "resume", "rollback": prev, "clean": False, "damaged": {},
              "rollback_step": rb["resume_task_checkpoint"]}
    return _truth("timm_sigkill_save",
                  f"timm CheckpointSaver run SIGKILLed inside the torch.save of epoch {KILL_EPOCH} into tmp.pth.tar "
                  f"({k['killed_at_byte']} of {k['full_bytes']} bytes written): {_files(run)}. last.pth.tar is still "
                  f"epoch {KILL_EPOCH - 1}'s save; timm's resume of it continues at epoch "
                  f"{last['resume_task_checkpoint']}.",
                  expect, {"files": _files(run), "kill": k, "epochs": _epochs(dest), "resume_last": last,
                           "resume_rollback": rb})


def nan_divergence(dest: Path) -> dict:
    run = dest / "run"
    U.run_child(f"{__name__}:train", {"run": str(run), "nan_epoch": NAN_EPOCH, "scaler": False})
    epochs = _epochs(dest)
    bad = [e["epoch"] for e in epochs if not (e["weights_finite"] and e["ema_finite"])]
    if not bad or min(bad) != NAN_EPOCH or bad != list(range(NAN_EPOCH, EPOCHS)):
        raise RuntimeError(f"the NaN batch of epoch {NAN_EPOCH} did not poison epochs {NAN_EPOCH}-{EPOCHS - 1}: "
                           f"{epochs}")
    probes = _probe(dest, run, [n for n in _files(run) if n.endswith(".pth.tar")], scaler=False)
    damaged = {n: {"layer": "state", "usable_for": "none"} for n, p in probes.items()
               if p["ok"] and not (p["weights_finite"] and p["ema_finite"])}
    good = f"checkpoint-{NAN_EPOCH - 1}.pth.tar"
    if good in damaged or probes[good]["resume_task_checkpoint"] != NAN_EPOCH:
        raise RuntimeError(f"timm's resume of {good}: {probes[good]}")
    expect = {"recommendation": "resume", "rollback": good, "clean": False, "damaged": damaged,
              "rollback_step": probes[good]["resume_task_checkpoint"]}
    last = probes["last.pth.tar"]
    return _truth("timm_nan_divergence",
                  f"timm CheckpointSaver run (no loss scaler, as train.py on CPU) whose epoch-{NAN_EPOCH} batch holds "
                  f"NaN pixels: the loss is NaN, AdamW and the EMA spread it, and the run keeps saving epochs "
                  f"{NAN_EPOCH}-{EPOCHS - 1}. timm's resume of last.pth.tar continues at epoch "
                  f"{last['resume_task_checkpoint']} with NaN weights (weights finite: {last['weights_finite']}); "
                  f"of {good}, at epoch {NAN_EPOCH} with finite ones.",
                  expect, {"files": _files(run), "epochs": epochs, "resume": probes})


FIXTURES = {
    "timm_clean": clean,
    "timm_sigkill_save": sigkill_save,
    "timm_nan_divergence": nan_divergence,
}
