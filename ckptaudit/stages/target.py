"""The structure of the job that will resume, computed once per audit.

Sources, strongest first:

* ``model_factory: "package.module:function"`` — the team's own model code,
  called in a **fresh child process** inside ``with torch.device("meta")``
  (parameters get shapes and dtypes but no storage, so a 70B model costs no
  memory; torch docs, "Meta device").  A factory with a required positional
  parameter is called with ``expected_model_args``.
* ``reference`` — a checkpoint whose structure is known good, scanned
  statically like any unit (never unpickled).

The result, ``work/target.json``::

    {"source": "model_factory" | "reference" | "none", "detail": "...",
     "weights": {"wte.weight": {"__tensor__": "float32", "shape": [64, 32]}, ...} | null}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from . import job_args
from .._io import atomic_write


class TargetError(RuntimeError):
    """The target could not be built (bad factory path, factory raised, reference missing)."""


def _child(factory: str, model_args_json: str) -> None:
    """Runs in the child: build the model on the meta device, print its structure as JSON."""
    import importlib
    import inspect

    import torch

    mod_name, _, fn_name = factory.partition(":")
    if not mod_name or not fn_name:
        raise TargetError(f"model_factory {factory!r} is not 'package.module:function'")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    args = json.loads(model_args_json)
    required = [p for p in inspect.signature(fn).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    with torch.device("meta"):
        model = fn(args) if required else fn()
    sd = model.state_dict()
    out = {k: {"__tensor__": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)} for k, v in sd.items()}
    sys.stdout.write(json.dumps(out))


def from_factory(factory: str, model_args: Optional[dict] = None, timeout_seconds: float = 300) -> dict:
    """Weights structure of ``factory``'s model, built in a fresh child process.

    Raises :class:`TargetError` with the child's error when it fails.
    """
    cmd = [sys.executable, "-m", "ckptaudit.stages.target", "child", factory, json.dumps(model_args or {})]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_seconds,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd()] + sys.path)})
    except subprocess.TimeoutExpired as e:
        raise TargetError(f"model_factory {factory!r} did not finish in {timeout_seconds} s") from e
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TargetError(f"model_factory {factory!r} failed: {last}")
    return json.loads(p.stdout)


def build(cfg: dict) -> dict:
    """The target document for ``cfg`` (see the module docstring)."""
    if cfg.get("model_factory"):
        w = from_factory(cfg["model_factory"], cfg.get("expected_model_args") or {},
                         float((cfg.get("load") or {}).get("timeout_seconds", 300)))
        return {"source": "model_factory", "detail": cfg["model_factory"], "weights": w}
    if cfg.get("reference"):
        try:
            w = load_reference(cfg)
        except (OSError, ValueError) as e:
            raise TargetError(f"reference {cfg['reference']!r}: {e}") from e
        return {"source": "reference", "detail": cfg["reference"], "weights": w}
    return {"source": "none", "detail": "", "weights": None}


def write(cfg: dict, out: str) -> dict:
    doc = build(cfg)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, json.dumps(doc, sort_keys=True).encode())
    return doc


def parser() -> argparse.ArgumentParser:
    """``python -m ckptaudit.stages target write CONFIG_JSON OUT_JSON`` (the target rule) and
    ``… child FACTORY MODEL_ARGS_JSON`` (the meta-device child :func:`build` starts): every argument required."""
    return job_args.parser("python -m ckptaudit.stages target", "The structure of the job that will resume.", {
        "write": ("build work/target.json from the stage config (the target rule)",
                  [("CONFIG_JSON", "the stage config (work/config.json)"), ("OUT_JSON", "where target.json goes")]),
        "child": ("build the model on the meta device and print its structure (internal)",
                  [("FACTORY", '"package.module:function"'), ("MODEL_ARGS_JSON", "expected_model_args as JSON")]),
    })


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if a.command == "child":
        _child(a.factory, a.model_args_json)
        return 0
    with open(a.config_json) as f:
        cfg = json.load(f)
    try:
        write(cfg, a.out_json)
    except TargetError as e:
        print(f"ckptaudit: {e}", file=sys.stderr)
        return 1
    return 0


def load_reference(cfg: dict):
    """Weights structure {name: tensor desc} of ``cfg['reference']`` (scanned statically), or None."""
    ref = cfg.get("reference")
    if not ref:
        return None
    from .. import components as C
    from .. import discovery as inventory
    from ..components import weights_rows
    from .scan import scan_units

    p = Path(ref)
    if not p.exists():
        raise FileNotFoundError(f"reference checkpoint {ref} does not exist")
    if p.is_dir():
        units, _, _ = inventory.discover(p)
        root = p
        if not units:
            raise ValueError(f"reference {ref}: no checkpoint unit found")
        u = units[-1].to_dict()
    else:
        root = p.parent
        u = inventory._file_unit(root, p, [p.name]).to_dict()
        u["files"] = [p.name]
        u["unit"] = p.name
    scans, tensors, _ = scan_units(root, [u], {})
    s = scans[0]
    facts = json.loads(s["facts_json"])
    c = C.collect(s["layout"], json.loads(s["tree_json"]), facts)
    return weights_rows.complete(c, facts, tensors) or c.weights


if __name__ == "__main__":
    raise SystemExit(main())
