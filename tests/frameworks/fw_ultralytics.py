"""ultralytics fixtures: runs written by ultralytics 8.4.190's own ``model.train(...)`` and ``save_model``.

The job: ``YOLO(<tiny detection yaml>)`` (Conv/C2f/SPPF backbone, one upsample + C2f neck, a two-scale ``Detect``
head, nc=1: 0.24 M parameters; built from the yaml, no weights downloaded) trained by ``model.train(data=<local
dataset yaml>, epochs=4, imgsz=64, batch=4, nbs=4, workers=0, device="cpu", amp=False, plots=False, seed=0,
deterministic=True)`` on 8 generated 64x64 images with one box each (train and val the same 8).  ultralytics saves
``weights/last.pt`` (and ``weights/best.pt`` when the fitness is the best yet) after every epoch
(``ultralytics/engine/trainer.py`` :768-837, ``Path.write_bytes`` of one ``torch.save`` into a buffer) and rewrites
both through ``strip_optimizer`` when training ends (:1005-1022).  No network: ``YOLO_OFFLINE=1``, the settings
file in the fixture folder (``YOLO_CONFIG_DIR``) with ``sync=False``, ``amp=False`` (no AMP check download),
``plots=False`` (no font download); torchvision imported with the CPU torch (:mod:`._torchvision`) and its ``nms``
replaced by ultralytics' own ``TorchNMS.nms`` for validation.

Truth: ``YOLO(path).train(resume=True, data=<the dataset yaml>, save_dir=<a copy of the run>)`` on a copy of the
run (``data`` and ``save_dir`` are arguments a resume may change, ``check_resume`` :1037-1062), stopped by a
callback at ``on_train_start``, after ``resume_training`` (:1128-1145) set ``start_epoch`` and restored the
optimizer and EMA; or the error it raises.  The audit's rollback unit must be a file that resume continues from, and its step that ``start_epoch``.

* ``ultralytics_clean``: 4 epochs, finished: both files stripped (``epoch`` -1, no optimizer).
  ``train(resume=True)`` warns that the file is no resumable training checkpoint and starts a new training from
  its weights (``ultralytics/engine/model.py`` :876-886): a warm start; ``train(resume=<path>)`` (the CLI's way)
  refuses ("training to 4 epochs is finished, nothing to resume", ``trainer.py`` :1133-1136).
* ``ultralytics_preempted``: SIGKILL right after epoch 2's save (``on_model_save`` of epoch index 1): the resume of
  ``weights/last.pt`` starts at epoch index 2.
* ``ultralytics_sigkill_last``: SIGKILL inside the write of ``weights/last.pt`` of epoch 3 (half its bytes
  written): ``last.pt`` is cut and its resume fails; ``best.pt`` holds epoch 2 and resumes at epoch index 2.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from . import _torchvision
from . import _util as U

_torchvision.install()  # ultralytics imports torchvision; nothing is imported here

REQUIRES = ["ultralytics"]

EPOCHS, IMG, BATCH, N_IMAGES = 4, 64, 4, 8
KILL_AFTER, KILL_IN_LAST = 1, 2  # epoch indices (0-based, as ultralytics saves them)
MODEL_YAML = """nc: 1
backbone:
  - [-1, 1, Conv, [8, 3, 2]]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, C2f, [16, True]]
  - [-1, 1, Conv, [32, 3, 2]]
  - [-1, 1, C2f, [32, True]]
  - [-1, 1, Conv, [64, 3, 2]]
  - [-1, 1, SPPF, [64, 5]]
head:
  - [-1, 1, nn.Upsample, [None, 2, "nearest"]]
  - [[-1, 4], 1, Concat, [1]]
  - [-1, 1, C2f, [32]]
  - [[9, 6], 1, Detect, [nc]]
