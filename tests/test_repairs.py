"""A repair is code the user can run as printed: it compiles and names nothing the audit does not know.

Every ``repair`` template of the finding catalogue, rendered with sample values, and every repair the
detectors compose in code (``{repair_code}``), is either a shell command (checked with ``bash -n``)
or Python that compiles and uses only: names it defines or imports itself, builtins, and the objects every
resume script holds (:data:`ckptaudit.findings.repair_imports.RESUME_OBJECTS`: ``ckpt``, the loaded
checkpoint; ``state_dict``; ``model``; ``optimizer``; ``scheduler``).  A module it uses by a dotted name
(``numpy.dtypes.Float64DType``) it imports first (``NameError: numpy`` otherwise), and every import names a
module installed here.  A helper the user does not have, such as ``make_scheduler``, fails this test.
Each Python repair is also run, as printed, against a unit that needs it: ``tests/test_repairs_run.py``.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import string
import subprocess

import pytest

from ckptaudit import findings as F
from ckptaudit import run_findings
from ckptaudit.stages import state
from ckptaudit.components import Components
from ckptaudit.findings.repair_imports import RESUME_OBJECTS

SHELL = {"cp", "echo", "ln", "truncate", "mv", "ckptaudit"}
KNOWN = set(dir(builtins)) | RESUME_OBJECTS

SAMPLE = {"path": "ckpt_000100.pt", "expected_bytes": 1234, "suggestion": "ckpt_000090.pt",
          "suggestion_text": "ckpt_000090.pt", "pointer": "latest",
          "prefix": "module.", "add_safe": "argparse.Namespace, numpy.dtype", "step": 100,
          "run_quoted": "'/runs/a b'", "manifest_quoted": "'/runs/a b/iter_0000030/integrity.json'",
          "aside_quoted": "'/runs/a b/iter_0000030/integrity.json.unusable'"}


def _fields(template: str) -> set:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def _templates():
    return sorted((k, e.repair) for k, e in F.CATALOGUE.items() if e.repair and _fields(e.repair) != {"repair_code"})


def _undefined(code: str) -> set:
    """Names the code reads that it never binds (imports, assignments, loop and comprehension targets)."""
    tree = ast.parse(code)
    bound, read = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (bound if isinstance(n.ctx, (ast.Store, ast.Del)) else read).add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.arg):
            bound.add(n.arg)
    return read - bound


def _imported(code: str) -> list:
    """The modules the code's ``import`` statements name (``import numpy.dtypes`` -> ``numpy.dtypes``)."""
    return [a.name for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Import) for a in n.names]


def _library_attributes(code: str) -> list:
    """Dotted names rooted at torch or safetensors (``torch.serialization.add_safe_globals``)."""
    out = []
    for n in ast.walk(ast.parse(code)):
        if isinstance(n, ast.Attribute):
            parts, x = [], n
            while isinstance(x, ast.Attribute):
                parts.append(x.attr)
                x = x.value
            if isinstance(x, ast.Name) and x.id in ("torch", "safetensors"):
                out.append(".".join([x.id] + parts[::-1]))
    return out


def check_repair(repair: str) -> None:
    assert "{" + "repair_code}" not in repair and "make_scheduler" not in repair, repair
    if repair.split()[0] in SHELL:
        r = subprocess.run(["bash", "-n", "-c", repair], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"{repair!r}: {r.stderr}"
        return
    compile(repair, "<repair>", "exec")
    unknown = _undefined(repair) - KNOWN
    assert not unknown, f"{repair!r} uses names no resume script has: {sorted(unknown)}"
    for mod in _imported(repair):
        assert importlib.util.find_spec(mod) is not None, f"{repair!r} imports {mod}, which is not a module"
    for dotted in _library_attributes(repair):
        root, *rest = dotted.split(".")
        obj = importlib.import_module(root)
        for i, part in enumerate(rest):
            if not hasattr(obj, part):
                obj = importlib.import_module(".".join([root] + rest[:i + 1]))
            else:
                obj = getattr(obj, part)


@pytest.mark.parametrize("kind,template", _templates(), ids=[k for k, _ in _templates()])
def test_catalogue_repair_runs_as_printed(kind, template):
    missing = _fields(template) - set(SAMPLE)
    assert not missing, f"{kind}: add sample values for {missing}"
    check_repair(F.make(kind, **SAMPLE).repair)


def _components(lrs, initial=True) -> Components:
    groups = [{"lr": lr, "params": [0], **({"initial_lr": 0.1} if initial else {})} for lr in lrs]
    return Components(optimizer={"state": {}, "param_groups": groups})


def test_composed_repairs_run_as_printed():
    composed = [
        run_findings._fast_forward(_components([0.05, 0.01]), 40, {}, []),
        run_findings._fast_forward(_components([0.05]), 40,
                                   {"a": {"scheduler_last_epoch": 2, "step": 10}}, ["a"]),
        run_findings._reset("ckpt_000040.pt", 3, "went back", 40, per_step=True).repair,
        state._step_repair("ckpt_000040.pt", "root:iter_num", 40),
        state._step_repair("ckpt_000040.pt", "root:train.state.step", 40),
    ]
    assert all(composed), composed
    for r in composed:
        check_repair(r)
    assert composed[1].startswith("for _ in range(8): scheduler.step()")
    # the audit does not know the code: no repair, the next step says it in words
    assert run_findings._fast_forward(_components([0.05], initial=False), 40, {}, []) == ""
    assert run_findings._reset("checkpoint-40", 3, "went back", 40, per_step=True).repair == ""
    assert state._step_repair("checkpoint-40", "trainer_state.json:global_step", 40) == ""


def test_the_checker_refuses_helpers_nobody_has():
    with pytest.raises(AssertionError, match="make_scheduler"):
        check_repair("scheduler = make_scheduler(optimizer, last_epoch=675 - 1)")
    with pytest.raises(AssertionError, match="build_optimizer"):
        check_repair("optimizer = build_optimizer(model)")
    with pytest.raises(SyntaxError):
        check_repair("ckpt['step'] = = 3")
    # the repair printed before issue 43: numpy used without its import (NameError: numpy as printed)
    with pytest.raises(AssertionError, match="numpy"):
        check_repair("import torch\ntorch.serialization.add_safe_globals([numpy._core.multiarray._reconstruct])")
    with pytest.raises(AssertionError, match="not a module"):
        check_repair("import torch.nn.Module")


def test_a_python_repair_is_printed_with_the_imports_its_names_need():
    f = F.make("non_allowlisted_global_benign", path="rng_state.pth", member="rng_state/data.pkl", benign="",
               allow="", add_safe="numpy._core.multiarray._reconstruct, numpy.dtype, numpy.dtypes.UInt32DType, "
                                  "numpy.ndarray, (dict, \"pytorch_lightning.utilities.parsing.AttributeDict\")")
    assert f.repair.splitlines()[:3] == ["import numpy._core.multiarray", "import numpy.dtypes",
                                         "import torch.serialization"]
    assert F.make("tied_weight_alias_missing", path="model.safetensors", alias="'a'", kept="'b'").repair == \
        "import safetensors.torch\nsafetensors.torch.load_model(model, 'model.safetensors')"
    # code that binds or may assume its names, and shell commands, are printed as they are
    for kind, vals in (("key_prefix_mismatch", {"prefix": "module.", "component": "'model'", "wrapper": "DDP"}),
                       ("dead_writer_leftovers", {"run_quoted": "'/runs/a'", "count": 1, "size": "1 B",
                                                  "examples": "x"})):
        f = F.make(kind, path="ckpt.pt", **vals)
        assert not f.repair.startswith("import"), f.repair
