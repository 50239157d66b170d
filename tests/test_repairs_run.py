"""Every printed Python repair runs as printed, in a fresh interpreter, against a unit that needs it.

The repair printed for ``non_allowlisted_global_benign`` once named ``numpy._core.multiarray._reconstruct``
with no import and failed as printed (``NameError: numpy``); ``tests/test_repairs.py`` only compiled it.  Here
each kind of the catalogue whose repair is Python gets a real unit that needs the repair (the handed cases of
``../shared/cases``, this project's ``tests/cases``, or a run trained and saved with ``torch.save`` below), is
audited, and its repair is taken from ``verdict.json`` exactly as printed and run by ``python -c`` in a copy of
the run folder.  Before it runs only a prelude that defines the resume objects the repair is documented to
expect (:data:`ckptaudit.findings.repair_imports.RESUME_OBJECTS`: ``ckpt`` as the resume loads it,
``state_dict``, ``model``, ``optimizer``, ``scheduler`` built as the case's training built them), inside a
function, so that none of the prelude's imports reaches the repair.  After it, a check shows the repair did its
work (the load it was meant to unblock succeeds; the key, step or learning rate is right); the same check
without the repair fails, so the unit needed it.

Kinds whose ``{repair_code}`` is composed in code are listed in :data:`COMPOSED` with where each is run; a kind
whose repair cannot run as printed has none, and its next step says what to do in words.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

from ckptaudit import findings as F
from ckptaudit.findings.repair_imports import RESUME_OBJECTS, is_python
from ckptaudit.pipeline import audit_in_process

from .conftest import CASES, REPO
from .test_cases import case_config
from .test_repairs import SAMPLE

LOCAL_CASES = REPO / "tests" / "cases"

#: Kinds whose repair is composed in code (``{repair_code}``), and where each composed repair is run as printed.
COMPOSED = {
    "missing_scheduler_state": "here (run_findings._fast_forward)",
    "step_counter_reset": "here (state._step_repair and run_findings._reset)",
    "resume_key_missing": "tests/test_required_keys.py (Lightning's own resume of the repaired copy)",
    "resume_entry_damaged": "shell (cp -p && mv): tests/test_resume_hint.py",
    "resume_entry_weights_only": "shell (cp -p && mv), the same composition: tests/test_resume_hint.py",
    "missing_step": "none: the step cannot be known from the unit; the next step says so in words (here)",
}

# The handed cases' model (expected.json ``model_config``: vocab, ctx, d, n_layer, n_head), by the keys and
# shapes their state dicts hold; lm_head is tied to wte (both keys share one storage in the saved dicts).
GPT = '''
class Block(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.qkv, self.proj = torch.nn.LayerNorm(d), torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.ln2, self.fc, self.fc2 = torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

class GPT(torch.nn.Module):
    def __init__(self, vocab, ctx, d, n_layer, n_head):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, d), torch.nn.Embedding(ctx, d)
        self.h = torch.nn.ModuleList(Block(d) for _ in range(n_layer))
        self.ln_f, self.lm_head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab, bias=False)
        self.wte.weight = self.lm_head.weight
'''

# The handed state cases' schedule, read back from the learning rates they saved (LambdaLR over base 0.003):
# 0.25x at last_epoch 0 (state_step_reset), 0.96194x at 6 (prefix_module_ddp): linear warm-up over 4 steps,
# then a half cosine over 16.
CASE_LAMBDA = ("lambda e: (e + 1) / 4 if e < 4 else 0.5 * (1 + math.cos(math.pi * (e - 4) / 16))")


@dataclass
class Run:
    """A run folder to audit, the unit whose repair is run, the audit config and what to run around it."""

    run: Path
    unit: str
    kind: str
    prelude: str  # body of a function returning {name: object} of the resume objects ("" : none)
    check: str  # Python that raises unless the repair did its work
    cfg: Optional[dict] = None
    before: Optional[str] = None  # what fails before the repair (default: ``check``)


def _script(prelude: str, repair: str, check: str) -> str:
    head = ""
    if prelude:
        head = ("def _resume():\n" + textwrap.indent(textwrap.dedent(prelude).strip() + "\n", "    ")
                + "globals().update(_resume())\ndel _resume\n")
    return head + repair + "\n" + textwrap.dedent(check)


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)


def _copy_case(root: Path, name: str, tmp: Path) -> Path:
    dst = tmp / name
    shutil.copytree(root / name, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _case_cfg(run: Path) -> dict:
    exp = run / "expected.json"
    return case_config(json.loads(exp.read_text())) if exp.exists() else {}


# ------------------------------------------------------------------ the units


def _prefix(tmp: Path, name: str) -> Run:
    run = _copy_case(CASES, name, tmp)
    cfg = json.loads((run / "expected.json").read_text())["model_config"]
    return Run(run, "ckpt.pt", "key_prefix_mismatch",
               prelude=f"""
                   import torch
                   {textwrap.indent(GPT, '                   ').strip()}
                   ckpt = torch.load("ckpt.pt", weights_only=True)
                   return {{"ckpt": ckpt, "state_dict": ckpt["model"], "model": GPT(**{cfg!r})}}
               """,
               check="""
                   import torch
                   model.load_state_dict(state_dict)  # strict: raises with every key missing before the repair
                   assert torch.equal(model.h[1].fc2.weight, ckpt["model"][next(k for k in ckpt["model"]
                                                                                 if k.endswith("h.1.fc2.weight"))])
               """)


def _tied(tmp: Path) -> Run:
    run = _copy_case(CASES, "tied_weights_dedup_safetensors", tmp)
    cfg = json.loads((run / "expected.json").read_text())["model_config"]
    return Run(run, "model.safetensors", "tied_weight_alias_missing",
               prelude=f"""
                   import torch
                   {textwrap.indent(GPT, '                   ').strip()}
                   return {{"model": GPT(**{cfg!r})}}
               """,
               check="""
                   import torch
                   from safetensors.torch import load_file
                   saved = load_file("model.safetensors")
                   for k, v in model.state_dict().items():
                       assert torch.equal(v, saved[k if k in saved else "lm_head.weight"]), k
                   assert model.wte.weight is model.lm_head.weight
               """,
               before="""
                   from safetensors.torch import load_file
                   model.load_state_dict(load_file("model.safetensors"))  # strict: wte.weight is missing
               """)


_LOADS = """
    import torch
    ckpt = torch.load({unit!r}, weights_only=True)
    assert {key!r} in ckpt, sorted(ckpt)
