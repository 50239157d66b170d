"""Reader side: load the unit the audit names as the rollback point, falling back past damaged ones.

Usage in a training script::

    from ckptaudit import safe_load_checkpoint
    ckpt = safe_load_checkpoint("out/")          # newest usable unit
    model.load_state_dict(ckpt["model"])         # the result indexes like the state
    start_step = ckpt.step

One judgement for reader and audit: the run is audited in this process by the
audit's own stages (:func:`ckptaudit.pipeline.audit_in_process`), in their
cheap-first order — the unit's name (an in-progress save is never used), the
bytes (empty, zero-filled, LFS pointer, zip central directory and every member's
CRC32, safetensors header), a static scan of every pickle (an import outside
``torch.load(weights_only=True)``'s allowlist and the known-benign list), SHA-256
against the sidecar or manifest, the isolated load test in a child process, the
structure, and the state layer (completeness, NaN/Inf in the weights) — and the
verdict's rollback unit is loaded with ``torch.load(path, map_location=…,
weights_only=True)``.  A unit without model weights is never returned.  Every
newer unit passed over is logged as a warning with its reason.

What a unit loads as (``ckpt.state``):

* a single file (``ckpt_000500.pt``, ``model.safetensors``): its object, as
  ``torch.load`` or ``safetensors.torch.load_file`` returns it;
* a Hugging Face sharded index (``model.safetensors.index.json`` + shards): one
  state_dict, the union of its shards (the index maps every tensor to one shard);
* a folder of plain files (``checkpoint-500/`` of the HF ``Trainer``, a
  ``ckptaudit.publish(folder=True)`` unit): a dict from each file's path inside the
  unit to its contents (``ckpt["optimizer.pt"]``, ``ckpt["trainer_state.json"]``).
  Torch and safetensors files are loaded as above, ``.json`` files parsed; files that
  are not training state (``training_args.bin``, a whole pickled ``TrainingArguments``
  that ``weights_only`` refuses; tokenizer files) are listed in ``ckpt.not_loaded``
  with why.
* torch.distributed.checkpoint, DeepSpeed and Megatron folders are resharded by their
  own framework, so they are only checked: ``safe_load_checkpoint(d, load=False)``
  returns the newest such unit that passes every check, with ``state`` None, for
  ``dcp.load(…, checkpoint_id=ckpt.path)`` or ``engine.load_checkpoint(…)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import fs

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
    not_loaded: Dict[str, str] = field(default_factory=dict)  # files of a folder unit left out, with why
    usable_for: str = "resume"  # the audit's judgement: "resume", or "warm-start" (weights only)

    def __getitem__(self, key):
        return self.state[key]

    def __contains__(self, key):
        return key in self.state

    def get(self, key, default=None):
        return self.state.get(key, default) if isinstance(self.state, dict) else default

    def keys(self):
        return self.state.keys()


# Layouts safe_load_checkpoint can turn into objects itself (see the module docstring).
FILE_LAYOUTS = ("torch-zip", "torch-legacy", "safetensors", "lightning")
FOLDER_LAYOUTS = ("hf-trainer", "ckptaudit-publish", "single-file")
INDEX_LAYOUTS = ("hf-sharded",)
# Files of a folder unit that are not training state (HF Trainer): never loaded.
NOT_STATE_FILES = {
    "training_args.bin": "the Trainer's arguments: a whole pickled TrainingArguments, which "
                         "torch.load(weights_only=True) refuses; load it with transformers if you need it",
}


def loadable(unit: dict) -> bool:
    """Whether :func:`safe_load_checkpoint` can load ``unit`` (an inventory unit dict) itself."""
    kind, layout = unit["kind"], unit["layout"]
    return ((kind == "file" and layout in FILE_LAYOUTS) or (kind == "folder" and layout in FOLDER_LAYOUTS)
            or (kind == "index" and layout in INDEX_LAYOUTS))


def check_unit(run_dir: Path, unit: dict, allow_globals: Sequence[str] = (), *, need_loadable: bool = True
               ) -> Optional[str]:
    """Why ``unit`` must not be used, or None when it passes every check short of loading.

    ``need_loadable`` (default) also refuses layouts :func:`safe_load_checkpoint` cannot
    load itself (torch.distributed.checkpoint, DeepSpeed, Megatron)."""
    from . import hashing
    from .layouts.scan import scan_units

    if unit.get("in_progress"):
        return f"in-progress save ({unit['in_progress']})"
    cfg = {"security": {"allow_globals": list(allow_globals)}}
    scans, _, _ = scan_units(run_dir, [unit], cfg)
    import json

    errs = [f for f in json.loads(scans[0]["findings_json"]) if f["severity"] == "error"]
    if errs:
        return f"{errs[0]['kind']}: {errs[0]['message']}"
    if need_loadable and not loadable(unit):
        return (f"layout {unit['layout']} is resharded by its own framework; call "
                "safe_load_checkpoint(..., load=False) to get the newest verified unit and load it with that framework")
    for row in hashing.hash_unit(run_dir, unit):
        bad = [f for f in json.loads(row["findings_json"]) if f["severity"] == "error"]
        if bad:
            return f"{bad[0]['kind']}: {bad[0]['message']}"
    return None


def _load_file(path: Path, layout: str, map_location: Any, benign: Sequence[str]) -> Any:
    import torch

    from .loadtest import _resolve_benign

    if layout == "safetensors" or path.name.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(str(path), device=str(map_location))
    with torch.serialization.safe_globals(_resolve_benign(list(benign))):
        return torch.load(path, map_location=map_location, weights_only=True)


def _load_unit(root: Path, ud: dict, map_location: Any, benign: Sequence[str]) -> tuple:
    """(state, not_loaded) of a unit that passed :func:`check_unit`; raises what the loaders raise."""
    import json

    from .formats.sniff import sniff

    if ud["kind"] == "file":
        return _load_file(root / ud["files"][0], ud["layout"], map_location, benign), {}
    if ud["kind"] == "index":
        state: Dict[str, Any] = {}
        for rel in ud["files"]:
            if not rel.endswith(".json"):
                state.update(_load_file(root / rel, "", map_location, benign))
        return state, {}
    state, not_loaded = {}, {}
    unit_root = root / ud["unit"]
    for rel in ud["files"]:
        p = root / rel
        inner = p.relative_to(unit_root).as_posix()
        if p.name in NOT_STATE_FILES:
            not_loaded[inner] = NOT_STATE_FILES[p.name]
        elif p.name.endswith(".json"):
            state[inner] = fs.loads_json(fs.read_bounded(p, fs.SMALL_FILE_BYTES))
        elif (kind := sniff(p).kind) in ("torch_zip", "torch_legacy", "safetensors"):
            state[inner] = _load_file(p, "safetensors" if kind == "safetensors" else "", map_location, benign)
        else:
            not_loaded[inner] = "not a torch or safetensors file"
    return state, not_loaded


def _step_of(state: Any, default: Optional[int]) -> Optional[int]:
    if isinstance(state, dict):
        for k in ("iter_num", "global_step", "step", "iteration"):
            if isinstance(state.get(k), int) and not isinstance(state.get(k), bool):
                return state[k]
        ts = state.get("trainer_state.json")
        if isinstance(ts, dict) and isinstance(ts.get("global_step"), int):
            return ts["global_step"]
    return default


def safe_load_checkpoint(ckpt_dir: str | Path, *, map_location: Any = "cpu",
                         allow_globals: Sequence[str] = (), load: bool = True,
                         logger: Optional[logging.Logger] = None,
                         audit_config: Optional[dict] = None) -> LoadedCheckpoint:
    """Load the unit the audit names as the rollback point of ``ckpt_dir``.

    One judgement for reader and audit: the run is audited in this process by the
    audit's own stages (:func:`ckptaudit.pipeline.audit_in_process`, cheap checks first:
    names, bytes and CRCs, static pickle scan, sidecar hashes, the isolated load test,
    structure, the state layer's completeness and non-finite scan), and the verdict's
    rollback unit is loaded — the newest unit usable for resume, else the newest usable
    for a warm start (``usable_for`` says which).  A unit without model weights is never
    returned.  ``audit_config`` holds keys of ``config/config.yaml`` for the resuming job
    (``expected_model_args``, ``target``, …; checked by
    :func:`ckptaudit.pipeline.check_config`, ``ValueError`` when outside the schema).

    Returns a :class:`LoadedCheckpoint` (what ``state`` holds per layout: module
    docstring).  With ``load=False`` nothing is unpickled or loaded here: the rollback
    unit of any layout is returned with ``state`` None (for DCP, DeepSpeed and Megatron
    folders, which their frameworks load).  ``step`` is the saved
    ``iter_num``/``global_step``/``step``/``iteration``, HF ``trainer_state.json``
    ``global_step``, else the step the audit found.  Raises :class:`NoUsableCheckpointError`
    (listing every unit newer than the rollback point, or every unit, and why) when the
    audit says retrain, when the rollback unit's layout needs ``load=False``, or when it
    fails to load here; ``FileNotFoundError`` when ``ckpt_dir`` does not exist.
    ``allow_globals`` lists extra ``"package.module.Name"`` types the caller trusts.
    """
    import json
    import tempfile

    from . import tables
    from .loadtest import explain
    from .pipeline import audit_in_process

    lg = logger or log
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{ckpt_dir}: no such checkpoint folder")
    cfg = dict(audit_config or {})
    cfg["security"] = {**(cfg.get("security") or {}),
                       "allow_globals": sorted({*((cfg.get("security") or {}).get("allow_globals") or []),
                                                *allow_globals})}
    with tempfile.TemporaryDirectory(prefix="ckptaudit-reader-") as td:
        v = audit_in_process(root, cfg, out_dir=td)
        inv = json.loads((Path(td) / "work" / "inventory.json").read_text())
        rows = {name: {r["unit"]: r for r in tables.read_rows(Path(td) / "tables" / f"{name}.parquet")}
                for name in ("scan", "state")}
    inv_units = {u["unit"]: u for u in inv["units"]}
    rollback, reasons = choose(v, inv_units, rows["state"])
    for e in v.get("resume_entries") or []:  # Lightning's last.ckpt: what ckpt_path="last" would load
        if not e.get("ok") and e.get("finding") and e["unit"] not in reasons:
            reasons[e["unit"]] = f"resume_entry_damaged: {e['finding']['message']} {e['finding']['next_step']}"
    for unit, why in reasons.items():
        lg.warning("safe_load_checkpoint: skipping %s: %s", unit, why)
    if rollback is None:
        raise NoUsableCheckpointError(str(ckpt_dir), reasons)
    ud = inv_units[rollback["unit"]]
    if load and not loadable(ud):
        reasons[ud["unit"]] = (f"layout {ud['layout']} is resharded by its own framework; call "
                               "safe_load_checkpoint(..., load=False) to get the verified unit and load it with "
                               "that framework")
        raise NoUsableCheckpointError(str(ckpt_dir), reasons)
    path = root / (ud["files"][0] if ud["kind"] == "file" else ud["unit"])
    state, not_loaded = None, {}
    if load:
        benign = list((rows["scan"].get(ud["unit"]) or {}).get("benign_globals") or []) + list(allow_globals)
        try:
            state, not_loaded = _load_unit(root, ud, map_location, benign)
        except Exception as e:  # noqa: BLE001 - the audit's choice failed here: say so, never guess another
            reasons[ud["unit"]] = f"load_failed: {explain(str(e))} ({type(e).__name__})"
            raise NoUsableCheckpointError(str(ckpt_dir), reasons) from e
    step = _step_of(state, rollback.get("step") if rollback.get("step") is not None else ud.get("step_from_name"))
    if reasons:
        lg.warning("safe_load_checkpoint: using %s (step %s) after skipping %d newer unit(s)",
                   ud["unit"], step, len(reasons))
    if rollback["usable_for"] != "resume":
        lg.warning("safe_load_checkpoint: %s is usable for %s only: load its weights and restart the optimizer",
                   ud["unit"], rollback["usable_for"])
    return LoadedCheckpoint(state=state, unit=ud["unit"], path=path, step=step, skipped=reasons,
                            not_loaded=not_loaded, usable_for=rollback["usable_for"])


def choose(verdict: dict, inv_units: Dict[str, dict], state_rows: Dict[str, dict]) -> tuple:
    """(rollback unit of ``verdict`` as a verdict unit dict or None, {newer unit: why it is passed over}).

    The verdict's own rule (:func:`ckptaudit.verdict.decide`: newest ``resume`` unit,
    else newest ``warm-start`` unit; ``verdict["units"]`` is in save order) over the
    units that also hold model weights (state layer ``has_weights``); reasons are listed
    newest first."""
    units = verdict["units"]
    no_weights = {u["unit"] for u in units if u["usable_for"] != "none"
                  and (state_rows.get(u["unit"]) or {}).get("has_weights") is not True}
    cands = [u for u in units if u["usable_for"] != "none" and u["unit"] not in no_weights]
    resume = [u for u in cands if u["usable_for"] == "resume"]
    rollback = resume[-1] if resume else (cands[-1] if cands else None)
    newer = units[units.index(rollback) + 1:] if rollback else units
    reasons: Dict[str, str] = {}
    for u in reversed(newer):
        reasons[u["unit"]] = _why_not(u, inv_units.get(u["unit"]) or {}, u["unit"] in no_weights)
    return rollback, reasons


_LAYER_ORDER = {"file": 0, "security": 1, "structure": 2, "state": 3}  # cheap first, as the stages run


def _why_not(u: dict, inv_unit: dict, no_weights: bool) -> str:
    """One line: why verdict unit ``u`` is not the rollback point."""
    if inv_unit.get("in_progress"):
        return f"in-progress save ({inv_unit['in_progress']})"
    errs = sorted((f for f in u["findings"] if f["severity"] == "error"),
                  key=lambda f: _LAYER_ORDER.get(f["layer"], 9))
    if errs:
        return f"{errs[0]['kind']}: {errs[0]['message']}"
    if no_weights:
        return "no_model_weights: the audit found no model weights in this unit (nothing to load)"
    if u["usable_for"] != "resume":
        capped = [f for f in u["findings"] if f.get("caps") not in (None, "resume")] or u["findings"]
        if capped:
            return f"usable for {u['usable_for']} only: {capped[0]['kind']}: {capped[0]['message']}"
        return f"usable for {u['usable_for']} only"
    return "not chosen by the audit"


__all__: List[str] = ["safe_load_checkpoint", "LoadedCheckpoint", "NoUsableCheckpointError", "check_unit",
                       "loadable"]
