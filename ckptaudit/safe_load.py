"""Reader side: load the unit the audit names as the rollback point, falling back past damaged ones.

Usage in a training script::

    from ckptaudit import safe_load_checkpoint
    ckpt = safe_load_checkpoint("out/")          # newest usable unit
    model.load_state_dict(ckpt["model"])         # the result indexes like the state
    start_step = ckpt.step

One judgement for reader and audit, paying for the unit it returns
(:func:`ckptaudit.newest_first.search`): every unit's metadata is checked by the
audit's own stages — the unit's name (an in-progress save is never used), zip
central directories and local headers, safetensors headers, a static scan of every
pickle (an import outside ``torch.load(weights_only=True)``'s allowlist and the
known-benign list), JSON state, structure, step and scheduler continuity across
the run — and then, newest first, the unit the audit's rule would choose is checked
byte by byte: SHA-256 against its sidecar, or the chunk digests of its manifest (a file
with no recorded digest is not SHA-256-hashed: with nothing to compare it finds no damage),
every zip record's CRC32, the load test, NaN/Inf in the weights.  A unit that fails is passed over and the next choice
is examined; tensor bytes of older units are never read.  The chosen unit is loaded with
``torch.load(path, map_location=…, weights_only=True)`` (``safetensors.torch.load_file``
for safetensors); for a torch zip or safetensors file with ``map_location="cpu"`` that load
*is* the load test, done once here (:mod:`ckptaudit.stages.load.reader`), and any other file is
load-tested first in a child process with time and memory limits.  A unit without model
weights is never returned.  Every newer unit passed over is logged as a warning with its
reason; ``ckpt.examined`` lists the units read byte by byte and ``ckpt.bytes_read`` what the
checks read.

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

from . import fs, producers
from .stages.load import whole_modules
from .stages.load.reader import load_file
from .terminal_text import shown, shown_lines

log = logging.getLogger("ckptaudit")


class NoUsableCheckpointError(RuntimeError):
    """No unit in the folder passed the checks; ``reasons`` maps each unit to why."""

    def __init__(self, ckpt_dir: str, reasons: Dict[str, str]):
        self.ckpt_dir = ckpt_dir
        self.reasons = reasons
        lines = [f"{ckpt_dir}: no usable checkpoint ({len(reasons)} unit(s) checked)"]
        lines += [f"  {u}: {why}" for u, why in reasons.items()] or ["  (no checkpoint unit found)"]
        super().__init__(shown_lines(lines))  # unit names and reasons come from the run


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
    examined: List[str] = field(default_factory=list)  # units whose every byte was checked, in that order
    bytes_read: int = 0  # bytes the checks read (ckptaudit.fs counters and load-test children), before the load

    def __getitem__(self, key):
        return self.state[key]

    def __contains__(self, key):
        return key in self.state

    def get(self, key, default=None):
        return self.state.get(key, default) if isinstance(self.state, dict) else default

    def keys(self):
        return self.state.keys()


# Layouts safe_load_checkpoint can turn into objects itself (see the module docstring).
FILE_LAYOUTS = ("torch-zip", "torch-legacy", "safetensors", *producers.reader_layouts("file"))
FOLDER_LAYOUTS = (*producers.reader_layouts("folder"), "ckptaudit-publish", "single-file")
INDEX_LAYOUTS = ("hf-sharded",)
# Files of a folder unit that are not training state (the producers say which): never loaded.
NOT_STATE_FILES = producers.NOT_STATE_FILES


def loadable(unit: dict) -> bool:
    """Whether :func:`safe_load_checkpoint` can load ``unit`` (an inventory unit dict) itself."""
    kind, layout = unit["kind"], unit["layout"]
    return ((kind == "file" and layout in FILE_LAYOUTS) or (kind == "folder" and layout in FOLDER_LAYOUTS)
            or (kind == "index" and layout in INDEX_LAYOUTS))


def _load_unit(root: Path, ud: dict, map_location: Any, benign: Sequence[str],
               kept: Optional[Dict[str, Any]] = None, pins: Optional[Dict[str, Any]] = None) -> tuple:
    """(state, not_loaded) of the unit the search chose (:func:`ckptaudit.newest_first.search`); ``kept``: files
    its load test already loaded here (relative path → object); ``pins``: each file's identity when its bytes
    were verified (:meth:`ckptaudit.stages.load.reader.ReaderLoads.pin`), which its load must find unchanged.
    Raises what the loaders raise, and ``ChangedSinceVerified`` (an ``OSError``) for a file that changed."""
    from .formats.sniff import sniff
    from .stages.load.reader import pinned

    pins = pins or {}
    if ud["kind"] == "file":
        rel = ud["files"][0]
        return load_file(root / rel, ud["layout"], map_location, benign, kept, rel, pins.get(rel)), {}
    if ud["kind"] == "index":
        state: Dict[str, Any] = {}
        for rel in ud["files"]:
            if not rel.endswith(".json"):
                state.update(load_file(root / rel, "", map_location, benign, kept, rel, pins.get(rel)))
        return state, {}
    state, not_loaded = {}, {}
    unit_root = root / ud["unit"]
    for rel in ud["files"]:
        p = root / rel
        inner = p.relative_to(unit_root).as_posix()
        if p.name in NOT_STATE_FILES:
            not_loaded[inner] = NOT_STATE_FILES[p.name]
        elif p.name.endswith(".json"):
            with pinned(p, pins.get(rel)) as (name, _):
                state[inner] = fs.loads_json(fs.read_bounded(name, fs.SMALL_FILE_BYTES))
        elif (kind := sniff(p).kind) in ("torch_zip", "torch_legacy", "safetensors"):
            state[inner] = load_file(p, "safetensors" if kind == "safetensors" else "", map_location, benign, kept,
                                      rel, pins.get(rel))
        else:
            not_loaded[inner] = "not a torch or safetensors file"
    return state, not_loaded


#: Where the reader's scratch stage tables go when ``TMPDIR`` does not say: a memory-backed folder.
SHM_ROOT = "/dev/shm"


def scratch_root() -> Optional[str]:
    """The folder for the search's scratch tables (a few small Parquet files per unit, removed on return):
    ``TMPDIR`` when set, else :data:`SHM_ROOT` when it is a writable folder, else the platform's temporary folder
    (None).  On a disk file system each table written, renamed over and removed cost milliseconds of metadata
    journaling (ext4: ~0.1-0.2 s of a 4-unit resume; issue 45), which a tmpfs does not pay."""
    import os

    if os.environ.get("TMPDIR"):
        return None
    return SHM_ROOT if os.path.isdir(SHM_ROOT) and os.access(SHM_ROOT, os.W_OK | os.X_OK) else None


def _step_of(state: Any, default: Optional[int]) -> Optional[int]:
    if isinstance(state, dict):
        for k in ("iter_num", "global_step", "step", "iteration"):
            if isinstance(state.get(k), int) and not isinstance(state.get(k), bool):
                return state[k]
        for name, path in producers.STEP_FILES:  # a folder unit's file that keeps the step
            v: Any = state.get(name)
            for k in path.split("."):
                v = v.get(k) if isinstance(v, dict) else None
            if isinstance(v, int) and not isinstance(v, bool):
                return v
    return default


def _reader_config(audit_config: Optional[dict], allow_globals: Sequence[str]) -> dict:
    """The caller's audit config with ``allow_globals`` added to ``security.allow_globals``."""
    cfg = dict(audit_config or {})
    sec = cfg.get("security") or {}
    cfg["security"] = {**sec, "allow_globals": sorted({*(sec.get("allow_globals") or []), *allow_globals})}
    return cfg


