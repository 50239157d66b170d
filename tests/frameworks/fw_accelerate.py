"""accelerate ``save_state`` runs with automatic checkpoint naming.

``Accelerator(project_config=ProjectConfiguration(project_dir=run,
automatic_checkpoint_naming=True))``; a plain torch MLP, AdamW, a LinearLR
schedule and the DataLoader prepared by accelerate, one ``TrainState`` object
registered with ``register_for_checkpointing``; ``save_state()`` every 5 of 60
optimizer steps gives ``checkpoints/checkpoint_0`` … ``checkpoint_11``.

``accelerate_epoch_saves`` is the plainest use: nothing registered, no
``accumulate()``, ``save_state()`` at the end of each of 3 epochs (8 AdamW steps
each, a LambdaLR stepped per step): ``checkpoint_0`` … ``checkpoint_2``, whose only
field named ``step`` is ``random_states_0.pkl``'s ``Accelerator.step`` (0 there:
the gradient-accumulation counter, which only ``accumulate()`` advances).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import _util as U

REQUIRES = ["accelerate", "safetensors"]

STEPS, SAVE_EVERY = 60, 5
N_SAVES = STEPS // SAVE_EVERY
NEWEST = f"checkpoints/checkpoint_{N_SAVES - 1}"
PREV = f"checkpoints/checkpoint_{N_SAVES - 2}"


class TrainState:
    """Custom object checkpointed by accelerate (state_dict / load_state_dict)."""

    def __init__(self):
        self.step, self.epoch, self.best_loss = 0, 0, float("inf")

    def state_dict(self):
        return {"step": self.step, "epoch": self.epoch, "best_loss": self.best_loss}

    def load_state_dict(self, sd):
        self.step, self.epoch, self.best_loss = sd["step"], sd["epoch"], sd["best_loss"]


def train(run: str, kill_file: str | None = None, kill_log: str | None = None, resume: bool = False,
          loss_log: str | None = None) -> None:
    """The run (optionally SIGKILLed inside the last save).  ``resume``: a restart,
    ``ckptaudit.integrations.accelerate.load_last_good(acc)``, the batches of the epoch already trained
    skipped.  ``loss_log``: where to write the folder and step it started from and the final
    loss over the whole data."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    set_seed(0)
    torch.set_num_threads(1)
    acc = Accelerator(project_config=ProjectConfiguration(project_dir=run, automatic_checkpoint_naming=True))
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=STEPS)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(320, 16, generator=g)
    y = (x[:, :4] > 0).float()
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    state = TrainState()
    acc.register_for_checkpointing(state)
    if kill_file:
        target = f"checkpoint_{N_SAVES - 1}/{kill_file}"
        U.kill_in_torch_save(lambda p: p.endswith(target), 0.5, log=kill_log and Path(kill_log))
    skip, started, started_step = 0, None, 0
    if resume:
        from ckptaudit.integrations.accelerate import load_last_good

        started = load_last_good(acc)
        started_step = state.step
        skip = state.step % len(dl)
    while state.step < STEPS:
        batches = acc.skip_first_batches(dl, skip) if skip else dl
        skip = 0
        for xb, yb in batches:
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            state.step += 1
            state.best_loss = min(state.best_loss, loss.item())
            if state.step % SAVE_EVERY == 0:
                acc.save_state()
            if state.step >= STEPS:
                break
        state.epoch += 1
    if loss_log:
        with torch.no_grad():
            final = float(torch.nn.functional.binary_cross_entropy_with_logits(model(x), y))
        Path(loss_log).write_text(json.dumps({"from": started, "started_step": started_step, "step": state.step,
                                              "final_loss": final}))


EPOCHS, EPOCH_STEPS = 3, 8


def train_epochs(run: str) -> None:
    """The loop of the accelerate quick tour with ``save_state()`` after each epoch, nothing registered."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed

    set_seed(0)
    torch.set_num_threads(1)
    acc = Accelerator(project_config=ProjectConfiguration(project_dir=run, automatic_checkpoint_naming=True))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(8 * EPOCH_STEPS, 8, generator=g),
                                        torch.randn(8 * EPOCH_STEPS, 1, generator=g))
    dl = torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    for _ in range(EPOCHS):
        for xb, yb in dl:
            acc.backward(torch.nn.functional.mse_loss(model(xb), yb))
            opt.step()
            sched.step()
            opt.zero_grad()
        acc.save_state()


def epoch_saves(dest: Path) -> dict:
    run = dest / "run"
    U.run_child(f"{__name__}:train_epochs", {"run": str(run)})
    newest = f"checkpoints/checkpoint_{EPOCHS - 1}"
    return _truth("accelerate_epoch_saves",
                  f"accelerate {_v()} save_state() after each of {EPOCHS} epochs of {EPOCH_STEPS} AdamW steps, "
                  f"nothing registered for checkpointing, no accumulate(): random_states_0.pkl's 'step' "
                  f"(Accelerator.step) is 0 in every save; checkpoints/checkpoint_0 … checkpoint_{EPOCHS - 1}.",
                  U.clean_expect(newest))


def final_loss_of(weights: str) -> float:
    """The loss over the whole training data of the model saved in ``weights`` (a ``model.safetensors`` of
    :func:`train`), for comparing the ends of two runs."""
    import torch
    from safetensors.torch import load_file

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model.load_state_dict(load_file(weights))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(320, 16, generator=g)
    y = (x[:, :4] > 0).float()
    with torch.no_grad():
        return float(torch.nn.functional.binary_cross_entropy_with_logits(model(x), y))


def load_probe(run: str, unit: str, out: str) -> None:
    """``Accelerator.load_state(run/unit)`` with the training's objects prepared and its TrainState registered,
    as the resuming job does; writes ``{"ok", "error", "step"}`` to ``out``."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(0)
    torch.set_num_threads(1)
    acc = Accelerator()
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=STEPS)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 16), torch.randn(32, 4)),
                                     batch_size=16)
    model, opt, dl, sched = acc.prepare(model, opt, dl, sched)
    state = TrainState()
    acc.register_for_checkpointing(state)
    try:
        acc.load_state(str(Path(run) / unit))
        result = {"ok": True, "error": "", "step": state.step}
    except RuntimeError as e:
        result = {"ok": False, "error": str(e).splitlines()[0].replace(f" {Path(run) / unit}", ""), "step": state.step}
    Path(out).write_text(json.dumps(result))


