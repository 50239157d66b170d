"""Plain PyTorch training loops that call ``torch.save`` themselves.

(a) the PyTorch tutorial "Saving and loading a general checkpoint in PyTorch"
    (its CIFAR ``Net``, synthetic images): ``torch.save({'epoch', 'model_state_dict',
    'optimizer_state_dict', 'scheduler_state_dict', 'loss'}, f"checkpoint_{step}.pt")``
    once per epoch, SGD(lr=0.1, momentum=0) and StepLR stepped once per epoch;
(b) nanoGPT ``train.py``'s checkpoint dict (``model``, ``optimizer``, ``model_args``,
    ``iter_num``, ``best_val_loss``, ``config``), written to per-step names
    ``ckpt_000010.pt``; AdamW with nanoGPT's two param groups, gradient accumulation 4;
(c) a per-epoch cadence: CosineAnnealingLR stepped once per epoch, 10 optimizer
    steps per epoch, ``{'model', 'optimizer', 'scheduler', 'step', 'epoch'}`` saved
    every 10 steps (inside the epoch, before the epoch's scheduler step);
(d) a loop that pickles the whole model, as ultralytics does and as ``torch.save(model)`` loops do:
    ``{'epoch', 'step', 'model': model, 'optimizer': optimizer.state_dict()}`` every 10 steps, resumed
    with ``torch.load(path, weights_only=False)`` (the model's class, :class:`WholeNet`, is importable
    from this module).
"""

from __future__ import annotations

import os
from pathlib import Path

from . import _util as U

REQUIRES: list = []          # torch only


# ---- (a) the tutorial's general checkpoint
def _tutorial_net():
    import torch.nn as nn
    import torch.nn.functional as F

    class Net(nn.Module):           # the tutorial's model, verbatim
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 6, 5)
            self.pool = nn.MaxPool2d(2, 2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x):
            x = self.pool(F.relu(self.conv1(x)))
            x = self.pool(F.relu(self.conv2(x)))
            x = x.view(-1, 16 * 5 * 5)
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            return self.fc3(x)

    return Net()


TUT_EPOCHS, TUT_STEPS_PER_EPOCH = 3, 10


def train_tutorial(run: Path) -> list[str]:
    import torch

    U.seed_all(0)
    run.mkdir(parents=True)
    net = _tutorial_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    criterion = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TUT_STEPS_PER_EPOCH * 4, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (TUT_STEPS_PER_EPOCH * 4,), generator=g)
    step, names = 0, []
    for epoch in range(TUT_EPOCHS):
        for i in range(TUT_STEPS_PER_EPOCH):
            optimizer.zero_grad()
            loss = criterion(net(x[4 * i:4 * i + 4]), y[4 * i:4 * i + 4])
            loss.backward()
            optimizer.step()
            step += 1
        scheduler.step()
        name = f"checkpoint_{step}.pt"
        torch.save({
            "epoch": epoch,
            "model_state_dict": net.state_dict(),
            "optimizer_state_dict": optimizer.state_dict(),
            "scheduler_state_dict": scheduler.state_dict(),
            "loss": loss,                      # the tutorial saves the loss tensor itself
        }, run / name)
        names.append(name)
    return names


def tutorial_clean(dest: Path) -> dict:
    names = train_tutorial(dest / "run")
    return U.truth("plain_tutorial_clean", "torch", "plain-torch",
                   "PyTorch tutorial general checkpoint (epoch, model_state_dict, optimizer_state_dict, "
                   "scheduler_state_dict, loss tensor) after each of 3 epochs of 10 SGD(lr=0.1, momentum=0) steps, "
                   "StepLR stepped per epoch; nothing touched.", U.clean_expect(names[-1]))


def tutorial_truncated(dest: Path) -> dict:
    names = train_tutorial(dest / "run")
    t = U.truncate(dest / "run" / names[-1], 0.5)
    return U.truth("plain_tutorial_truncated", "torch", "plain-torch",
                   f"PyTorch tutorial general-checkpoint run (as plain_tutorial_clean), then {names[-1]} truncated to "
                   f"{t['kept_bytes']} of {t['full_bytes']} bytes.",
                   {"recommendation": "resume", "rollback": names[-2], "clean": False,
                    "damaged": {names[-1]: {"layer": "file", "usable_for": "none"}}})