def _add_damaged_entries(v: dict, reasons: Dict[str, str]) -> None:
    """A resume entry of the verdict that is damaged (Lightning's last.ckpt: what ``ckpt_path="last"`` would
    load) among the units passed over, with its finding as the reason."""
    for e in v.get("resume_entries") or []:
        if not e.get("ok") and e.get("finding") and e["unit"] not in reasons:
            reasons[e["unit"]] = f"{e['finding']['kind']}: {e['finding']['message']} {e['finding']['next_step']}"


def safe_load_checkpoint(ckpt_dir: str | Path, *, map_location: Any = "cpu",
                         allow_globals: Sequence[str] = (), load: bool = True,
                         logger: Optional[logging.Logger] = None,
                         audit_config: Optional[dict] = None,
                         audit: Optional[str | Path] = None) -> LoadedCheckpoint:
    """Load the unit the audit names as the rollback point of ``ckpt_dir``.

    One judgement for reader and audit: the audit's stages judge every unit's metadata,
    then, newest first, the unit the audit's rule chooses is checked byte by byte (sidecar
    hashes, CRCs, the load test, the non-finite scan) until one passes
    (:func:`ckptaudit.newest_first.search`) — the newest unit usable for resume, else the
    newest usable for a warm start (``usable_for`` says which).  A unit without model weights is never
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
    fails to load here; ``FileNotFoundError`` when ``ckpt_dir`` does not exist.  ``ckpt_dir`` may be one unit
    (a checkpoint file, or a folder such as the HF Trainer's ``checkpoint-40/``): that unit is judged and returned.
    ``allow_globals`` lists extra ``"package.module.Name"`` types the caller trusts.

    ``audit``: the output folder of a finished audit of this run (``ckptaudit audit run --out
    <folder>``, e.g. last night's drill).  Its judgement stands for every unit it covered whose files
    are unchanged since (same names, sizes, mtimes and inodes); only new or changed units are read, and
    the unit returned is checked byte by byte again (its sidecar or manifest hashes, CRCs, load test)
    before it is loaded.  The audit's rows were made under the audit's own config.  ``FileNotFoundError``
    when the folder holds no finished audit, ``ValueError`` when it audited another run folder.
    """
    import tempfile

    from .stages.load.loadtest import child_bytes_read, explain
    from .newest_first import choose, search
    from .pipeline import merged_config

    lg = logger or log
    root = Path(ckpt_dir)
    if not root.exists():
        raise FileNotFoundError(f"{ckpt_dir}: no such checkpoint folder or file")
    cfg = _reader_config(audit_config, allow_globals)
    from .stages.load.reader import ReaderLoads

    loads = ReaderLoads(map_location) if load else None  # the load test of the examined units is the final load
    before, child0 = sum(fs.stage_bytes().values()), child_bytes_read()
    with tempfile.TemporaryDirectory(prefix="ckptaudit-reader-", dir=scratch_root()) as td:
        v, inv, rows, examined = search(root, merged_config(cfg), Path(td), audit=audit, loads=loads)
    read = sum(fs.stage_bytes().values()) - before + child_bytes_read() - child0
    lg.debug("safe_load_checkpoint: examined %s byte by byte; %d bytes read", shown(", ".join(examined) or "no unit"), read)
    inv_units = {u["unit"]: u for u in inv["units"]}
    rollback, reasons = choose(v, inv_units, rows["state"])
    _add_damaged_entries(v, reasons)
    for unit, why in reasons.items():
        lg.warning("safe_load_checkpoint: skipping %s: %s", shown(unit), shown(why))
    if rollback is None:
        raise NoUsableCheckpointError(str(ckpt_dir), reasons)
    ud = inv_units[rollback["unit"]]
    if load and not loadable(ud):
        reasons[ud["unit"]] = (f"layout {ud['layout']} is resharded by its own framework; call "
                               "safe_load_checkpoint(..., load=False) to get the verified unit and load it with "
                               "that framework")
        raise NoUsableCheckpointError(str(ckpt_dir), reasons)
    if load and whole_modules.in_verdict(v, ud["unit"]):  # weights_only=True refuses it by design
        reasons[ud["unit"]] = ("it pickles whole modules (whole_module_pickle), which torch.load(weights_only=True) "
                               "refuses; call safe_load_checkpoint(..., load=False) to get the verified unit and load "
                               "it with torch.load(ckpt.path, weights_only=False) where it and its classes' code are "
                               "trusted")
        raise NoUsableCheckpointError(str(ckpt_dir), reasons)
    root = Path(inv["run_dir"])  # the run folder: ckpt_dir's own folder when ckpt_dir is one unit
    path = root / (ud["files"][0] if ud["kind"] == "file" else ud["unit"])
    state, not_loaded = None, {}
    if loads is not None:
        benign = list((rows["scan"].get(ud["unit"]) or {}).get("benign_globals") or []) + list(allow_globals)
        try:
            state, not_loaded = _load_unit(root, ud, map_location, benign, loads.kept, loads.pins)
        except Exception as e:  # noqa: BLE001 - the audit's choice failed here: say so, never guess another
            reasons[ud["unit"]] = f"load_failed: {explain(str(e))} ({type(e).__name__})"
            raise NoUsableCheckpointError(str(ckpt_dir), reasons) from e
        loads.drop()
    step = _step_of(state, rollback.get("step") if rollback.get("step") is not None else ud.get("step_from_name"))
    if reasons:
        lg.warning("safe_load_checkpoint: using %s (step %s) after skipping %d newer unit(s)",
                   shown(ud["unit"]), step, len(reasons))
    if rollback["usable_for"] != "resume":
        lg.warning("safe_load_checkpoint: %s is usable for %s only: load its weights and restart the optimizer",
                   shown(ud["unit"]), rollback["usable_for"])
    return LoadedCheckpoint(state=state, unit=ud["unit"], path=path, step=step, skipped=reasons,
                            not_loaded=not_loaded, usable_for=rollback["usable_for"], examined=examined,
                            bytes_read=read)


__all__: List[str] = ["safe_load_checkpoint", "LoadedCheckpoint", "NoUsableCheckpointError",
                       "loadable"]