"""


def _offline(home: str) -> None:
    """No network and no settings outside ``home``: set before ultralytics is imported."""
    os.environ.update(YOLO_OFFLINE="1", YOLO_CONFIG_DIR=os.path.join(home, "config"), YOLO_VERBOSE="False")


def _import(home: str):
    _offline(home)
    from ultralytics import YOLO, settings
    from ultralytics.utils.nms import TorchNMS

    settings.update({"sync": False})
    _torchvision.use_nms(TorchNMS.nms)
    return YOLO


def _dataset(home: Path) -> Path:
    """8 images with one bright box each and their YOLO labels, the dataset yaml and the model yaml, in ``home``."""
    import numpy as np
    from PIL import Image

    data = home / "data"
    (data / "images" / "train").mkdir(parents=True)
    (data / "labels" / "train").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(N_IMAGES):
        img = (rng.random((IMG, IMG, 3)) * 60).astype(np.uint8)
        x0, y0 = rng.integers(4, 30, 2)
        w, h = rng.integers(12, 28, 2)
        img[y0:y0 + h, x0:x0 + w] = 200
        Image.fromarray(img).save(data / "images" / "train" / f"im{i}.png")
        (data / "labels" / "train" / f"im{i}.txt").write_text(
            f"0 {(x0 + w / 2) / IMG:.4f} {(y0 + h / 2) / IMG:.4f} {w / IMG:.4f} {h / IMG:.4f}\n")
    (data / "data.yaml").write_text(f"path: {data}\ntrain: images/train\nval: images/train\nnames:\n  0: box\n")
    (data / "tiny.yaml").write_text(MODEL_YAML)
    return data


def train(home: str, kill_after=None, kill_in_last=None, note: str = "") -> None:
    """Train into ``home/run`` (the save_dir); SIGKILL after the save of epoch ``kill_after``, or inside the write
    of ``last.pt`` of epoch ``kill_in_last`` (half its bytes)."""
    import pathlib
    import signal

    YOLO = _import(home)
    U.seed_all(0)
    data = Path(home) / "data"
    model = YOLO(str(data / "tiny.yaml"))
    if kill_after is not None:
        def after_save(trainer):
            if trainer.epoch == kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

        model.add_callback("on_model_save", after_save)
    if kill_in_last is not None:
        real = pathlib.Path.write_bytes
        writes = {"n": 0}

        def write_bytes(self, data_, *a, **kw):  # save_model's self.last.write_bytes(serialized_ckpt), :832
            if self.name == "last.pt":
                writes["n"] += 1
                if writes["n"] == kill_in_last + 1:
                    cut = len(data_) // 2
                    Path(note).write_text(json.dumps({"file": str(self), "full_bytes": len(data_),
                                                      "killed_at_byte": cut}))
                    U.arm_kill_at_file_size(cut)
            return real(self, data_, *a, **kw)

        pathlib.Path.write_bytes = write_bytes
    model.train(data=str(data / "data.yaml"), epochs=EPOCHS, imgsz=IMG, batch=BATCH, nbs=BATCH, workers=0,
                device="cpu", amp=False, plots=False, seed=0, deterministic=True, project=str(home), name="run",
                exist_ok=True, verbose=False)


class _Stop(Exception):
    pass


def resume(home: str, path: str, save_dir: str, out: str, as_path: bool = False) -> None:
    """``YOLO(path).train(resume=True, data=<the dataset>, save_dir=save_dir)`` (``resume=path`` with ``as_path``,
    as the CLI's ``yolo train resume model=path`` does) stopped at ``on_train_start``: what it set up, or the error
    it raised, into ``out``."""
    YOLO = _import(home)
    res = {"path": os.path.relpath(path, save_dir), "resume": path if as_path else True}
    try:
        model = YOLO(path)

        def started(trainer):
            opt = trainer.optimizer.state_dict()
            res.update(resumed=bool(trainer.resume), start_epoch=trainer.start_epoch, epochs=trainer.epochs,
                       ema_updates=trainer.ema.updates,
                       optimizer_steps=sorted({int(s["step"]) for s in opt["state"].values() if "step" in s}),
                       best_fitness=trainer.best_fitness)
            raise _Stop()

        model.add_callback("on_train_start", started)
        model.train(resume=path if as_path else True, data=str(Path(home) / "data" / "data.yaml"), save_dir=save_dir,
                    workers=0, device="cpu", plots=False)
        res.update(ok=False, error="train(resume=True) returned without starting")
    except _Stop:
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001 - the resume's refusal is the truth (AssertionError included)
        res.update(ok=False, error=f"{type(e).__name__}: {e}".replace(save_dir, "<run>")[:400])
    Path(out).write_text(json.dumps(res))


def _probe(dest: Path, name: str, unit: str, as_path: bool = False) -> dict:
    """The resume of ``unit`` (run-relative) on a fresh copy of the run."""
    copy = dest / f"probe-{name}"
    shutil.copytree(dest / "run", copy)
    out = dest / f"resume-{name}.json"
    U.run_child(f"{__name__}:resume", {"home": str(dest), "path": str(copy / unit), "save_dir": str(copy),
                                       "out": str(out), "as_path": as_path})
    shutil.rmtree(copy)
    return json.loads(out.read_text())


def _ckpt(path: Path) -> dict:
    """``epoch`` and whether the optimizer is there, read with torch.load(weights_only=False) (the generator's own
    file, written here), or the error."""
    import torch

    try:
        c = torch.load(path, map_location="cpu", weights_only=False)
        return {"epoch": c.get("epoch"), "optimizer": c.get("optimizer") is not None}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:200]}


def _run(dest: Path, **kill) -> tuple:
    _dataset(dest)
    if kill:
        kill.setdefault("note", str(dest / "kill.json"))
    U.run_child(f"{__name__}:train", {"home": str(dest), **kill}, expect_kill=bool(kill))
    run = dest / "run"
    files = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    ckpts = {f: _ckpt(run / f) for f in files if f.endswith(".pt")}
    return run, files, ckpts


def _truth(name, description, expect, details) -> dict:
    t = U.truth(name, "ultralytics", "ultralytics", description, expect)
    t["details"] = details
    return t


def clean(dest: Path) -> dict:
    _run_, files, ckpts = _run(dest)
    last = _probe(dest, "last", "weights/last.pt")
    cli = _probe(dest, "last-cli", "weights/last.pt", as_path=True)
    if not (last["ok"] and not last["resumed"] and last["start_epoch"] == 0) or \
            cli["ok"] or "nothing to resume" not in cli.get("error", ""):
        raise RuntimeError(f"ultralytics' resume of the finished run: {last}, {cli}")
    expect = {"recommendation": "warm-start", "rollback": "weights/last.pt", "clean": True, "damaged": {}}
    return _truth("ultralytics_clean",
                  f"ultralytics run of {EPOCHS} epochs, finished: {files}, both stripped by strip_optimizer "
                  f"({ckpts}). YOLO('weights/last.pt').train(resume=True) warns that it is no resumable checkpoint "
                  f"and starts a new training from its weights at epoch 0 (a warm start); with resume=<path> (the "
                  f"CLI's 'yolo train resume model=...') it refuses: {cli['error'][:140]}",
                  expect, {"files": files, "checkpoints": ckpts, "resume_last": last, "resume_last_cli": cli})


def preempted(dest: Path) -> dict:
    _run_, files, ckpts = _run(dest, kill_after=KILL_AFTER)
    last = _probe(dest, "last", "weights/last.pt")
    if not (last["ok"] and last["start_epoch"] == KILL_AFTER + 1):
        raise RuntimeError(f"ultralytics' resume of the preempted run: {last}")
    expect = {"recommendation": "resume", "rollback": "weights/last.pt", "clean": True, "damaged": {},
              "rollback_step": last["start_epoch"]}
    return _truth("ultralytics_preempted",
                  f"ultralytics run of {EPOCHS} epochs SIGKILLed right after the save of epoch index {KILL_AFTER} "
                  f"(on_model_save): {files} ({ckpts}). YOLO('weights/last.pt').train(resume=True) starts at epoch "
                  f"index {last['start_epoch']} with the optimizer and EMA ({last['ema_updates']} updates) restored.",
                  expect, {"files": files, "checkpoints": ckpts, "resume_last": last})


def sigkill_last(dest: Path) -> dict:
    _run_, files, ckpts = _run(dest, kill_in_last=KILL_IN_LAST)
    k = json.loads((dest / "kill.json").read_text())
    k["file"] = os.path.relpath(k["file"], dest / "run")
    last = _probe(dest, "last", "weights/last.pt")
    best = _probe(dest, "best", "weights/best.pt")
    if last["ok"] or not (best["ok"] and best["start_epoch"] == KILL_IN_LAST):
        raise RuntimeError(f"ultralytics' resume of the run killed inside last.pt: {last}, {best}")
    expect = {"recommendation": "resume", "rollback": "weights/best.pt", "clean": False,
              "damaged": {"weights/last.pt": {"layer": "file", "usable_for": "none"}},
              "rollback_step": best["start_epoch"]}
    return _truth("ultralytics_sigkill_last",
                  f"ultralytics run of {EPOCHS} epochs SIGKILLed inside save_model's write of weights/last.pt of "
                  f"epoch index {KILL_IN_LAST} ({k['killed_at_byte']} of {k['full_bytes']} bytes): {files} "
                  f"({ckpts}). YOLO('weights/last.pt').train(resume=True) fails ({last['error'][:120]}); "
                  f"YOLO('weights/best.pt').train(resume=True) starts at epoch index {best['start_epoch']}.",
                  expect, {"files": files, "checkpoints": ckpts, "kill": k, "resume_last": last,
                           "resume_best": best})


FIXTURES = {
    "ultralytics_clean": clean,
    "ultralytics_preempted": preempted,
    "ultralytics_sigkill_last": sigkill_last,
}