# ---- (b) nanoGPT
NANO_ARGS = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32, "bias": False, "vocab_size": 128,
             "dropout": 0.0}


def _nano_gpt(args: dict):
    """nanoGPT's model.py, reduced to what shapes its state_dict (same parameter names, tied lm_head)."""
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class LayerNorm(nn.Module):
        def __init__(self, ndim, bias):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

        def forward(self, x):
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
            self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
            self.n_head, self.n_embd = c["n_head"], c["n_embd"]

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

        def forward(self, x):
            return self.c_proj(self.gelu(self.c_fc(x)))

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.ln_1, self.attn = LayerNorm(c["n_embd"], c["bias"]), CausalSelfAttention(c)
            self.ln_2, self.mlp = LayerNorm(c["n_embd"], c["bias"]), MLP(c)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(c["vocab_size"], c["n_embd"]), wpe=nn.Embedding(c["block_size"], c["n_embd"]),
                drop=nn.Dropout(c["dropout"]), h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
                ln_f=LayerNorm(c["n_embd"], c["bias"])))
            self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
            self.transformer.wte.weight = self.lm_head.weight
            self.apply(self._init_weights)
            for pn, p in self.named_parameters():
                if pn.endswith("c_proj.weight"):
                    torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c["n_layer"]))

        def _init_weights(self, m):
            if isinstance(m, nn.Linear):
                torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if m.bias is not None:
                    torch.nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets):
            pos = torch.arange(idx.size(1))
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
            for b in self.transformer.h:
                x = b(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

        def configure_optimizers(self, weight_decay, learning_rate, betas):
            params = [p for p in self.parameters() if p.requires_grad]
            groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                      {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
            return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)     # fused only on cuda

    return GPT(args)


def train_nanogpt(out_dir: Path, max_iters: int = 30, eval_interval: int = 10, seed: int = 1337) -> list[str]:
    """nanoGPT train.py's loop and checkpoint dict (CPU, no DDP, no compile), per-step file names."""
    import math

    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    # train.py's configurator globals
    cfg = dict(out_dir=str(out_dir), eval_interval=eval_interval, log_interval=1, eval_iters=4, eval_only=False,
               always_save_checkpoint=True, init_from="scratch", wandb_log=False, wandb_project="owt",
               wandb_run_name="gpt2", dataset="synthetic", gradient_accumulation_steps=4, batch_size=4,
               block_size=NANO_ARGS["block_size"], n_layer=NANO_ARGS["n_layer"], n_head=NANO_ARGS["n_head"],
               n_embd=NANO_ARGS["n_embd"], dropout=0.0, bias=False, learning_rate=6e-4, max_iters=max_iters,
               weight_decay=1e-1, beta1=0.9, beta2=0.95, grad_clip=1.0, decay_lr=True, warmup_iters=5,
               lr_decay_iters=max_iters, min_lr=6e-5, backend="gloo", device="cpu", dtype="float32",
               compile=False)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    data = torch.randint(0, NANO_ARGS["vocab_size"], (4096,))

    def get_batch():
        ix = torch.randint(len(data) - cfg["block_size"], (cfg["batch_size"],))
        xb = torch.stack([data[i:i + cfg["block_size"]] for i in ix])
        yb = torch.stack([data[i + 1:i + 1 + cfg["block_size"]] for i in ix])
        return xb, yb

    model_args = dict(NANO_ARGS)
    model = _nano_gpt(model_args)
    optimizer = model.configure_optimizers(cfg["weight_decay"], cfg["learning_rate"], (cfg["beta1"], cfg["beta2"]))

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(cfg["eval_iters"])
            for k in range(cfg["eval_iters"]):
                losses[k] = model(*get_batch())[1].item()
            out[split] = losses.mean()
        model.train()
        return out

    def get_lr(it):
        if it < cfg["warmup_iters"]:
            return cfg["learning_rate"] * (it + 1) / (cfg["warmup_iters"] + 1)
        if it > cfg["lr_decay_iters"]:
            return cfg["min_lr"]
        ratio = (it - cfg["warmup_iters"]) / (cfg["lr_decay_iters"] - cfg["warmup_iters"])
        return cfg["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg["learning_rate"] - cfg["min_lr"])

    iter_num, best_val_loss, names = 0, 1e9, []
    X, Y = get_batch()
    while True:
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % cfg["eval_interval"] == 0:
            losses = estimate_loss()
            if losses["val"] < best_val_loss or cfg["always_save_checkpoint"]:
                best_val_loss = losses["val"]
                if iter_num > 0:
                    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                  "model_args": model_args, "iter_num": iter_num, "best_val_loss": best_val_loss,
                                  "config": cfg}
                    name = f"ckpt_{iter_num:06d}.pt"
                    torch.save(checkpoint, os.path.join(cfg["out_dir"], name))
                    names.append(name)
        for _micro_step in range(cfg["gradient_accumulation_steps"]):
            _, loss = model(X, Y)
            loss = loss / cfg["gradient_accumulation_steps"]
            X, Y = get_batch()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
        if iter_num > cfg["max_iters"]:
            break
    return names


def nanogpt_clean(dest: Path) -> dict:
    names = train_nanogpt(dest / "run", max_iters=30)
    return U.truth("plain_nanogpt_clean", "torch", "nanogpt",
                   "nanoGPT train.py loop and checkpoint dict, 30 iters x 4 micro-steps (gradient accumulation 4), "
                   "AdamW with two param groups, saved at iters 10/20/30 as ckpt_0000NN.pt; AdamW step = iter_num.",
                   U.clean_expect(names[-1]), expected_model_args=NANO_ARGS)


def nanogpt_step_reset(dest: Path) -> dict:
    run = dest / "run"
    first = train_nanogpt(run, max_iters=50, seed=1337)
    second = train_nanogpt(run, max_iters=20, seed=1338)
    # the restart came later: space the saves' times as a real restart would (first run's survivors one
    # hour before the restart's saves), so the save order survives filesystems with coarse timestamps
    import time

    t0 = time.time() - 7200
    for i, n in enumerate(first):
        if n not in second:
            os.utime(run / n, (t0 + 60 * i, t0 + 60 * i))
    for j, n in enumerate(second):
        os.utime(run / n, (t0 + 3600 + 60 * j, t0 + 3600 + 60 * j))
    survivors_first = [n for n in first if n not in second]
    return U.truth("plain_nanogpt_step_reset", "torch", "nanogpt",
                   f"nanoGPT run to iter 50 ({', '.join(first)}), then restarted from scratch (init_from='scratch', "
                   f"seed 1338) into the same out_dir to iter 20, overwriting {', '.join(second)}. Saved in time "
                   f"order: {', '.join(survivors_first)} (first run), then {', '.join(second)} (iter_num back to 10). "
                   f"Truth: the restart lost progress, so resume from the first run's furthest save "
                   f"{first[-1]}; {second[0]} is where the counter goes back.",
                   {"recommendation": "resume", "rollback": first[-1], "clean": False,
                    "damaged": {second[0]: {"layer": "state", "usable_for": "resume"}}},
                   expected_model_args=NANO_ARGS)


# ---- (c) per-epoch cadence
EPOCHS, STEPS_PER_EPOCH, SAVE_EVERY = 5, 10, 10


def train_epoch_cadence(run: Path) -> list[str]:
    import torch

    U.seed_all(0)
    run.mkdir(parents=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS_PER_EPOCH * 8, 8, generator=g)
    y = x.sum(1, keepdim=True)
    step, names = 0, []
    for epoch in range(EPOCHS):
        for i in range(STEPS_PER_EPOCH):
            loss = torch.nn.functional.mse_loss(model(x[8 * i:8 * i + 8]), y[8 * i:8 * i + 8])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % SAVE_EVERY == 0:
                name = f"checkpoint_{step:06d}.pt"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "step": step, "epoch": epoch}, run / name)
                names.append(name)
        scheduler.step()
    return names


