"""Lightning fixtures: runs written by ``lightning.pytorch.Trainer`` and its own
``ModelCheckpoint`` with default save settings.

The job: a tiny MLP regression ``LightningModule`` (``save_hyperparameters()``),
80 synthetic samples in batches of 8 (10 steps an epoch, shuffled), AdamW with a
per-epoch StepLR from ``configure_optimizers`` (Lightning's default interval,
"epoch"), ``Trainer(max_steps=30, accelerator="cpu", logger=False,
enable_progress_bar=False)``, and two callbacks:

* ``ModelCheckpoint(dirpath=run/"checkpoints", every_n_train_steps=10, save_top_k=-1, save_last=True)``
  -> ``epoch=0-step=10.ckpt``, ``epoch=1-step=20.ckpt``, ``epoch=2-step=30.ckpt``, ``last.ckpt``
* ``ModelCheckpoint(dirpath=run/"checkpoints", filename="best-{epoch}-{step}", monitor="train_loss")``
  (top-1, saved at each train-epoch end) -> one ``best-epoch=E-step=S.ckpt``

In lightning 2.6.6 ``save_last=True`` is neither a link nor a copy: right after
each periodic save, ``ModelCheckpoint._save_last_checkpoint`` calls
``trainer.save_checkpoint("last.ckpt")`` again, a second full save of the same
training state (only ``save_last="link"`` makes a symlink, falling back to
``shutil.copy`` where links fail).  Every save goes through
``lightning.fabric.utilities.cloud_io._atomic_save``: ``torch.save`` into memory,
then fsspec's local transaction writes a ``tempfile.mkstemp()`` file in
``$TMPDIR`` and ``shutil.move``\\ s it onto the final name.

Training runs in a child process (:mod:`._dist`) so a staged SIGKILL kills a
real training process during Lightning's own save.

``lightning_default_*``: the plainest set-up, ``Trainer(max_epochs=3)`` with one
``ModelCheckpoint(dirpath=run/"checkpoints", save_last=True)`` and everything else
default (top-1 by the newest step, saved at each train-epoch end): the run holds
``epoch=2-step=30.ckpt`` and ``last.ckpt``, a second full save of the same state.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

REQUIRES = ["lightning"]

FRAMEWORK = "lightning"
MODEL_ARGS = {"d_in": 8, "hidden": 32, "d_out": 1}
CKPT = "checkpoints"


# --------------------------------------------------------------------------- child side

def _build(lr: float, optimizer: str, gamma: float = 0.9):
    import lightning as L
    import torch
    from torch import nn

    class TinyRegressor(L.LightningModule):
        def __init__(self, d_in: int = 8, hidden: int = 32, d_out: int = 1, lr: float = 1e-2,
                     optimizer: str = "adamw", gamma: float = 0.9):
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                     nn.Linear(hidden, d_out))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            if self.hparams.optimizer == "sgd":
                opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
            else:
                opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.hparams.gamma)
            return [opt], [sched]

    g = torch.Generator().manual_seed(0)
    x = torch.randn(80, MODEL_ARGS["d_in"], generator=g)
    w = torch.randn(MODEL_ARGS["d_in"], 1, generator=g)
    y = torch.sin(x @ w) + 0.05 * torch.randn(80, 1, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=True,
                                       generator=torch.Generator().manual_seed(1))
    return TinyRegressor(**MODEL_ARGS, lr=lr, optimizer=optimizer, gamma=gamma), data


def _callbacks(run: Path, making: Path):
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Record(L.Callback):
        """Writes down, at each save, whether the weights and optimizer moments are finite
        (the fixture's truth for a divergence comes from here, not from the audit).
        Keeps no state, so it adds nothing to the checkpoint."""

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            def finite(obj):
                if isinstance(obj, torch.Tensor):
                    return bool(torch.isfinite(obj).all()) if obj.is_floating_point() else True
                if isinstance(obj, dict):
                    return all(finite(v) for v in obj.values())
                if isinstance(obj, (list, tuple)):
                    return all(finite(v) for v in obj)
                return True

            loss = float(trainer.callback_metrics.get("train_loss", float("nan")))
            rec = {"global_step": checkpoint["global_step"], "epoch": checkpoint["epoch"],
                   "weights_finite": finite(checkpoint["state_dict"]),
                   "optimizer_finite": finite([o["state"] for o in checkpoint["optimizer_states"]]),
                   "max_abs_weight": max(float(t.abs().max()) for t in checkpoint["state_dict"].values()),
                   "lr": [g["lr"] for o in checkpoint["optimizer_states"] for g in o["param_groups"]],
                   "loss": loss if loss == loss and abs(loss) != float("inf") else str(loss)}
            with open(making, "a") as f:
                f.write(json.dumps(rec) + "\n")

    return [ModelCheckpoint(dirpath=run / CKPT, every_n_train_steps=10, save_top_k=-1, save_last=True),
            ModelCheckpoint(dirpath=run / CKPT, filename="best-{epoch}-{step}", monitor="train_loss"),
            Record()]


def _install_kill(kill: dict) -> None:
    """Make this process SIGKILL itself halfway through the bytes of ``kill["file"]``.

    ``where="write"``: in the fsspec file object's ``write`` that ``_atomic_save`` calls
    (the bytes go to the transaction's temp file).  ``where="move"``: in the
    ``os.sendfile`` that ``shutil.move`` uses when ``$TMPDIR`` is on another
    filesystem than the run (the bytes go to the final name)."""
    target = kill["file"]
    note = Path(kill["note"])
    if kill["where"] == "write":
        from fsspec.implementations.local import LocalFileOpener

        orig = LocalFileOpener.write

        def write(self, data, *a, **kw):
            if os.path.basename(self.path) == target:
                data = bytes(data)
                half = len(data) // 2
                self.f.write(data[:half])
                self.f.flush()
                os.fsync(self.f.fileno())
                note.write_text(json.dumps({"file": self.path, "temp": self.temp, "size": len(data),
                                            "bytes_written": half, "how": "LocalFileOpener.write"}))
                os.kill(os.getpid(), signal.SIGKILL)
            return orig(self, data, *a, **kw)

        LocalFileOpener.write = write
    elif kill["where"] == "move":
        orig_sendfile = os.sendfile

        def sendfile(out_fd, in_fd, offset, count, *a, **kw):
            dst = os.readlink(f"/proc/self/fd/{out_fd}")
            if os.path.basename(dst) == target:
                size = os.fstat(in_fd).st_size
                half = size // 2
                done = 0
                while done < half:
                    n = orig_sendfile(out_fd, in_fd, done, half - done)
                    if n == 0:
                        break
                    done += n
                os.fsync(out_fd)
                note.write_text(json.dumps({"file": dst, "size": size, "bytes_written": done,
                                            "how": "os.sendfile in shutil.move (cross-filesystem)"}))
                os.kill(os.getpid(), signal.SIGKILL)
            return orig_sendfile(out_fd, in_fd, offset, count, *a, **kw)

        os.sendfile = sendfile
    elif kill["where"] == "publish":  # in ckptaudit.publish's writer (PublishCheckpointIO): the temp file
        from ckptaudit.publish.writer import HashingWriter

        orig_hw = HashingWriter.write

        def hw_write(self, data, *a, **kw):
            if self.path.name.endswith("-" + target):
                half = len(memoryview(data)) // 2
                orig_hw(self, memoryview(data)[:half])
                os.fsync(self.fd)
                note.write_text(json.dumps({"file": str(self.path), "size": len(memoryview(data)),
                                            "bytes_written": half, "how": "HashingWriter.write"}))
                os.kill(os.getpid(), signal.SIGKILL)
            return orig_hw(self, data, *a, **kw)

        HashingWriter.write = hw_write
    else:
        raise ValueError(kill["where"])


def _default_callbacks(run: Path, link: bool = False):
    from lightning.pytorch.callbacks import ModelCheckpoint

    if link:  # save_last="link": last.ckpt is a relative symlink to the newest save (_link_checkpoint)
        return [ModelCheckpoint(dirpath=run / CKPT, save_last="link", save_top_k=-1)]
    return [ModelCheckpoint(dirpath=run / CKPT, save_last=True)]


def _weights_only_last_callbacks(run: Path):
    """Full saves every 10 steps (``save_top_k=-1``) and a second ``ModelCheckpoint(save_weights_only=True,
    save_last=True)`` (top-1 by the newest step, ``weights-{step}.ckpt``): its ``last.ckpt`` holds the weights
    alone (``dump_checkpoint(weights_only=True)``: no ``optimizer_states``, ``lr_schedulers``, ``callbacks``)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    return [ModelCheckpoint(dirpath=run / CKPT, every_n_train_steps=10, save_top_k=-1),
            ModelCheckpoint(dirpath=run / CKPT, filename="weights-{step}", save_weights_only=True, save_last=True)]


def _train(run: str, making: str, lr: float = 1e-2, optimizer: str = "adamw", gamma: float = 0.9,
           kill: dict | None = None, tmpdir: str | None = None, default: bool = False, link: bool = False,
           plugin: bool = False, weights_only_last: bool = False) -> None:
    import warnings

    import lightning as L

    warnings.filterwarnings("ignore")
    if tmpdir:
        os.environ["TMPDIR"] = tmpdir
        tempfile.tempdir = tmpdir
    if kill:
        _install_kill(kill)
    L.seed_everything(0, verbose=False)
    model, data = _build(lr, optimizer, gamma)
    plugins = _plugins(plugin)
    if weights_only_last:
        trainer = L.Trainer(max_steps=30, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=run,
                            callbacks=_weights_only_last_callbacks(Path(run)))
    elif default:
        trainer = L.Trainer(max_epochs=3, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=run,
                            callbacks=_default_callbacks(Path(run), link), plugins=plugins)
    else:
        trainer = L.Trainer(max_steps=30, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=run,
                            callbacks=_callbacks(Path(run), Path(making)), plugins=plugins)
    trainer.fit(model, data)


def _resume_weights_only_last(run: str, out: str) -> None:
    """What the job of :func:`_weights_only_last_callbacks` does on this run folder (written to ``out``), each
    from the folder as it was (the probes run in the order below; only the last one saves past step 30):
    ``trainer.fit(model, ckpt_path="last")``, a warm start (``model.load_state_dict(torch.load(last.ckpt,
    weights_only=True)["state_dict"])``, strict) and ``trainer.fit`` from the newest full save, with the global
    step each reached."""
    import warnings

    import lightning as L
    import torch

    warnings.filterwarnings("ignore")
    res = {}
    for how in ("last", "warm_start", "newest_full"):
        L.seed_everything(0, verbose=False)
        model, data = _build(1e-2, "adamw")
        trainer = L.Trainer(max_steps=40, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=run,
                            callbacks=_weights_only_last_callbacks(Path(run)))  # the job's own: "last" is theirs
        try:
            if how == "warm_start":
                sd = torch.load(Path(run) / CKPT / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
                model.load_state_dict(sd)  # strict: every weight present, none unexpected
                res[how] = {"ok": True, "n_tensors": len(sd)}
                continue
            path = "last" if how == "last" else str(Path(run) / _newest_periodic(_units(Path(run))))
            trainer.fit(model, data, ckpt_path=path)
            res[how] = {"ok": True, "ckpt_path": os.path.relpath(str(trainer.ckpt_path), run),
                        "global_step": trainer.global_step}
        except BaseException as e:  # noqa: BLE001 - the point is to record it
            res[how] = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    Path(out).write_text(json.dumps(res))


def full_loss(ckpt: str | os.PathLike) -> float:
    """Mean squared error over the whole synthetic dataset of the weights in the Lightning checkpoint ``ckpt``
    (the loss a run's state has, free of which batch came last)."""
    import torch

    model, data = _build(1e-2, "adamw")
    model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"])
    x, y = data.dataset.tensors
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def _plugins(plugin: bool) -> list:
    """``[ckptaudit.integrations.lightning.PublishCheckpointIO()]`` when ``plugin``, else Lightning's default."""
    if not plugin:
        return []
    from ckptaudit.integrations.lightning import PublishCheckpointIO

    return [PublishCheckpointIO()]


def _resume_last(run: str, out: str, default: bool = False, link: bool = False, last_good: bool = False,
                 plugin: bool = False) -> None:
    """What ``trainer.fit(model, ckpt_path="last")`` does on this run folder (written to ``out``); with
    ``last_good``, ``ckpt_path=ckptaudit.integrations.lightning.last_good(run/checkpoints)`` instead, and the
    global step it started from."""
    import warnings

    import lightning as L

    warnings.filterwarnings("ignore")
    L.seed_everything(0, verbose=False)
    model, data = _build(1e-2, "adamw")
    trainer = L.Trainer(max_steps=40, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=run,
                        callbacks=_default_callbacks(Path(run), link) if default else
                        _callbacks(Path(run), Path(out + ".making")), plugins=_plugins(plugin))
    res = {"ckpt_path": "last"}
    if last_good:
        from ckptaudit.integrations.lightning import last_good as pick

        res["ckpt_path"] = pick(Path(run) / CKPT)

        class Started(L.Callback):
            def on_train_start(self, trainer, pl_module):
                res["started_step"] = trainer.global_step

        trainer.callbacks.append(Started())
    try:
        trainer.fit(model, data, ckpt_path=res["ckpt_path"])
        res.update(ok=True, resumed_from=str(trainer.ckpt_path), global_step=trainer.global_step)
    except BaseException as e:  # noqa: BLE001 - the point is to record it
        import traceback

        tb = traceback.extract_tb(e.__traceback__)
        res.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                   raised_in=[f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb[-3:]])
    Path(out).write_text(json.dumps(res))


def _resume_lasts(probes: list) -> None:
    """:func:`_resume_last` for each of ``probes`` (its keywords), one after the other in this one process (each with
    its own seed, model, data and Trainer, as a process of its own would build them)."""
    for kw in probes:
        _resume_last(**kw)


# --------------------------------------------------------------------------- parent side

def _run(dest: Path, kill: dict | None = None, tmpdir: str | None = None, **kw) -> tuple:
    from . import _dist

    run = dest / "run"
    run.mkdir(parents=True, exist_ok=True)
    making = dest / "making.jsonl"
    args = dict(run=str(run), making=str(making), kill=kill, tmpdir=tmpdir, **kw)
    logs = dest / "logs"
    codes = _dist.launch("tests.frameworks.fw_lightning", "_train", 1, args, logs)
    _dist.check_codes(codes, logs, expect_killed=0 if kill else None)
    saves = [json.loads(l) for l in making.read_text().splitlines()] if making.exists() else []
    return run, saves


#: the runs that two fixtures each start from (keywords of :func:`_run`), trained once per fixture folder's parent
SHARED_RUNS = {"clean": {}, "default": {"default": True}}


def _shared_run(dest: Path, variant: str) -> tuple:
    """``(run, saves)`` of :func:`_run` with ``SHARED_RUNS[variant]``, trained once per fixture folder's parent
    (:mod:`._shared_run`) and copied to ``dest/run``: the damage is added to the copy."""
    from . import _shared_run as S

    def make(folder: Path) -> dict:
        _run(folder, **SHARED_RUNS[variant])
        return {}

    folder, _ = S.made_once(dest, f"lightning_{variant}", make)
    making = folder / "making.jsonl"
    saves = [json.loads(l) for l in making.read_text().splitlines()] if making.exists() else []
    return S.copy_run(folder, dest), saves


def _units(run: Path) -> list:
    return sorted(p.name for p in (run / CKPT).glob("*.ckpt"))


def _newest_periodic(names, below: int | None = None) -> str:
    import re

    best = None
    for n in names:
        m = re.fullmatch(r"epoch=(\d+)-step=(\d+)\.ckpt", n)
        if m and (below is None or int(m.group(2)) < below):
            s = int(m.group(2))
            if best is None or s > best[0]:
                best = (s, n)
    return f"{CKPT}/{best[1]}"


def _step_of(name: str):
    import re

    m = re.search(r"step=(\d+)", name)
    return int(m.group(1)) if m else None


def _truth(name: str, description: str, recommendation: str, rollback, damaged: dict, details: dict,
           equivalent=()) -> dict:
    return {"fixture": name, "framework": FRAMEWORK, "producer": FRAMEWORK, "description": description,
            "audit_config": {"expected_model_args": dict(MODEL_ARGS), "target": {}},
            "expect": {"recommendation": recommendation, "rollback": rollback, "clean": not damaged,
                       "damaged": damaged, "rollback_equivalent": sorted(equivalent)},
            "details": details}


def _same_state(run: Path, a: str, b: str) -> bool:
    """Whether two checkpoint files hold the same tensors' bytes (zip members other than
    data.pkl and version/byteorder records compared); both were written here."""
    import zipfile

    def members(p):
        with zipfile.ZipFile(p) as z:
            return {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if "/data/" in n}

    return members(run / a) == members(run / b)


def make_clean(dest: Path) -> dict:
    run, saves = _shared_run(dest, "clean")
    names = _units(run)
    newest = _newest_periodic(names)
    eq = [f"{CKPT}/{n}" for n in names if _step_of(n) == 30 and f"{CKPT}/{n}" != newest] + [f"{CKPT}/last.ckpt"]
    return _truth("lightning_clean",
                  "Clean 30-step Lightning run (AdamW, per-epoch StepLR), ModelCheckpoint every 10 steps with "
                  "save_top_k=-1 and save_last=True, plus a monitor='train_loss' top-1 checkpoint.",
                  "resume", newest, {},
                  {"files": names, "saves": saves,
                   "last_ckpt_is": "a second full save (lightning 2.6.6 save_last=True), not a link or copy",
                   "last_same_tensors_as_newest": _same_state(run, "checkpoints/last.ckpt", newest)},
                  equivalent=set(eq))


def make_truncated_last(dest: Path) -> dict:
    from . import _dist

    run, saves = _shared_run(dest, "clean")
    last = run / CKPT / "last.ckpt"
    size = last.stat().st_size
    with open(last, "r+b") as f:
        f.truncate(size // 2)
    # the resume probe runs on a copy, so whatever it writes stays out of the fixture
    probe_run = dest / "resume_probe" / "run"
    shutil.copytree(run, probe_run)
    probe = dest / "resume_probe" / "resume_last.json"
    codes = _dist.launch("tests.frameworks.fw_lightning", "_resume_last", 1,
                         {"run": str(probe_run), "out": str(probe)}, dest / "resume_probe" / "logs")
    _dist.check_codes(codes, dest / "resume_probe" / "logs")
    shutil.rmtree(probe_run)
    resume = json.loads(probe.read_text())
    names = _units(run)
    newest = _newest_periodic(names)
    eq = [f"{CKPT}/{n}" for n in names if _step_of(n) == 30 and f"{CKPT}/{n}" not in (newest, "checkpoints/last.ckpt")]
    return _truth("lightning_truncated_last",
                  f"Clean Lightning run, then checkpoints/last.ckpt (Lightning's save_last copy of step 30) "
                  f"truncated to {size // 2} of {size} bytes. trainer.fit(ckpt_path='last') picks last.ckpt "
                  f"and fails: {resume.get('error', resume)}",
                  "resume", newest, {"checkpoints/last.ckpt": {"layer": "file", "usable_for": "none"}},
                  {"files": names, "saves": saves, "last_ckpt_original_bytes": size,
                   "last_ckpt_bytes": size // 2, "resume_ckpt_path_last": resume,
                   "last_ckpt_role": "pointer-like: a full copy of the newest training state that "
                                     "ckpt_path='last' resolves to"},
                  equivalent=set(eq))


def _probe_last(dest: Path, run: Path, name: str, prepare=None, link: bool = False, last_good: bool = False) -> dict:
    """What ``trainer.fit(model, ckpt_path="last")`` (or, with ``last_good``, ``ckpt_path=last_good(...)``) does on
    a copy of ``run`` (``prepare(copy)`` first)."""
    return _probe_lasts(dest, run, {name: prepare}, link=link, last_good=last_good)[name]


def _probe_lasts(dest: Path, run: Path, probes: dict, link: bool = False, last_good: bool = False) -> dict:
    """:func:`_probe_last` for each ``{name: prepare}`` of ``probes``, each on its own copy of ``run``, all in one
    launch (one process starts and imports Lightning once); ``{name: result}``."""
    from . import _dist

    asks = []
    for name, prepare in probes.items():
        probe_run = dest / name / "run"
        shutil.copytree(run, probe_run, symlinks=True)  # a save_last="link" symlink stays a link
        if prepare:
            prepare(probe_run)
        asks.append({"run": str(probe_run), "out": str(dest / name / "resume_last.json"), "default": True,
                     "link": link, "last_good": last_good})
    logs = dest / ("logs_probes" if len(probes) > 1 else f"{next(iter(probes))}/logs")
    codes = _dist.launch("tests.frameworks.fw_lightning", "_resume_lasts", 1, {"probes": asks}, logs)
    _dist.check_codes(codes, logs)
    results = {}
    for name in probes:
        probe_run = dest / name / "run"
        res = json.loads((dest / name / "resume_last.json").read_text())
        for key in ("resumed_from", "ckpt_path"):
            if res.get(key) and os.path.isabs(res[key]):
                res[key] = os.path.relpath(res[key], probe_run)
        shutil.rmtree(probe_run)
        results[name] = res
    return results


def make_default_clean(dest: Path) -> dict:
    run, _ = _shared_run(dest, "default")
    names = _units(run)
    newest = _newest_periodic(names)
    return _truth("lightning_default_clean",
                  "Trainer(max_epochs=3) with the default ModelCheckpoint(save_last=True) only: "
                  f"{names}; last.ckpt is a second full save of the step-30 state, not a pointer.",
                  "resume", newest, {},
                  {"files": names, "last_is_symlink": (run / CKPT / "last.ckpt").is_symlink(),
                   "last_same_tensors_as_newest": _same_state(run, f"{CKPT}/last.ckpt", newest)},
                  equivalent={f"{CKPT}/last.ckpt"})


LAST_TRUNCATED_BYTES = 6000  # as `truncate -s 6000 checkpoints/last.ckpt`


def make_default_last_truncated(dest: Path) -> dict:
    run, _ = _shared_run(dest, "default")
    last = run / CKPT / "last.ckpt"
    size = last.stat().st_size
    with open(last, "r+b") as f:
        f.truncate(LAST_TRUNCATED_BYTES)
    names = _units(run)
    newest = _newest_periodic(names)

    def repair(r: Path) -> None:  # the audit's printed repair, run in the run folder
        subprocess.run(f"cp -p {newest} {CKPT}/last.ckpt.tmp && mv {CKPT}/last.ckpt.tmp {CKPT}/last.ckpt",
                       shell=True, cwd=r, check=True)

    probes = _probe_lasts(dest, run, {"resume_probe": None, "repaired_probe": repair})
    broken, repaired = probes["resume_probe"], probes["repaired_probe"]
    return _truth("lightning_default_last_truncated",
                  f"Trainer(max_epochs=3), default ModelCheckpoint(save_last=True); then checkpoints/last.ckpt cut "
                  f"to {LAST_TRUNCATED_BYTES} of {size} bytes. trainer.fit(ckpt_path='last') fails: "
                  f"{broken.get('error', broken)}; after copying {newest} over last.ckpt it resumes "
                  f"({repaired.get('ok')}).",
                  "resume", newest, {f"{CKPT}/last.ckpt": {"layer": "file", "usable_for": "none"}},
                  {"files": names, "last_ckpt_original_bytes": size, "last_ckpt_bytes": LAST_TRUNCATED_BYTES,
                   "resume_ckpt_path_last": broken, "resume_after_repair": repaired})


def make_link_target_truncated(dest: Path) -> dict:
    run, _ = _run(dest, default=True, link=True)
    last = run / CKPT / "last.ckpt"
    target = os.readlink(last)
    t = run / CKPT / target
    size = t.stat().st_size
    with open(t, "r+b") as f:
        f.truncate(size // 2)
    names = _units(run)
    prev = _newest_periodic(names, below=_step_of(target))

    def repair(r: Path) -> None:  # the audit's printed repair for the link, run in the run folder
        base = prev.rsplit("/", 1)[-1]
        subprocess.run(f"ln -s {base} {CKPT}/last.ckpt.new && mv -T {CKPT}/last.ckpt.new {CKPT}/last.ckpt",
                       shell=True, cwd=r, check=True)

    probes = _probe_lasts(dest, run, {"resume_probe": None, "repaired_probe": repair}, link=True)
    broken, repaired = probes["resume_probe"], probes["repaired_probe"]
    return _truth("lightning_link_target_truncated",
                  f"Trainer(max_epochs=3), ModelCheckpoint(save_last='link', save_top_k=-1): last.ckpt is a "
                  f"symlink to {target}, which was then cut to {size // 2} of {size} bytes. "
                  f"trainer.fit(ckpt_path='last') fails: {broken.get('error', broken)}; after re-pointing the link "
                  f"at {prev.rsplit('/', 1)[-1]} it resumes ({repaired.get('ok')}).",
                  "resume", prev, {f"{CKPT}/{target}": {"layer": "file", "usable_for": "none"}},
                  {"files": names, "link_target": target, "resume_ckpt_path_last": broken,
                   "resume_after_repair": repaired})


def make_sigkill_save30(dest: Path) -> dict:
    """SIGKILL in ``_atomic_save``'s write of ``epoch=2-step=30.ckpt`` (default $TMPDIR)."""
    tmp = dest / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    note = dest / "kill.json"
    run, saves = _run(dest, kill={"where": "write", "file": "epoch=2-step=30.ckpt", "note": str(note)},
                      tmpdir=str(tmp))
    k = json.loads(note.read_text())
    k.update(file=os.path.relpath(k["file"], run), temp=os.path.relpath(k["temp"], dest))
    names = _units(run)
    newest = _newest_periodic(names)
    leftovers = sorted(p.name for p in tmp.iterdir())
    eq = [f"{CKPT}/{n}" for n in names if _step_of(n) == _step_of(newest) and f"{CKPT}/{n}" != newest]
    return _truth("lightning_sigkill_save30",
                  f"SIGKILL of the training process halfway through the write of epoch=2-step=30.ckpt "
                  f"({k['bytes_written']} of {k['size']} bytes) inside Lightning's _atomic_save. The bytes were "
                  f"going to fsspec's transaction temp file (tempfile.mkstemp() in $TMPDIR, outside the run), so the run folder holds "
                  f"no trace of step 30: last.ckpt is still the step-20 save.",
                  "resume", newest, {},
                  {"files": names, "saves": saves, "kill": k, "tmpdir_leftovers": leftovers},
                  equivalent=set(eq))


def make_sigkill_save30_cross_fs(dest: Path) -> dict:
    """SIGKILL in the cross-filesystem ``shutil.move`` of the step-30 save ($TMPDIR on tmpfs)."""
    if not os.path.isdir("/dev/shm"):
        raise RuntimeError("needs /dev/shm (a tmpfs) for a $TMPDIR on another filesystem than the run")
    tmp = Path(tempfile.mkdtemp(prefix="ckptaudit-fx-", dir="/dev/shm"))
    try:
        if os.stat(tmp).st_dev == os.stat(dest).st_dev:
            raise RuntimeError("/dev/shm is on the same filesystem as the fixture folder")
        note = dest / "kill.json"
        run, saves = _run(dest, kill={"where": "move", "file": "epoch=2-step=30.ckpt", "note": str(note)},
                          tmpdir=str(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    k = json.loads(note.read_text())
    k["file"] = os.path.relpath(k["file"], run)
    names = _units(run)
    prev = _newest_periodic(names, below=30)
    eq = [f"{CKPT}/{n}" for n in names if _step_of(n) == 20 and f"{CKPT}/{n}" != prev] + [f"{CKPT}/last.ckpt"]
    return _truth("lightning_sigkill_save30_cross_fs",
                  f"$TMPDIR on a tmpfs (another filesystem than the run), so fsspec's commit is shutil.move = copy "
                  f"then unlink; SIGKILL halfway through that copy of epoch=2-step=30.ckpt "
                  f"({k['bytes_written']} of {k['size']} bytes at the final name). last.ckpt is still the step-20 "
                  f"save.",
                  "resume", prev, {"checkpoints/epoch=2-step=30.ckpt": {"layer": "file", "usable_for": "none"}},
                  {"files": names, "saves": saves, "kill": k},
                  equivalent=set(eq))


def make_nan_divergence(dest: Path) -> dict:
    run, saves = _run(dest, lr=0.1, optimizer="sgd", gamma=100.0)
    names = _units(run)
    bad_steps = sorted({s["global_step"] for s in saves if not (s["weights_finite"] and s["optimizer_finite"])})
    good_steps = sorted({s["global_step"] for s in saves} - set(bad_steps))
    damaged = {}
    for n in names:
        st = _step_of(n) if n != "last.ckpt" else max(s["global_step"] for s in saves)
        if st in bad_steps:
            damaged[f"{CKPT}/{n}"] = {"layer": "state", "usable_for": "none"}
    if good_steps:
        rb = _newest_periodic(names, below=min(bad_steps) if bad_steps else None)
        eq = [f"{CKPT}/{n}" for n in names if _step_of(n) == _step_of(rb) and f"{CKPT}/{n}" != rb]
        rec = "resume"
    else:
        rb, eq, rec = None, [], "retrain"
    first = min(bad_steps) if bad_steps else None
    return _truth("lightning_nan_divergence",
                  f"Lightning run with SGD(momentum=0.9, lr=0.1) and a per-epoch StepLR whose gamma is 100 (a typo "
                  f"for 0.01): epoch 1 trains at lr=10, the loss diverges and the saved weights/momentum "
                  f"are non-finite from the step-{first} save on (checked on each save's state_dict and optimizer "
                  f"state in on_save_checkpoint). The monitor='train_loss' best checkpoint stays at the last finite "
                  f"loss.",
                  rec, rb, damaged, {"files": names, "saves": saves, "first_nonfinite_save_step": first},
                  equivalent=set(eq))


def make_weights_only_last(dest: Path) -> dict:
    """Full saves every 10 steps beside a ``save_weights_only=True, save_last=True`` callback: ``last.ckpt`` is a
    healthy weights-only save, which ``ckpt_path="last"`` cannot resume from and a warm start loads whole."""
    from . import _dist

    run, saves = _run(dest, weights_only_last=True)
    names = _units(run)
    newest = _newest_periodic(names)
    probe_run = dest / "resume_probe" / "run"
    shutil.copytree(run, probe_run)  # whatever the probes write stays out of the fixture
    out = dest / "resume_probe" / "resume.json"
    codes = _dist.launch("tests.frameworks.fw_lightning", "_resume_weights_only_last", 1,
                         {"run": str(probe_run), "out": str(out)}, dest / "resume_probe" / "logs")
    _dist.check_codes(codes, dest / "resume_probe" / "logs")
    shutil.rmtree(probe_run)
    resume = json.loads(out.read_text())
    if resume["last"]["ok"] or not resume["warm_start"]["ok"] or not resume["newest_full"]["ok"]:
        raise RuntimeError(f"the framework did not behave as this fixture records: {resume}")
    eq = [f"{CKPT}/{n}" for n in names if _step_of(n) == _step_of(newest) and f"{CKPT}/{n}" != newest
          and not n.startswith("weights-")]
    return _truth("lightning_weights_only_last",
                  f"Lightning run with full saves every 10 steps and a second ModelCheckpoint(save_weights_only="
                  f"True, save_last=True): last.ckpt holds the step-30 weights alone. trainer.fit(ckpt_path='last') "
                  f"fails ({resume['last']['error']}); load_state_dict of its state_dict (strict) warm-starts "
                  f"({resume['warm_start']['n_tensors']} tensors); trainer.fit from {newest} resumes to step "
                  f"{resume['newest_full']['global_step']}.",
                  "resume", newest,
                  {f"{CKPT}/last.ckpt": {"layer": "state", "usable_for": "warm-start"}},
                  {"files": names, "saves": saves, "resume": resume}, equivalent=set(eq))


FIXTURES = {
    "lightning_weights_only_last": make_weights_only_last,
    "lightning_clean": make_clean,
    "lightning_truncated_last": make_truncated_last,
    "lightning_sigkill_save30": make_sigkill_save30,
    "lightning_sigkill_save30_cross_fs": make_sigkill_save30_cross_fs,
    "lightning_nan_divergence": make_nan_divergence,
    "lightning_default_clean": make_default_clean,
    "lightning_default_last_truncated": make_default_last_truncated,
    "lightning_link_target_truncated": make_link_target_truncated,
}
