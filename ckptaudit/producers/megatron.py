"""Megatron-LM and Megatron-Core: both checkpoint layouts beside ``latest_checkpointed_iteration.txt``.

Legacy (``--ckpt-format torch``): ``iter_<N>/mp_rank_<tp>[_<pp>]/model_optim_rng.pt``.  Source: Megatron-LM
``training/checkpointing.py`` (core_r0.x): one file per model-parallel rank holding the model, optimizer,
``opt_param_scheduler``, ``rng_state``, ``args`` and ``iteration``.  The tracker file holds the iteration number,
or ``release`` (``read_metadata``), and names the folder ``iter_<N:07d>`` (``get_checkpoint_name``).

Megatron-Core ``torch_dist`` (the default ``--ckpt-format``; NVIDIA/Megatron-LM ``core_v0.16.1``, the version the
fixtures ``tests/frameworks/fw_megatron_core.py`` run): ``iter_<N:07d>/`` is one ``dist_checkpointing.save``
(``megatron/core/dist_checkpointing/serialization.py:314-439``): ``common.pt`` (rank 0, ``torch.save`` of every
non-sharded value: ``args``, ``checkpoint_version``, ``iteration``, ``optimizer.param_groups`` and
``optimizer.state.common_step``, ``opt_param_scheduler``, ``num_floating_point_operations_so_far``,
``content_metadata``), a torch DCP save (``.metadata`` written last by rank 0 through ``.metadata.tmp``, every
rank's ``__<rank>_<n>.distcp``: the model's sharded keys, ``optimizer.state.<moment>.<param key>``
(``dist_checkpointing/optimizer.py:142``, ``make_sharded_optimizer_tensor`` prefix ``optimizer.state.{state_key}``),
``rng_state/shard_…`` and the layers' ``_extra_state/shard_…`` objects) and ``metadata.json`` (backend and
version, ``core.py:76``), then the tracker (``training/checkpointing.py:706-724``, rank 0, after a barrier).
Since commit 40b1fd37 (2026-07-08) ``common.pt`` is gone: the common state is the ShardedObject
``common_state/shard_0_1`` inside the DCP files (``serialization.py:431`` and ``load_common_state_dict``
:198-229 at d98e8a64).

Resume contract (``load_checkpoint``, checkpointing.py:1479-1928, and ``_load_base_checkpoint`` :1160-1330): the
tracker names the iteration (``--ckpt-step`` overrides it; no tracker: start from random); ``_get_checkpoint_format``
(:1134) needs ``metadata.json`` for ``torch_dist``; rank 0 loads the common state; then
``dist_checkpointing.load`` needs ``.metadata`` and every data file it lists.  There is no fallback to an older
iteration: a damaged named iteration fails the job.  Loaders: ``.metadata`` by ``pickle.load``
(torch ``FileSystemReader.read_metadata``, filesystem.py:926-936, no allowlist); ``common.pt`` by
``torch.load(path, map_location='cpu')`` (``strategies/common.py:89``), weights-only by default since torch 2.6,
with ``megatron/core/safe_globals.py``'s ``SAFE_GLOBALS`` added at import (``core/__init__.py:51``); the DCP byte
items by ``torch.load`` in DCP's load planner.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .contract import UNSAFE, Contract, FileRole, PointerFile, Producer, ResumeLoad
from .paths import base, join, parent

CONTRACT = Contract(
    producer="megatron", framework="Megatron-LM", versions="Megatron-LM core_r0.x",
    layouts=("megatron",), match_files=("model_optim_rng.pt",),
    files=(FileRole("model_optim_rng.pt", "mixed", UNSAFE),),
    keys={"weights": ("model",), "optimizer": ("optimizer",), "scheduler": ("opt_param_scheduler",),
          "rng": ("rng_state",), "metadata": ("args",)},
    step_at=("*:iteration",),
    saves=frozenset({"weights", "optimizer", "step"}),
)

def parallel_findings(path: str, facts: dict, target: dict) -> list:
    """Tensor- and pipeline-parallel sizes saved (``mp_rank_<tp>[_<pp>]`` folders) against the resuming job's
    (``target``'s ``tensor_parallel`` and ``pipeline_parallel``): Megatron loads one file per model-parallel rank."""
    from .. import findings as F

    out = []
    for what, key in (("tensor_model_parallel_size", "tensor_parallel"),
                      ("pipeline_model_parallel_size", "pipeline_parallel")):
        saved, want = facts.get(key), target.get(key)
        if saved and want and saved != want:
            out.append(F.make("model_parallel_mismatch", path=path, what=what, saved=saved, target=want))
    return out


TRACKER = "latest_checkpointed_iteration.txt"


def tracker_unit(text: str) -> str:
    """The folder the tracker's text names: ``iter_<N:07d>`` for an iteration number, ``release`` as is."""
    return f"iter_{int(text):07d}" if text.isdigit() else text


def tracker_text(unit: str) -> str:
    """What the tracker must hold to name the folder ``unit`` (a base name): its iteration number, or ``release``."""
    b = base(unit)
    return str(int(b[len("iter_"):])) if b.startswith("iter_") and b[len("iter_"):].isdigit() else b


def tracker_behind(pointer: dict, suggestion: str, text: str):
    """``megatron_tracker_behind``: the tracker names a usable iteration while a newer one (``suggestion``, named by
    ``text``) is usable too; Megatron's resume follows the tracker and repeats the iterations between."""
    from .. import findings as F

    return F.make("megatron_tracker_behind", path=pointer["path"], pointer=pointer["path"],
                  iteration=pointer.get("target") or "", suggestion=suggestion, suggestion_text=text)


def tracker_check(pointer: dict, suggestion: str):
    """``megatron_tracker_invalid`` for a tracker whose text is neither an iteration number nor ``release``
    (``read_metadata`` fails on it); ``suggestion``: the newest usable iteration's folder name."""
    from .. import findings as F

    text = pointer.get("target") or ""
    if text.isdigit() or text == "release":
        return None
    return F.make("megatron_tracker_invalid", path=pointer["path"], pointer=pointer["path"], content=text[:40],
                  suggestion=suggestion)


PRODUCER = Producer(key="megatron", name="Megatron-LM", layouts=("megatron",), folder_adapters=((20, "megatron:ADAPTER"),), contracts=(CONTRACT,),
                    parallel_findings=parallel_findings,
                    claim_files=("model_optim_rng.pt", "mp_rank_*"),
                    pointers=(PointerFile(TRACKER, "Megatron tracker file", tracker_unit, tracker_check, tracker_text,
                                          tracker_behind),),
                    pip_names={"megatron": "megatron-core"})


# ------------------------------------------------------------------------------------------- Megatron-Core torch_dist

#: the files whose presence beside a DCP save makes an ``iter_N``/``release`` folder Megatron-Core's own
CORE_MARKERS = ("common.pt", "metadata.json")
#: the ShardedObject key of the common state after commit 40b1fd37 (``ShardedObject("common_state", …,
#: (1,), (0,)).unique_key``)
COMMON_STATE_ITEM = "common_state/shard_0_1"

CORE_CONTRACT = Contract(
    producer="megatron-core", framework="Megatron-Core torch_dist",
    versions="megatron-core 0.16.1 (tested); common state inside the DCP files after Megatron-LM 40b1fd37",
    layouts=("megatron-dist",), match_files=CORE_MARKERS,
    files=(FileRole(".metadata", "mixed", "pickle.load (FileSystemReader.read_metadata)"),
           FileRole("*.distcp", "mixed", "dist_checkpointing.load"),
           FileRole("common.pt", "mixed", "torch.load(map_location='cpu'), weights-only with SAFE_GLOBALS"),
           FileRole("metadata.json", "mixed", "json (check_is_distributed_checkpoint)"),
           FileRole("integrity.json", "mixed", "json, by load(verify_integrity=True) (>= 0.17.1)")),
    keys={"weights": ("model",), "optimizer": ("optimizer",), "scheduler": ("opt_param_scheduler",),
          "rng": ("rng_state",), "metadata": ("args", "checkpoint_version", "content_metadata")},
    step_at=("*:iteration",),
    saves=frozenset({"weights", "optimizer", "step"}),
)

#: ``megatron/core/safe_globals.py`` (0.16.1) ``SAFE_GLOBALS``, as torch matches them (``module.name``)
SAFE_GLOBALS = frozenset({
    "types.SimpleNamespace", "pathlib.PosixPath", "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype", "numpy.dtypes.UInt32DType",
    "argparse.Namespace", "megatron.core.transformer.enums.AttnBackend", "megatron.core.transformer.enums.CudaGraphScope",
    "megatron.core.enums.ModelType", "megatron.core.optimizer.optimizer_config.OptimizerConfig",
    "megatron.core.rerun_state_machine.RerunDiagnostic", "megatron.core.rerun_state_machine.RerunMode",
    "megatron.core.rerun_state_machine.RerunState", "_io.BytesIO", "io.BytesIO", "signal.Signals",
})
_COMMON_LOAD = ResumeLoad("megatron-core TorchCommonLoadStrategy.load_common: torch.load(map_location='cpu'), "
                          "weights-only (torch >= 2.6) with megatron.core.safe_globals.SAFE_GLOBALS",
                          allows=SAFE_GLOBALS)


def core_default_pick(v: dict, folder: str) -> Tuple[Optional[str], bool]:
    """The iteration folder ``folder``'s tracker names (``load_checkpoint`` without ``--ckpt-step``); no tracker:
    Megatron starts from random (no default)."""
    t = next((p for p in v.get("pointers") or [] if base(p["path"]) == TRACKER and parent(p["path"]) == folder), None)
    if t is None:
        return None, False
    text = (t.get("target") or "").strip()
    if not (text.isdigit() or text == "release"):
        return None, True
    return join(folder, tracker_unit(text)) if folder else tracker_unit(text), True


def merged_state(flat: dict, common) -> dict:
    """The unit's state as ``dist_checkpointing.load`` hands it to ``load_checkpoint``: the common state (pruned
    tree of ``common.pt`` or of the ``common_state`` item) with the DCP items merged in (``merge``,
    serialization.py:160-164).  ``flat``: {DCP key: tensor description}; the model's sharded keys go under ``model``
    (``generate_state_dict`` puts ``model.sharded_state_dict()`` there), the optimizer's per-parameter moments
    (``optimizer.state.<moment>.<param>``) become ``optimizer.state`` by parameter, by their shape
    (:func:`ckptaudit.recognise.flat_state_table`), each with the shared step ``common_step`` as its ``step``
    (``_restore_common_per_param_step``); ShardedObjects (``key/shard_…``) go under their key."""
    from ..recognise import flat_state_table

    out = dict(common) if isinstance(common, dict) else {}
    model, moments, objects = {}, {}, {}
    for k, v in flat.items():
        if k.startswith("optimizer.state."):
            moments[k[len("optimizer.state."):]] = v
        elif k == COMMON_STATE_ITEM:
            continue
        elif "/" in k and not k.split("/", 1)[0].endswith("_extra_state"):
            objects.setdefault(k.split("/", 1)[0], {})[k.split("/", 1)[1]] = v
        else:
            model[k] = v
    out.update({k: v for k, v in objects.items() if k not in out})
    if model:
        out["model"] = {**(out.get("model") if isinstance(out.get("model"), dict) else {}), **model}
    opt = dict(out.get("optimizer")) if isinstance(out.get("optimizer"), dict) else None
    if moments or opt is not None:
        opt = opt or {}
        shared = opt.get("state") if isinstance(opt.get("state"), dict) else {}
        step = shared.get("common_step")
        table = flat_state_table({f"state.{k}": v for k, v in moments.items()}, tuple(model))
        state = {p: {leaf: moments[k[len("state."):]] for leaf, k in leaves.items()}
                 for p, leaves in (table[0] if table else {}).items()}
        if step is not None:
            for leaves in state.values():
                leaves.setdefault("step", step)
        opt["state"] = state
        opt.setdefault("param_groups", [])
        out["optimizer"] = opt
    return out


CORE_PRODUCER = Producer(
    key="megatron-core", name="Megatron-Core", layouts=("megatron-dist",), contracts=(CORE_CONTRACT,),
    folder_adapters=((25, "megatron_dist:ADAPTER"),),
    # every file is read by the resume: metadata.json by _get_checkpoint_format, integrity.json by a verified load
    # (>= 0.17.1, --verify-integrity), which fails on either; none is metadata the resume can do without
    roles=(("mixed", r"\.metadata|common\.pt|metadata\.json|integrity\.json"),),
    resume_loads={"mixed": _COMMON_LOAD},
    resume_call='pretrain_gpt.py … --ckpt-format torch_dist --load "{dir}" --ckpt-step {step}',
    name_step=r"^iter_(\d{7})$",
    default_call="load_checkpoint (--load: the iteration latest_checkpointed_iteration.txt names)",
    default_pick=core_default_pick,
    claim_files=CORE_MARKERS,
    parallel_findings=parallel_findings,
    pip_names={"megatron": "megatron-core"},
)