def epoch_cadence_clean(dest: Path) -> dict:
    names = train_epoch_cadence(dest / "run")
    return U.truth("plain_epoch_cadence_clean", "torch", "plain-torch",
                   "AdamW + CosineAnnealingLR(T_max=5) stepped once per epoch, 10 optimizer steps per epoch, "
                   "{model, optimizer, scheduler, step, epoch} saved every 10 steps inside the epoch (before the "
                   "epoch's scheduler step): scheduler last_epoch = step/10 - 1 by design; nothing touched.",
                   U.clean_expect(names[-1]))


# ---- (d) whole modules pickled
def _whole_net():
    import torch

    class WholeNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
            self.norm = torch.nn.LayerNorm(2)

        def forward(self, x):
            return self.norm(self.body(x))

    WholeNet.__module__, WholeNet.__qualname__ = __name__, "WholeNet"  # importable: pickle finds it by name
    globals()["WholeNet"] = WholeNet
    return WholeNet


WHOLE_STEPS, WHOLE_EVERY = 30, 10


def train_whole_module(run: str, kill_step: int = 0, kill_log: str | None = None) -> None:
    import torch

    U.seed_all(0)
    Path(run).mkdir(parents=True)
    model = _whole_net()()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if kill_step:
        U.kill_in_torch_save(lambda p: p.endswith(f"ckpt_{kill_step:06d}.pt"), 0.5, log=kill_log and Path(kill_log))
    for step in range(1, WHOLE_STEPS + 1):
        loss = model(torch.randn(16, 8)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % WHOLE_EVERY == 0:
            torch.save({"epoch": step // WHOLE_EVERY, "step": step, "model": model,
                        "optimizer": optimizer.state_dict()}, Path(run) / f"ckpt_{step:06d}.pt")


def resume_whole_module(path: str, out: str) -> None:
    """The loop's own resume: ``torch.load(path, weights_only=False)`` with the model's class importable;
    writes what it got (or the error) to ``out``."""
    import json

    import torch

    _whole_net()
    try:
        ck = torch.load(path, weights_only=False)
        got = {"ok": True, "step": ck["step"], "n_params": sum(1 for _ in ck["model"].parameters()),
               "optimizer_entries": len(ck["optimizer"]["state"])}
    except Exception as e:  # noqa: BLE001 - the resume's failure is the fact recorded
        got = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:160]}"}
    Path(out).write_text(json.dumps(got))


