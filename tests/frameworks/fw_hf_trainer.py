"""transformers ``Trainer`` runs (tiny GPT-2 built from a config, synthetic tokens).

``TrainingArguments(output_dir=run, save_steps=10, max_steps=30, report_to=[])``
and otherwise the defaults: each ``checkpoint-N/`` holds model.safetensors,
config.json, generation_config.json, optimizer.pt, scheduler.pt, rng_state.pth,
trainer_state.json and training_args.bin.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import _util as U

REQUIRES = ["transformers", "accelerate", "safetensors"]

MODEL_ARGS = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 128, "n_positions": 64}
MAX_STEPS, SAVE_STEPS = 30, 10
NEWEST = f"checkpoint-{MAX_STEPS}"
NAN_LR = 1e5          # AdamW lr that leaves checkpoint-10 finite and checkpoint-20/30 NaN (7e4: all finite,
                      # 1.4e5: all NaN, torch 2.13 CPU); checked at generation


class _Tokens:
    """Synthetic language: arithmetic progressions mod vocab (a torch-free map-style dataset)."""

    def __init__(self, n=512, seq=32, vocab=128, seed=0):
        import torch

        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 5, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(seq)) % vocab

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def train(run: str, n_head: int = 2, learning_rate: float | None = None, save_only_model: bool = False,
          kill_file: str | None = None, kill_step: int = MAX_STEPS, kill_fraction: float = 0.5,
          kill_log: str | None = None, resume_log: str | None = None, seal: bool = False,
          save_total_limit: int | None = None) -> None:
    """One training run with the Trainer's default save settings (optionally SIGKILLed in a save).  With
    ``resume_log``, a restart: ``resume_from_checkpoint=ckptaudit.integrations.hf.last_good(run)``, and the
    checkpoint and global step it started from written to ``resume_log``.  ``seal``: with
    ``callbacks=[ckptaudit.integrations.hf.SealCallback()]``."""
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

    set_seed(0)
    torch.set_num_threads(1)
    model = GPT2LMHeadModel(GPT2Config(**{**MODEL_ARGS, "n_head": n_head}))
    kw = {"learning_rate": learning_rate} if learning_rate is not None else {}
    args = TrainingArguments(output_dir=run, save_steps=SAVE_STEPS, max_steps=MAX_STEPS, report_to=[],
                             per_device_train_batch_size=8, seed=0, save_only_model=save_only_model,
                             disable_tqdm=True, save_total_limit=save_total_limit, **kw)
    callbacks = []
    if seal:
        from ckptaudit.integrations.hf import SealCallback

        callbacks.append(SealCallback())
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(), callbacks=callbacks)
    resume = None
    if resume_log:
        import json

        from ckptaudit.integrations.hf import last_good
        from transformers import TrainerCallback

        resume = last_good(run)

        class Started(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                Path(resume_log).write_text(json.dumps({"from": resume, "global_step": state.global_step}))

        trainer.add_callback(Started())
    if kill_file:
        target = f"checkpoint-{kill_step}/{kill_file}"
        match = lambda p: p.replace(os.sep, "/").endswith(target)  # noqa: E731
        if kill_file.endswith(".safetensors"):
            import transformers.modeling_utils as mu

            U.kill_in_safetensors_save(mu, match, kill_fraction, log=kill_log and Path(kill_log))
        else:
            U.kill_in_torch_save(match, kill_fraction, log=kill_log and Path(kill_log))
    trainer.train(resume_from_checkpoint=resume)
    assert transformers.__version__


def _run(dest: Path, **kw) -> Path:
    run = dest / "run"
    U.run_child(f"{__name__}:train", {"run": str(run), **kw}, expect_kill=bool(kw.get("kill_file")))
    return run


def _version() -> str:
    import transformers

    return transformers.__version__


def _truth(name, description, expect, **kw):
    return U.truth(name, "transformers", "hf-trainer", description, expect,
                   expected_model_args=kw.get("expected_model_args", MODEL_ARGS))


# ---- fixtures
def clean(dest: Path, name: str = "hf_trainer_clean") -> dict:
    _run(dest)
    return _truth(name, f"transformers {_version()} Trainer, tiny GPT-2, 30 steps, default save settings "
                        f"(save_steps=10): checkpoint-10/20/30, nothing touched.", U.clean_expect(NEWEST))


def kill_in_model_save(dest: Path, name: str = "hf_trainer_kill_in_model_save") -> dict:
    log = dest / "kill.json"
    run = _run(dest, kill_file="model.safetensors", kill_log=str(log))
    import json

    k = json.loads(log.read_text())
    left = sorted(p.name for p in (run / NEWEST).iterdir())
    return _truth(name, f"transformers {_version()} Trainer; SIGKILL during the save of step 30 inside the write of "
                        f"checkpoint-30/model.safetensors: safetensors' temp {k['temp']} (sized to {k['full_bytes']} "
                        f"bytes by ftruncate) had {k['killed_at_byte']} bytes written; checkpoint-30 holds {left}.",
                  {"recommendation": "resume", "rollback": "checkpoint-20", "clean": False,
                   "damaged": {NEWEST: {"layer": "file", "usable_for": "none"}}})


def kill_in_optimizer_save(dest: Path, name: str = "hf_trainer_kill_in_optimizer_save") -> dict:
    log = dest / "kill.json"
    run = _run(dest, kill_file="optimizer.pt", kill_log=str(log))
    import json

    k = json.loads(log.read_text())
    left = sorted(p.name for p in (run / NEWEST).iterdir())
    return _truth(name, f"transformers {_version()} Trainer; SIGKILL during the save of step 30 inside torch.save of "
                        f"checkpoint-30/optimizer.pt at byte {k['killed_at_byte']} of {k['full_bytes']} (model "
                        f"weights of step 30 already complete); checkpoint-30 holds {left}.",
                  {"recommendation": "resume", "rollback": "checkpoint-20", "clean": False,
                   "damaged": {NEWEST: {"layer": "file", "usable_for": "warm-start"}}})


def truncated_optimizer(dest: Path) -> dict:
    run = _run(dest)
    t = U.truncate(run / NEWEST / "optimizer.pt", 0.5)
    return _truth("hf_trainer_truncated_optimizer",
                  f"transformers {_version()} Trainer clean run, then checkpoint-30/optimizer.pt truncated to "
                  f"{t['kept_bytes']} of {t['full_bytes']} bytes (weights intact).",
                  {"recommendation": "resume", "rollback": "checkpoint-20", "clean": False,
                   "damaged": {NEWEST: {"layer": "file", "usable_for": "warm-start"}}})


def missing_weights(dest: Path) -> dict:
    run = _run(dest)
    (run / NEWEST / "model.safetensors").unlink()
    return _truth("hf_trainer_missing_weights",
                  f"transformers {_version()} Trainer clean run, then checkpoint-30/model.safetensors deleted "
                  f"(optimizer, scheduler, RNG and trainer state of step 30 remain).",
                  {"recommendation": "resume", "rollback": "checkpoint-20", "clean": False,
                   "damaged": {NEWEST: {"layer": "file", "usable_for": "none"}}})


def missing_optimizer(dest: Path) -> dict:
    run = _run(dest)
    (run / NEWEST / "optimizer.pt").unlink()
    return _truth("hf_trainer_missing_optimizer",
                  f"transformers {_version()} Trainer clean run, then checkpoint-30/optimizer.pt deleted: "
                  f"train(resume_from_checkpoint=True) takes checkpoint-30 (get_last_checkpoint) and continues "
                  f"with a fresh AdamW, silently.",
                  {"recommendation": "resume", "rollback": "checkpoint-20", "clean": False,
                   "damaged": {NEWEST: {"layer": "state", "usable_for": "warm-start"}}})


def resumed_state(run: str, unit: str, out: str) -> None:
    """What ``trainer.train(resume_from_checkpoint=run/unit)`` restored, as the Trainer hands it to its callbacks
    at ``on_train_begin`` (after ``_load_optimizer_and_scheduler``): AdamW entries, the scheduler's
    ``last_epoch`` and the global step, written to ``out`` as JSON.  The run's own max_steps, so a resume from
    the last checkpoint trains no step; a separate output_dir, so the run is not touched."""
    import json

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments, set_seed

    seen: dict = {}

    class Probe(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kw):
            seen.update(optimizer_entries=len(optimizer.state), scheduler_last_epoch=lr_scheduler.last_epoch,
                        global_step=state.global_step)

    set_seed(0)
    torch.set_num_threads(1)
    args = TrainingArguments(output_dir=str(Path(out).parent / "probe-output"), save_steps=SAVE_STEPS,
                             max_steps=MAX_STEPS, report_to=[], per_device_train_batch_size=8, seed=0,
                             disable_tqdm=True)
    trainer = Trainer(model=GPT2LMHeadModel(GPT2Config(**MODEL_ARGS)), args=args, train_dataset=_Tokens(),
                      callbacks=[Probe()])
    trainer.train(resume_from_checkpoint=str(Path(run) / unit))
    Path(out).write_text(json.dumps(seen))


def _resumed(dest: Path, run: Path, unit: str) -> dict:
    import json

    out = dest / f"resumed-{unit}.json"
    U.run_child(f"{__name__}:resumed_state", {"run": str(run), "unit": unit, "out": str(out)})
    return json.loads(out.read_text())


def missing_scheduler(dest: Path, name: str = "hf_trainer_missing_scheduler") -> dict:
    run = _run(dest)
    (run / NEWEST / "scheduler.pt").unlink()
    older, newest = _resumed(dest, run, f"checkpoint-{MAX_STEPS - SAVE_STEPS}"), _resumed(dest, run, NEWEST)
    if not (older["optimizer_entries"] > 0 and newest["optimizer_entries"] == 0
            and newest["scheduler_last_epoch"] == 0 and newest["global_step"] == MAX_STEPS):
        raise RuntimeError(f"the Trainer's resume did not behave as the fixture claims: {older} / {newest}")
    return _truth(name,
                  f"transformers {_version()} Trainer clean run, then checkpoint-30/scheduler.pt deleted (optimizer.pt "
                  f"kept). The Trainer's own resume, probed at generation: from checkpoint-30 it restores "
                  f"{newest['optimizer_entries']} AdamW entries, scheduler last_epoch "
                  f"{newest['scheduler_last_epoch']}, global_step {newest['global_step']} (a fresh optimizer and "
                  f"schedule at step 30, silently); from checkpoint-20, {older['optimizer_entries']} entries and "
                  f"last_epoch {older['scheduler_last_epoch']}.",
                  {"recommendation": "resume", "rollback": "checkpoint-20", "clean": False,
                   "damaged": {NEWEST: {"layer": "state", "usable_for": "warm-start"}}})


def save_only_model(dest: Path) -> dict:
    _run(dest, save_only_model=True)
    units = [f"checkpoint-{s}" for s in range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS)]
    return _truth("hf_trainer_save_only_model",
                  f"transformers {_version()} Trainer with save_only_model=True: every checkpoint has weights, "
                  f"config and trainer_state.json but no optimizer, scheduler or RNG state.",
                  {"recommendation": "warm-start", "rollback": NEWEST, "clean": False,
                   "damaged": {u: {"layer": "state", "usable_for": "warm-start"} for u in units}})


def nan_divergence(dest: Path) -> dict:
    run = _run(dest, learning_rate=NAN_LR)
    finite = {p.name: U.st_all_finite(p / "model.safetensors")
              for p in sorted(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))}
    good = [u for u, ok in finite.items() if ok]
    bad = [u for u, ok in finite.items() if not ok]
    # only what it claims when the divergence lands after the first save: finite ones first, then NaN ones
    if not good or not bad or list(finite.values()) != [True] * len(good) + [False] * len(bad):
        raise RuntimeError(f"learning rate {NAN_LR} did not diverge between saves: finite={finite}")
    return _truth("hf_trainer_nan_divergence",
                  f"transformers {_version()} Trainer with learning_rate={NAN_LR} (AdamW, default grad clipping "
                  f"1.0): weights finite in {good}, NaN in {bad} (checked with safetensors at generation).",
                  {"recommendation": "resume", "rollback": good[-1], "clean": False,
                   "damaged": {u: {"layer": "state", "usable_for": "none"} for u in bad}})


def changed_config(dest: Path) -> dict:
    _run(dest, n_head=4)
    units = [f"checkpoint-{s}" for s in range(SAVE_STEPS, MAX_STEPS + 1, SAVE_STEPS)]
    return _truth("hf_trainer_changed_n_head",
                  f"transformers {_version()} Trainer run trained with n_head=4; the resuming job expects n_head=2 "
                  f"with the same n_embd=32, so every tensor shape matches but the attention is not the same model.",
                  {"recommendation": "retrain", "rollback": None, "clean": False,
                   "damaged": {u: {"layer": "structure", "usable_for": "none"} for u in units}},
                  expected_model_args=MODEL_ARGS)


FIXTURES = {
    "hf_trainer_clean": clean,
    "hf_trainer_kill_in_model_save": kill_in_model_save,
    "hf_trainer_kill_in_optimizer_save": kill_in_optimizer_save,
    "hf_trainer_truncated_optimizer": truncated_optimizer,
    "hf_trainer_missing_weights": missing_weights,
    "hf_trainer_save_only_model": save_only_model,
    "hf_trainer_missing_optimizer": missing_optimizer,
    "hf_trainer_missing_scheduler": missing_scheduler,
    "hf_trainer_nan_divergence": nan_divergence,
    "hf_trainer_changed_n_head": changed_config,
}