"""


def _benign_case(tmp: Path, name: str) -> Run:
    run = _copy_case(CASES, name, tmp)
    return Run(run, "ckpt.pt", "non_allowlisted_global_benign", prelude="",
               check=_LOADS.format(unit="ckpt.pt", key="model"))


def _hf_rng_state(tmp: Path) -> Run:
    """The HF Trainer's ``rng_state.pth`` (numpy's RNG state as an ndarray), loaded by itself outside the
    Trainer, whose own loader allows these globals: plain torch.load(weights_only=True) refuses it."""
    src = next(LOCAL_CASES.glob("fw_hf_trainer_*/checkpoint-*/rng_state.pth"))
    run = tmp / "hf_rng"
    run.mkdir()
    shutil.copyfile(src, run / "rng_state.pth")
    return Run(run, "rng_state.pth", "non_allowlisted_global_benign", prelude="",
               check=_LOADS.format(unit="rng_state.pth", key="numpy") + "    assert len(ckpt['numpy'][1]) == 624\n")


def _whole_module(tmp: Path) -> Run:
    """``torch.save`` of a dict holding the model object itself (the framework's class, importable here)."""
    run = tmp / "whole"
    run.mkdir()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    torch.save({"model": net, "step": 5}, run / "ckpt_000005.pt")
    return Run(run, "ckpt_000005.pt", "whole_module_pickle", prelude="",
               check="""
                   import torch
                   sd = torch.load("ckpt_000005.pt.state_dict.pt", weights_only=True)
                   net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
                   net.load_state_dict(sd["model"])
                   assert sd["step"] == 5 and net[0].weight.shape == (2, 3)
               """,
               before="""
                   import torch
                   torch.load("ckpt_000005.pt", weights_only=True)  # refused: it pickles the modules
               """)


_CASE_RESUME = """
    import math, torch
    {gpt}
    ckpt = torch.load("ckpt.pt", weights_only=True)
    model = GPT(**{cfg!r})
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, {lam})
    return {{"ckpt": ckpt, "model": model, "optimizer": optimizer, "scheduler": scheduler}}
"""


def _scheduler_missing(tmp: Path) -> Run:
    run = _copy_case(CASES, "state_scheduler_missing", tmp)
    cfg = json.loads((run / "expected.json").read_text())["model_config"]
    return Run(run, "ckpt.pt", "missing_scheduler_state",
               prelude=_CASE_RESUME.format(gpt=textwrap.indent(GPT, "    ").strip(), cfg=cfg, lam=CASE_LAMBDA),
               check="""
                   import math
                   optimizer.load_state_dict(ckpt["optimizer"])
                   saved = ckpt["optimizer"]["param_groups"][0]["lr"]
                   assert scheduler.last_epoch == ckpt["step"] == 6, scheduler.last_epoch
                   assert abs(scheduler.get_last_lr()[0] - saved) <= 1e-12, (scheduler.get_last_lr(), saved)
                   scheduler.step()  # the next step's LR is the schedule's at 7, as the uninterrupted run had it
                   assert abs(optimizer.param_groups[0]["lr"] - 0.003 * 0.5 * (1 + math.cos(math.pi * 3 / 16))) < 1e-12
               """)


def _step_reset(tmp: Path) -> Run:
    run = _copy_case(CASES, "state_step_reset", tmp)
    return Run(run, "ckpt.pt", "step_counter_reset",
               prelude="""
                   import torch
                   return {"ckpt": torch.load("ckpt.pt", weights_only=True)}
               """,
               check="""
                   steps = {int(s["step"]) for s in ckpt["optimizer"]["state"].values()}
                   assert steps == {ckpt["step"]} == {6}, (steps, ckpt["step"])
               """)


_LAM = "lambda e: (e + 1) / 25"  # a warm-up over the whole run: every step has its own LR


def _scheduler_reset(tmp: Path) -> Run:
    """A run whose job rebuilt its LambdaLR fresh after step 16 (the scheduler's state was not restored): the
    units from 16 on save last_epoch 0, 2, 4 while the step goes on; the run's other units show one scheduler
    step per optimizer step, so the audit prints the counters to restore."""
    run = tmp / "sched_reset"
    run.mkdir()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    lam = eval(_LAM)  # noqa: S307 - the same text the prelude runs
    sch = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    for step in range(1, 21):
        model(torch.randn(2, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sch.step()
        if step == 16:
            sch = torch.optim.lr_scheduler.LambdaLR(opt, lam)
        if step % 2 == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sch.state_dict(),
                        "step": step}, run / f"ckpt_{step:06d}.pt")
    return Run(run, "ckpt_000016.pt", "step_counter_reset",
               prelude=f"""
                   import torch
                   model = torch.nn.Linear(4, 4)
                   optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
                   scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, {_LAM})
                   ckpt = torch.load("ckpt_000016.pt", weights_only=True)
                   return {{"ckpt": ckpt, "model": model, "optimizer": optimizer, "scheduler": scheduler}}
               """,
               check="""
                   model.load_state_dict(ckpt["model"])
                   optimizer.load_state_dict(ckpt["optimizer"])
                   scheduler.load_state_dict(ckpt["scheduler"])
                   optimizer.step()
                   scheduler.step()  # step 17 trains at the schedule's LR for 17, as the uninterrupted run would
                   assert scheduler.last_epoch == 17, scheduler.last_epoch
                   assert abs(optimizer.param_groups[0]["lr"] - 1e-2 * 18 / 25) < 1e-12, optimizer.param_groups[0]["lr"]
               """)


UNITS: dict = {
    "key_prefix_mismatch[module.]": lambda t: _prefix(t, "prefix_module_ddp"),
    "key_prefix_mismatch[_orig_mod.]": lambda t: _prefix(t, "prefix_orig_mod_compile"),
    "tied_weight_alias_missing": _tied,
    **{f"non_allowlisted_global_benign[{c}]": (lambda c: lambda t: _benign_case(t, c))(c)
       for c in ("version_argparse_namespace", "version_lightning_hparams", "version_numpy_scalar",
                 "version_torch_version_object")},
    "non_allowlisted_global_benign[hf_rng_state.pth]": _hf_rng_state,
    "whole_module_pickle": _whole_module,
    "missing_scheduler_state": _scheduler_missing,
    "step_counter_reset[step]": _step_reset,
    "step_counter_reset[scheduler.last_epoch]": _scheduler_reset,
}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_printed_repair_runs_in_a_fresh_interpreter(name, tmp_path):
    r: Run = UNITS[name](tmp_path)
    v = audit_in_process(r.run, r.cfg if r.cfg is not None else _case_cfg(r.run), out_dir=tmp_path / "out")
    printed = json.loads((tmp_path / "out" / "verdict.json").read_text())
    assert printed["units"] == v["units"]
    unit = next(u for u in printed["units"] if u["unit"] == r.unit)
    f = next(f for f in unit["findings"] if f["kind"] == r.kind)
    repair = f["repair"]
    assert repair and is_python(repair), repair
    assert not r.prelude or "return" in r.prelude
    # the unit needs it: the check fails without the repair
    without = _python(_script(r.prelude, "", r.before or r.check), r.run)
    assert without.returncode != 0, f"{name}: the check passes without the repair"
    done = _python(_script(r.prelude, repair, r.check), r.run)
    assert done.returncode == 0, f"{name}: the repair as printed failed:\n{repair}\n{done.stderr[-3000:]}"


def test_each_python_repair_of_the_catalogue_is_run_here_or_named():
    """A new kind with a Python repair must get a unit above (or a line in COMPOSED): none goes unrun."""
    composed = {k for k, e in F.CATALOGUE.items() if e.repair == "{repair_code}"}
    assert composed == set(COMPOSED), composed ^ set(COMPOSED)
    templates = {k for k, e in F.CATALOGUE.items() if e.repair and e.repair != "{repair_code}"
                 and is_python(F.make(k, **SAMPLE).repair)}
    run_here = {n.split("[")[0] for n in UNITS}
    assert templates <= run_here, templates - run_here
    assert {k for k, how in COMPOSED.items() if how.startswith("here")} <= run_here


def test_the_prelude_defines_only_resume_objects():
    """What a repair may take for granted is what the prelude defines: nothing else leaks in (torch included)."""
    got = _python(_script("import torch\nreturn {'ckpt': {'step': 1}}", "print(sorted(k for k in globals() "
                                                                         "if not k.startswith('__')))", ""), REPO)
    assert got.returncode == 0 and got.stdout.strip() == "['ckpt']", got.stdout + got.stderr
    assert {"ckpt", "model", "optimizer", "scheduler", "state_dict"} == set(RESUME_OBJECTS)


def test_a_unit_without_a_step_gets_the_step_in_words(tmp_path):
    """``missing_step``: which step a unit was saved at cannot be computed from a unit that records none, so
    the finding prints no repair and its next step says to set it from the training log."""
    m = torch.nn.Linear(3, 2)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    s = torch.optim.lr_scheduler.StepLR(o, 2)
    torch.save({"model": m.state_dict(), "optimizer": o.state_dict(), "scheduler": s.state_dict()},
               tmp_path / "ckpt.pt")
    v = audit_in_process(tmp_path, {}, out_dir=tmp_path.parent / "out")
    f = next(f for f in v["units"][0]["findings"] if f["kind"] == "missing_step")
    assert f["repair"] == "" and f["next_step"] == "Set the step when resuming; check it against the training log."
