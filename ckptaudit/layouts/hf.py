"""Hugging Face layouts: sharded weights with an index, and Trainer folders.

Format facts (transformers docs, "Sharded checkpoints"; modeling_utils.py):
``model.safetensors.index.json`` / ``pytorch_model.bin.index.json`` hold
``{"metadata": {"total_size": bytes}, "weight_map": {tensor: shard file}}``.
A Trainer ``checkpoint-N/`` folder holds the weights (``model.safetensors``,
sharded or not, or ``pytorch_model.bin``), ``optimizer.pt``, ``scheduler.pt``,
``rng_state.pth`` (``rng_state_<rank>.pth`` with several processes),
``trainer_state.json`` (with ``global_step``) and ``training_args.bin``
(transformers trainer.py ``_save_checkpoint``); ``scaler.pt`` with fp16 AMP.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import List, Optional

from .. import confine
from .. import findings as F
from .. import fs
from . import leftovers
from .base import UnitScan, scan_file

INDEX_RE = re.compile(r".*\.index\.json$")
TEMP_RE = re.compile(r"^\.tmp[A-Za-z0-9_]{6,}$")  # tempfile.mkstemp(prefix=".tmp") names


class HFIndex:
    name = "hf-sharded"

    def claim_dir(self, path: Path) -> bool:
        return False

    def is_index(self, name: str) -> bool:
        return INDEX_RE.match(name) is not None

    def claim_index(self, root: Path, d: Path, names: List[str]):
        """Units for each ``*.index.json`` among ``names`` in folder ``d`` (with the shards it names).  The caller
        passes only names it may open (:mod:`ckptaudit.discovery`: an index that is a FIFO is never read) and
        sets aside the shards it must not (a FIFO shard: ``ckptaudit.discovery._set_aside``)."""
        from ..units import Unit, step_from_name

        units = []
        name_set = set(names)  # looked up once per shard: a set, so an index of many shards stays linear
        if (d / "trainer_state.json").exists() and d != root:
            return units  # part of a Trainer folder, which is its own unit
        for n in names:
            if not INDEX_RE.match(n):
                continue
            p = d / n
            shards: List[str] = []
            try:
                doc = fs.loads_json(fs.read_bounded(p, fs.SMALL_FILE_BYTES))
                wm = doc.get("weight_map", {}) if isinstance(doc, dict) else {}
                # a name that is not a file inside this folder is never looked up (check_index says index_invalid)
                shards = sorted({v for v in wm.values() if not shard_name_problem(v)}) if isinstance(wm, dict) else []
            except (OSError, ValueError):
                pass
            files = [fs.relpath(p, root)]
            missing = []
            size = p.stat().st_size
            mtime = p.stat().st_mtime_ns
            for s in shards:
                sp = d / s
                if confine.resolved_outside(root, s, fs.relpath(d, root)):
                    continue  # never looked at: check_index reports path_outside_run
                if sp.exists():
                    files.append(fs.relpath(sp, root))
                    st = sp.stat()
                    size += st.st_size
                    mtime = max(mtime, st.st_mtime_ns)
                else:
                    missing.append(fs.relpath(sp, root))
            sidecars = [fs.relpath(d / (Path(f).name + ".sha256"), root) for f in files
                        if Path(f).name + ".sha256" in name_set]
            units.append(Unit(unit=fs.relpath(p, root), layout=self.name, kind="index", files=files, size_bytes=size,
                              mtime_ns=mtime, step_from_name=step_from_name(d.name) if d != root else None,
                              sidecars=sidecars, missing_files=missing))
        return units

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        index_rel = unit["files"][0]
        check_index(run_dir, index_rel, scan, cfg, unit_name=unit["unit"], byte_facts=byte_facts)
        return scan


def check_index(run_dir: Path, index_rel: str, scan: UnitScan, cfg: dict, unit_name: str,
                byte_facts=None) -> None:
    """Check an index and every shard it names; shards' tensors go into ``scan``."""
    base = Path(index_rel).parent
    scan.files_checked.append(index_rel)
    read = read_index(run_dir, index_rel, scan, None if byte_facts is None else byte_facts.kept)
    if read is None:
        return
    doc, wm, outside = read
    for s in sorted(outside):
        scan.add(confine.path_outside_run(index_rel, s, outside[s], "transformers would load its tensors from there"))
    by_shard = {}
    for t, s in wm.items():
        if s not in outside:
            by_shard.setdefault(s, []).append(t)
    missing = [s for s in sorted(by_shard) if not (run_dir / base / s).exists()]
    for s in sorted(by_shard):
        if s not in missing and (why := _not_a_shard_file(run_dir, base / s)):  # a folder, a FIFO, a device
            scan.add(leftovers.irregular(str((base / s).as_posix()) if str(base) != "." else s, why))
            missing.append(s)
    for s in missing:
        scan.add(F.make("index_references_missing_shard", path=index_rel, shard=s, n_tensors=len(by_shard[s]),
                        shards=", ".join(missing)))
    for s in sorted(by_shard):
        if s not in missing:
            check_shard(run_dir, index_rel, s, by_shard[s], scan, cfg, unit_name, byte_facts)
    meta = doc.get("metadata")
    scan.facts["index_total_size"] = meta.get("total_size") if isinstance(meta, dict) else None
    scan.facts["n_shards"] = len(by_shard)
    scan.tree["weights"] = {"__index__": index_rel, "n_tensors": len(wm)}