def whole_module_killed(dest: Path) -> dict:
    import json

    run, log = dest / "run", dest / "kill.json"
    U.run_child(f"{__name__}:train_whole_module", {"run": str(run), "kill_step": WHOLE_STEPS,
                                                   "kill_log": str(log)}, expect_kill=True)
    k = json.loads(log.read_text())
    got = {}
    for step in (WHOLE_STEPS - WHOLE_EVERY, WHOLE_STEPS):
        out = dest / f"resume-{step}.json"
        U.run_child(f"{__name__}:resume_whole_module", {"path": str(run / f"ckpt_{step:06d}.pt"), "out": str(out)})
        got[step] = json.loads(out.read_text())
    prev, newest = got[WHOLE_STEPS - WHOLE_EVERY], got[WHOLE_STEPS]
    if not prev["ok"] or newest["ok"]:
        raise RuntimeError(f"the loop's own resume did not behave as the fixture claims: {got}")
    return U.truth("plain_whole_module_killed", "torch", "plain-torch",
                   f"a loop saving {{epoch, step, model: <the nn.Module itself>, optimizer}} every {WHOLE_EVERY} "
                   f"steps, SIGKILLed in the save of step {WHOLE_STEPS} at byte {k['killed_at_byte']} of "
                   f"{k['full_bytes']}. The loop's own resume, torch.load(weights_only=False) with the class "
                   f"importable, probed at generation: ckpt_{WHOLE_STEPS - WHOLE_EVERY:06d}.pt loads (step "
                   f"{prev['step']}, {prev['n_params']} parameters, {prev['optimizer_entries']} AdamW entries); "
                   f"ckpt_{WHOLE_STEPS:06d}.pt fails ({newest['error'][:80]}).",
                   {"recommendation": "resume", "rollback": f"ckpt_{WHOLE_STEPS - WHOLE_EVERY:06d}.pt", "clean": False,
                    "damaged": {f"ckpt_{WHOLE_STEPS:06d}.pt": {"layer": "file", "usable_for": "none"}},
                    # true, not false alarms: the loop's own resume imports WholeNet's module and runs its code
                    "security_true": ["unknown_pickle_global"]})


FIXTURES = {
    "plain_tutorial_clean": tutorial_clean,
    "plain_tutorial_truncated": tutorial_truncated,
    "plain_nanogpt_clean": nanogpt_clean,
    "plain_nanogpt_step_reset": nanogpt_step_reset,
    "plain_epoch_cadence_clean": epoch_cadence_clean,
    "plain_whole_module_killed": whole_module_killed,
}