def _loaded(dest: Path, run: Path, unit: str) -> dict:
    out = dest / f"load-{unit.replace('/', '_')}.json"
    U.run_child(f"{__name__}:load_probe", {"run": str(run), "unit": unit, "out": str(out)})
    return json.loads(out.read_text())


def missing_custom_checkpoint(dest: Path) -> dict:
    run = _run(dest)
    (run / NEWEST / "custom_checkpoint_0.pkl").unlink()
    newest, prev = _loaded(dest, run, NEWEST), _loaded(dest, run, PREV)
    if newest["ok"] or not prev["ok"] or prev["step"] != STEPS - SAVE_EVERY:
        raise RuntimeError(f"accelerate's load_state did not behave as the fixture claims: {newest} / {prev}")
    return _truth("accelerate_missing_custom_checkpoint",
                  f"accelerate {_v()} clean run (one TrainState registered), then {NEWEST}/custom_checkpoint_0.pkl "
                  f"deleted. accelerate's own load_state, probed at generation with the TrainState registered: "
                  f"{NEWEST} raises RuntimeError ({newest['error']!r}); {PREV} loads, TrainState.step "
                  f"{prev['step']}.",
                  {"recommendation": "resume", "rollback": PREV, "clean": False,
                   "damaged": {NEWEST: {"layer": "state", "usable_for": "warm-start"}}})


def _run(dest: Path, **kw) -> Path:
    run = dest / "run"
    U.run_child(f"{__name__}:train", {"run": str(run), **kw}, expect_kill=bool(kw.get("kill_file")))
    return run


def _v() -> str:
    import accelerate

    return accelerate.__version__


def _truth(name, description, expect):
    return U.truth(name, "accelerate", "accelerate", description, expect)


def clean(dest: Path) -> dict:
    _run(dest)
    return _truth("accelerate_clean", f"accelerate {_v()} save_state() every 5 of 60 AdamW steps with automatic "
                                      f"checkpoint naming: checkpoints/checkpoint_0 … checkpoint_11, nothing touched.",
                  U.clean_expect(NEWEST))


def kill_in_save_state(dest: Path) -> dict:
    log = dest / "kill.json"
    run = _run(dest, kill_file="optimizer.bin", kill_log=str(log))
    k = json.loads(log.read_text())
    left = sorted(p.name for p in (run / NEWEST).iterdir())
    return _truth("accelerate_kill_in_save_state",
                  f"accelerate {_v()}; SIGKILL inside the 12th save_state (step 60), in torch.save of "
                  f"{NEWEST}/optimizer.bin at byte {k['killed_at_byte']} of {k['full_bytes']}; "
                  f"model.safetensors of that save was complete; {NEWEST} holds {left}.",
                  {"recommendation": "resume", "rollback": PREV, "clean": False,
                   "damaged": {NEWEST: {"layer": "file", "usable_for": "warm-start"}}})


def truncated_optimizer(dest: Path) -> dict:
    run = _run(dest)
    t = U.truncate(run / NEWEST / "optimizer.bin", 0.5)
    return _truth("accelerate_truncated_optimizer",
                  f"accelerate {_v()} clean run, then {NEWEST}/optimizer.bin truncated to {t['kept_bytes']} of "
                  f"{t['full_bytes']} bytes (weights intact).",
                  {"recommendation": "resume", "rollback": PREV, "clean": False,
                   "damaged": {NEWEST: {"layer": "file", "usable_for": "warm-start"}}})


FIXTURES = {
    "accelerate_clean": clean,
    "accelerate_kill_in_save_state": kill_in_save_state,
    "accelerate_truncated_optimizer": truncated_optimizer,
    "accelerate_epoch_saves": epoch_saves,
    "accelerate_missing_custom_checkpoint": missing_custom_checkpoint,
}