def _not_a_shard_file(run_dir: Path, rel: Path) -> str:
    """Why the shard at ``rel`` (in ``run_dir``, present) is never opened: a folder under a shard's name, or a
    FIFO, device or socket (:func:`~ckptaudit.layouts.leftovers.mode_reason`: a FIFO would block the ``open``, a
    device never ends); "" for a regular file.  Judged from ``stat`` alone: nothing is opened."""
    p = run_dir / rel
    if p.is_dir():
        return "the index names it as a shard, but it is a folder, not a file"
    if fs.is_remote(run_dir) or p.is_file():
        return ""
    try:
        return leftovers.mode_reason(p, os.stat(p).st_mode) or ""
    except OSError as e:
        return f"it cannot be examined ({e.strerror})"


def read_index(run_dir: Path, index_rel: str, scan: UnitScan, kept=None) -> Optional[tuple]:
    """``(document, weight_map, {shard: where it leads} for shards outside the run)`` of an index, or None after
    ``index_invalid`` (unreadable, no ``weight_map`` object, a value that cannot name a shard file).
    Confinement first: a shard that resolves outside the run (absolute, "..", a link, a linked folder) is
    reported where it points and never opened (:mod:`ckptaudit.confine`).  ``kept``: bytes of remote objects
    already read (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
    base = Path(index_rel).parent
    try:
        doc = fs.loads_json(fs.read_bounded(run_dir / index_rel, fs.SMALL_FILE_BYTES, kept=kept))
        wm = doc["weight_map"]
        if not isinstance(wm, dict):
            raise ValueError("weight_map is not an object")
        outside = {v: real for v in {v for v in wm.values() if isinstance(v, str) and v and "\0" not in v}
                   if (real := confine.resolved_outside(run_dir, v, str(base)))}
        bad = next(((t, v, why) for t, v in wm.items() if not (isinstance(v, str) and v in outside)
                    and (why := shard_name_problem(v))), None)
        if bad is not None:
            t, v, why = bad
            shown = repr(v) if len(repr(v)) <= 80 else repr(v)[:80] + "…"
            raise ValueError(f"weight_map names {shown} as the shard of tensor {t[:80]!r}: {why}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        scan.add(F.make("index_invalid", path=index_rel, why=f"{type(e).__name__}: {e}"))
        return None
    return doc, wm, outside


def check_shard(run_dir: Path, index_rel: str, shard: str, tensors: list, scan: UnitScan, cfg: dict, unit_name: str,
                byte_facts=None) -> None:
    """Scan one shard the index names (its tensors go into ``scan``) and report up to 20 of the ``tensors`` the
    index maps to it that it does not hold (``index_tensor_not_in_shard``)."""
    base = Path(index_rel).parent
    rel = str((base / shard).as_posix()) if str(base) != "." else shard
    info = scan_file(run_dir, rel, unit_name, scan, cfg, tree_key=rel, byte_facts=byte_facts)
    if info.get("header"):
        names = {k for k in info["header"] if k != "__metadata__"}
    elif isinstance(info.get("obj"), dict):
        names = {str(k) for k in info["obj"]}
    else:
        return
    for t in sorted(set(tensors) - names)[:20]:
        scan.add(F.make("index_tensor_not_in_shard", path=index_rel, tensor=t, shard=shard))


#: Longest file-name component most filesystems store (NAME_MAX), bytes.
_NAME_MAX = 255


def shard_name_problem(name) -> str:
    """Why a ``weight_map`` value cannot be a shard file of the index's own folder; "" when it can.

    transformers joins the index's folder and the value (``os.path.join``), so an absolute path or
    ``..`` would read a file outside the checkpoint (``/dev/zero`` never ends), and a value that is no
    string, is empty, holds a NUL byte or a component longer than a file name, names no file at all."""
    if not isinstance(name, str):
        return f"it is a JSON {type(name).__name__}, not a file name"
    if not name:
        return "it is empty"
    if name.startswith("/"):
        return "it is an absolute path; a shard is a file name relative to the index's folder"
    if "\0" in name:
        return "it holds a NUL byte"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "it leaves the index's folder or names a folder ('', '.' or '..' in the path)"
    if any(len(p.encode("utf-8", "surrogatepass")) > _NAME_MAX for p in parts):
        return f"a path component is longer than {_NAME_MAX} bytes, which no file name can be"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid UTF-8 (a lone surrogate escape)"
    return ""


class HFTrainer:
    name = "hf-trainer"

    def claim_dir(self, path: Path) -> bool:
        return re.fullmatch(r"checkpoint-\d+", path.name) is not None or (path / "trainer_state.json").exists()

    def scan(self, run_dir: Path, unit: dict, cfg: dict, byte_facts=None) -> UnitScan:
        scan = UnitScan(unit["unit"], self.name)
        kept = None if byte_facts is None else byte_facts.kept  # every read answers from the pass's bytes first
        files = unit["files"]
        names = {Path(f).name: f for f in files}
        index = [f for f in files if INDEX_RE.match(Path(f).name)]
        claimed = set()
        if index:
            check_index(run_dir, index[0], scan, cfg, unit_name=unit["unit"], byte_facts=byte_facts)
            claimed.update(scan.files_checked)
        temps = [f for f in files if TEMP_RE.match(Path(f).name)]
        for f in temps:
            scan.add(leftovers.in_progress(f, "a temporary file of a write-then-rename (safetensors and transformers 5 "
                                              "write model.safetensors through a dot-prefixed .tmpXXXXXXXX) that was "
                                              "never renamed"))
        for f in files:
            n = Path(f).name
            if f in temps:
                continue
            if f in claimed or n.endswith((".json", ".txt", ".md", ".model", ".jinja")) and n not in (
                    "trainer_state.json", "config.json"):
                continue
            if n == "config.json":  # the model configuration, compared with expected_model_args
                scan.files_checked.append(f)
                cfg_doc = _read_json(run_dir / f, kept=kept)
                if isinstance(cfg_doc, dict):
                    scan.tree["config.json"] = cfg_doc
                continue
            if n == "trainer_state.json":
                scan.files_checked.append(f)
                self.read_trainer_state(run_dir, f, scan, kept)
                continue
            extra = ["transformers.training_args.TrainingArguments"] if n == "training_args.bin" else []
            scan_file(run_dir, f, unit["unit"], scan, cfg, extra_allowed=extra, tree_key=n,
                      byte_facts=byte_facts)
        self.completeness(unit["unit"], names, bool(index), scan)
        return scan

    def read_trainer_state(self, run_dir: Path, f: str, scan: UnitScan, kept=None) -> None:
        """``trainer_state.json``'s step, epoch, best metric and the loss logged last at or before the step into
        the scan's tree; ``state_file_unreadable`` when it is no JSON object or its ``global_step`` is not a
        non-negative integer (``Trainer.train`` computes the epochs and batches to skip from it).  ``kept``: bytes
        of remote objects already read (:class:`ckptaudit.fs.kept.KeptBytes`), answered from memory."""
        n = Path(f).name
        try:
            st = fs.loads_json(fs.read_bounded(run_dir / f, fs.SMALL_FILE_BYTES, kept=kept))
            if not isinstance(st, dict):
                raise ValueError(f"the top level is a JSON {type(st).__name__}, not an object")
            gs = st.get("global_step", 0)
            if type(gs) is not int or gs < 0:
                shown = repr(gs) if len(repr(gs)) <= 40 else repr(gs)[:40] + "…"
                raise ValueError(f"global_step is {shown}, not a non-negative integer")
            scan.tree["trainer_state.json"] = {k: st.get(k) for k in ("global_step", "epoch", "best_metric",
                                                                      "best_model_checkpoint", "max_steps")}
            # the loss logged last at or before global_step (components reads it as the unit's loss)
            logged = [r for r in st.get("log_history") or [] if isinstance(r, dict) and "loss" in r
                      and isinstance(r.get("step"), int) and r["step"] <= gs]
            if logged:
                scan.tree["trainer_state.json"]["log_history"] = [
                    {"step": logged[-1]["step"], "loss": logged[-1]["loss"]}]
            scan.facts["global_step"] = st.get("global_step")
        except (OSError, ValueError) as e:
            scan.add(F.make("state_file_unreadable", path=f, name=n, why=f"{type(e).__name__}: {e}"[:200]))

    def completeness(self, unit: str, names: dict, has_index: bool, scan: UnitScan) -> None:
        """The Trainer files the unit lacks (``facts["trainer_missing"]``, judged by the state layer), and
        ``unit_file_missing`` when the weights are gone from a folder that holds the rest of a Trainer save."""
        has_weights = has_index or any(n in names for n in ("model.safetensors", "pytorch_model.bin",
                                                            "adapter_model.safetensors", "adapter_model.bin"))
        missing = []
        if not has_weights:
            missing.append("model weights (model.safetensors / pytorch_model.bin)")
            if "trainer_state.json" in names or "optimizer.pt" in names:
                scan.add(F.make("unit_file_missing", path=unit, file="model.safetensors or pytorch_model.bin",
                                why="a Trainer checkpoint folder holds the model weights beside optimizer.pt and "
                                    "trainer_state.json; they were deleted, never copied, or the save died first"))
        for need in ("optimizer.pt", "scheduler.pt", "trainer_state.json"):
            if need not in names:
                missing.append(need)
        if not any(n.startswith("rng_state") for n in names):
            missing.append("rng_state*.pth")
        # completeness is judged by the state layer (components), not here
        scan.facts["trainer_missing"] = missing
        scan.facts["trainer_files"] = sorted(names)


def _read_json(path: Path, limit: int = 1 << 20, kept=None):
    """A small JSON document (at most ``limit`` bytes), or None when unreadable or larger (``kept``: bytes of
    remote objects already read, answered from memory)."""
    try:
        if fs.size(path) > limit:
            return None
        with fs.open_binary(path, kept=kept) as fh:
            return fs.loads_json(fh.read(limit))
    except (OSError, ValueError):
        return None


INDEX = HFIndex()
TRAINER = HFTrainer()
