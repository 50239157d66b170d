"""Reader side: load the newest checkpoint that verifies, falling back past damaged ones.

Usage in a training script::

    from ckptaudit import safe_load_checkpoint
    ckpt = safe_load_checkpoint("out/")          # newest usable unit
    model.load_state_dict(ckpt["model"])         # the result indexes like the state
    start_step = ckpt.step

Order of checks per unit, newest first, cheapest first: the unit's name (an
in-progress save is never used), the bytes (empty, zero-filled, LFS pointer,
zip central directory and every member's CRC32, safetensors header), a static
scan of every pickle (an import outside ``torch.load(weights_only=True)``'s
allowlist and the known-benign list skips the unit), SHA-256 against the
sidecar or manifest when there is one, and only then
``torch.load(path, map_location=…, weights_only=True)``.  Every skipped unit is
logged as a warning with its reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

log = logging.getLogger("ckptaudit")


class NoUsableCheckpointError(RuntimeError):
    """No unit in the folder passed the checks; ``reasons`` maps each unit to why."""

    def __init__(self, ckpt_dir: str, reasons: Dict[str, str]):
        self.ckpt_dir = ckpt_dir
        self.reasons = reasons
        lines = [f"{ckpt_dir}: no usable checkpoint ({len(reasons)} unit(s) checked)"]
        lines += [f"  {u}: {why}" for u, why in reasons.items()] or ["  (no checkpoint unit found)"]
        super().__init__("\n".join(lines))


@dataclass
class LoadedCheckpoint:
    """The loaded state plus where it came from.  ``ckpt["model"]`` reads the state."""

    state: Any
    unit: str
    path: Path
    step: Optional[int]
    skipped: Dict[str, str] = field(default_factory=dict)  # newer units passed over, with why

    def __getitem__(self, key):
        return self.state[key]

    def __contains__(self, key):
        return key in self.state

    def get(self, key, default=None):
        return self.state.get(key, default) if isinstance(self.state, dict) else default

    def keys(self):
        return self.state.keys()


def check_unit(run_dir: Path, unit: dict, allow_globals: Sequence[str] = ()) -> Optional[str]:
    """Why ``unit`` must not be loaded, or None when it passes every check before loading."""
    from . import hashing
    from .stages import scan_units

    if unit.get("in_progress"):
        return f"in-progress save ({unit['in_progress']})"
    cfg = {"security": {"allow_globals": list(allow_globals)}}
    scans, _, _ = scan_units(run_dir, [unit], cfg)
    import json

    errs = [f for f in json.loads(scans[0]["findings_json"]) if f["severity"] == "error"]
    if errs:
        return f"{errs[0]['kind']}: {errs[0]['message']}"
    if unit["kind"] != "file" or unit["layout"] not in ("torch-zip", "torch-legacy", "safetensors", "lightning"):
        return f"layout {unit['layout']} is not a single torch/safetensors file; load it with its framework"
    for row in hashing.hash_unit(run_dir, unit):
        bad = [f for f in json.loads(row["findings_json"]) if f["severity"] == "error"]
        if bad:
            return f"{bad[0]['kind']}: {bad[0]['message']}"
    unit["_benign"] = scans[0].get("benign_globals") or []
    return None


def safe_load_checkpoint(ckpt_dir: str | Path, *, map_location: Any = "cpu",
                         allow_globals: Sequence[str] = (), logger: Optional[logging.Logger] = None
                         ) -> LoadedCheckpoint:
    """Load the newest unit of ``ckpt_dir`` that passes every check.

    Returns a :class:`LoadedCheckpoint`.  Raises :class:`NoUsableCheckpointError`
    (listing every unit and why) when none passes, and ``FileNotFoundError``
    when ``ckpt_dir`` does not exist.  ``allow_globals`` lists extra
    ``"package.module.Name"`` types the caller trusts.
    """
    from . import inventory
    from .loadtest import _resolve_benign, explain

    lg = logger or log
    root = Path(ckpt_dir)
    units, _, _ = inventory.discover(root)
    reasons: Dict[str, str] = {}
    for u in sorted(units, key=lambda x: (x.step_from_name if x.step_from_name is not None else -1, x.unit),
                    reverse=True):
        ud = u.to_dict()
        why = check_unit(root, ud, allow_globals)
        if why is None:
            import torch

            path = root / ud["files"][0]
            try:
                if ud["layout"] == "safetensors":
                    from safetensors.torch import load_file

                    state = load_file(str(path), device=str(map_location))
                else:
                    benign = list(ud.get("_benign", [])) + list(allow_globals)
                    with torch.serialization.safe_globals(_resolve_benign(benign)):
                        state = torch.load(path, map_location=map_location, weights_only=True)
            except Exception as e:  # noqa: BLE001 - any load failure means "try the next unit"
                why = f"load_failed: {explain(str(e))} ({type(e).__name__})"
            else:
                step = u.step_from_name
                if isinstance(state, dict):
                    for k in ("iter_num", "global_step", "step", "iteration"):
                        if isinstance(state.get(k), int):
                            step = state[k]
                            break
                if reasons:
                    lg.warning("safe_load_checkpoint: using %s (step %s) after skipping %d newer unit(s)",
                               u.unit, step, len(reasons))
                return LoadedCheckpoint(state=state, unit=u.unit, path=path, step=step, skipped=dict(reasons))
        lg.warning("safe_load_checkpoint: skipping %s: %s", u.unit, why)
        reasons[u.unit] = why
    raise NoUsableCheckpointError(str(ckpt_dir), reasons)


__all__: List[str] = ["safe_load_checkpoint", "LoadedCheckpoint", "NoUsableCheckpointError", "check_unit"]
