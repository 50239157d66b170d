"""Structure layer, per unit: does the checkpoint fit the job that will resume?

Compares key names, shapes and dtypes of the weights with the target (a
``reference`` checkpoint, or shapes implied by ``expected_model_args``),
detects wrapper prefixes (``module.`` from DDP/DataParallel, ``_orig_mod.``
from ``torch.compile`` — torch/_dynamo/eval_frame.py ``OptimizedModule``),
tied weights stored once (safetensors ``save_model`` de-duplicates shared
tensors: safetensors/torch.py ``_remove_duplicate_names``), optimizer state
against the parameters, and the parallel layout (DeepSpeed ZeRO world size and
stage, Megatron tensor/pipeline sizes) against ``target``.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from .. import components as C
from .. import findings as F
from .. import producers, roles
from ..components import weights_rows
from .context import Part, StageContext
from .rows import EarlierRows, StructureRow, StructureRows

WRAPPER_PREFIXES = {"module.": "DistributedDataParallel/DataParallel", "_orig_mod.": "torch.compile"}
# Buffers that are in a state_dict but are not parameters (no optimizer state).
BUFFER_RE = re.compile(r"(running_mean|running_var|num_batches_tracked|\.attn\.bias$|masked_bias|inv_freq|"
                       r"position_ids$|\.mask$)")
# Known tied pairs (output head <-> input embedding) by naming convention:
# nanoGPT (lm_head/wte), HF GPT-2 (transformer.wte), Llama (model.embed_tokens),
# T5 (shared), Megatron (word_embeddings).
# Each entry: (head, embedding, a key that shows the embedding's family is present).
TIED_FAMILIES = [
    ("lm_head.weight", "wte.weight", "wpe.weight"),
    ("lm_head.weight", "transformer.wte.weight", "transformer.wpe.weight"),
    ("lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"),
    ("output.weight", "tok_embeddings.weight", "norm.weight"),
    ("lm_head.weight", "shared.weight", "encoder.final_layer_norm.weight"),
]
TIED = [(h, tuple(e for hh, e, _ in TIED_FAMILIES if hh == h)) for h in sorted({h for h, _, _ in TIED_FAMILIES})]


def missing_tied_aliases(keys) -> List[tuple]:
    """(kept, missing) names of tied pairs where only one name was stored."""
    out = []
    for head, emb, sibling in TIED_FAMILIES:
        if sibling not in keys:
            continue
        if head in keys and emb not in keys:
            out.append((head, emb))
        elif emb in keys and head not in keys:
            out.append((emb, head))
    return out


def tied_pairs_present(weights: Dict[str, dict]) -> int:
    """Known tied pairs stored under both names with equal shapes (one parameter each)."""
    n = 0
    for head, emb, _ in TIED_FAMILIES:
        if head in weights and emb in weights and weights[head].get("shape") == weights[emb].get("shape"):
            n += 1
    return n
VOCAB_KEYS = ("vocab", "vocab_size", "n_vocab", "padded_vocab_size")


def strip_prefix(keys: List[str]) -> str:
    """The wrapper prefix every key carries (e.g. "module._orig_mod."), or ""."""
    prefix = ""
    rest = list(keys)
    while rest:
        hit = None
        for p in WRAPPER_PREFIXES:
            if all(k.startswith(p) for k in rest):
                hit = p
                break
        if not hit:
            break
        prefix += hit
        rest = [k[len(hit):] for k in rest]
    return prefix


def structure_hash(weights: Dict[str, dict]) -> str:
    h = hashlib.sha256()
    for k in sorted(weights):
        t = weights[k]
        h.update(f"{k}:{t.get('__tensor__')}:{t.get('shape')}\n".encode())
    return h.hexdigest()[:16]


def _examples(items: List[str], n: int = 4) -> str:
    shown = ", ".join(items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def analyse_unit(unit: dict, scan_row: dict, tensors: Iterable[dict], cfg: dict,
                 reference: Optional[Dict[str, dict]] = None, parsed: Optional[Callable[[], tuple]] = None
                 ) -> StructureRow:
    """One row of the ``structure`` table for a unit; ``tensors`` (its rows of the tensors table) may be
    iterated more than once (:class:`ckptaudit.tables.UnitView`); ``parsed``: gives the scan row's (components,
    tree, facts) already parsed (default: :func:`ckptaudit.components.of_scan_row`)."""
    p = unit["unit"]
    row: dict = {"unit": p}  # the row's columns as they are decided
    if not roles.weights_intact(scan_row):
        return StructureRow(p)
    c, tree, facts = parsed() if parsed else C.of_scan_row(scan_row)
    fl: List[F.Finding] = []
    target = cfg.get("target") or {}
    # parallel layout
    row.update(dp_world_size=facts.get("dp_world_size"), zero_stage=facts.get("zero_stage"))
    producer = producers.for_layout(scan_row["layout"])
    if producer is not None and producer.parallel_findings is not None:
        fl.extend(producer.parallel_findings(p, facts, target))
    w = weights_rows.complete(c, facts, tensors)  # every weight, where the scan tree kept 4,096
    if not w:
        return StructureRow(**row, findings=tuple(fl))
    row.update(weights_component=c.weights_source, n_weight_keys=len(w), structure_hash=structure_hash(w))
    prefix, bare = _wrapper_prefix(p, c, w, reference, row, fl, producer.model_prefixes if producer else ())
    shape_bad: List[str] = []  # "name: saved …, expected …", against the reference or the expected model args
    vocab_text = ""
    if reference:
        _against_reference(p, bare, reference, row, fl, shape_bad)
    elif cfg.get("expected_model_args") and c.model_args:
        vocab_text = _against_model_args(c.model_args, cfg["expected_model_args"], bare, shape_bad)
    if shape_bad:
        fl.append(F.make("size_mismatch", path=p, n=len(shape_bad), examples=_examples(shape_bad, 3),
                         vocab_text=vocab_text))
    row["n_shape_mismatch"] = len(shape_bad)
    # tied weights stored once
    if not reference and c.weights_only_format:
        for kept, alias in missing_tied_aliases(bare):
            fl.append(F.make("tied_weight_alias_missing", path=p, alias=repr(alias), kept=repr(kept)))
    # optimizer vs parameters
    fl.extend(_optimizer_checks(p, c, tensors, bare, prefix, row))
    return StructureRow(**row, findings=tuple(fl))


def _wrapper_prefix(p: str, c: C.Components, w: Dict[str, dict], reference: Optional[Dict[str, dict]], row: dict,
                    fl: List[F.Finding], expected: Tuple[str, ...] = ()) -> Tuple[str, Dict[str, dict]]:
    """(the wrapper prefix every weight key carries, e.g. ``module.`` of DDP, and the weights without it); a
    prefix the reference does not share is ``key_prefix_mismatch`` (added to ``fl``, and ``row["prefix"]``),
    unless it is one the producer's own resume expects (``expected``: its model wrapper's, Composer's ``module.``)."""
    keys = sorted(w)
    ref_keys = sorted(reference) if reference else None
    prefix = strip_prefix(keys)
    if prefix and prefix not in expected and not (ref_keys and strip_prefix(ref_keys) == prefix):
        wrappers = " + ".join(WRAPPER_PREFIXES[x + "."] for x in prefix.rstrip(".").split(".")
                              if x + "." in WRAPPER_PREFIXES)
        comp = c.weights_source.split(":")[-1] or "the weights"
        fl.append(F.make("key_prefix_mismatch", path=p, component=repr(comp), prefix=prefix, wrapper=wrappers))
        row["prefix"] = prefix
    return prefix, ({k[len(prefix):]: v for k, v in w.items()} if prefix else w)


def _against_reference(p: str, bare: Dict[str, dict], reference: Dict[str, dict], row: dict, fl: List[F.Finding],
                       shape_bad: List[str]) -> None:
    """Keys, dtypes and shapes of the weights against a reference structure: ``missing_keys``,
    ``unexpected_keys``, ``dtype_mismatch`` into ``fl`` (tied aliases the reference names are not missing),
    shape differences into ``shape_bad``, counts into ``row``."""
    missing = sorted(set(reference) - set(bare))
    unexpected = sorted(set(bare) - set(reference))
    tied_ok = _tied_aliases(bare, reference)
    missing = [m for m in missing if m not in tied_ok]
    dtype_bad = []
    for k in sorted(set(reference) & set(bare)):
        if list(reference[k].get("shape", [])) != list(bare[k].get("shape", [])):
            shape_bad.append(f"{k}: saved {tuple(bare[k]['shape'])}, expected {tuple(reference[k]['shape'])}")
        elif reference[k].get("__tensor__") != bare[k].get("__tensor__"):
            dtype_bad.append(f"{k}: {bare[k].get('__tensor__')} vs {reference[k].get('__tensor__')}")
    if dtype_bad:
        fl.append(F.make("dtype_mismatch", path=p, n=len(dtype_bad), examples=_examples(dtype_bad, 3)))
    if missing:
        fl.append(F.make("missing_keys", path=p, n=len(missing), examples=_examples([repr(m) for m in missing])))
    if unexpected:
        fl.append(F.make("unexpected_keys", path=p, n=len(unexpected),
                         examples=_examples([repr(m) for m in unexpected])))
    row.update(n_missing=len(missing), n_unexpected=len(unexpected))


def _against_model_args(model_args: dict, expected: dict, bare: Dict[str, dict], shape_bad: List[str]) -> str:
    """Shapes the ``expected_model_args`` imply where the saved model args differ (a dimension equal to the saved
    value becomes the expected one): differences into ``shape_bad``; returns the vocabulary-resize note or ""."""
    vocab_text = ""
    changed = {k: (model_args.get(k), v) for k, v in expected.items()
               if k in model_args and isinstance(v, int) and isinstance(model_args.get(k), int)
               and model_args.get(k) != v}
    for k, (saved, want) in changed.items():
        for name in sorted(bare):
            shape = bare[name].get("shape") or []
            if saved in shape:
                dim = shape.index(saved)
                new = list(shape)
                new[dim] = want
                shape_bad.append(f"{name}: saved {tuple(shape)}, expected {tuple(new)} ({k} {saved} -> {want})")
        if k in VOCAB_KEYS:
            vocab_text = f"; this is a vocabulary resize ({k} {want} -> {saved} at save time)"
    return vocab_text


def _tied_aliases(bare: Dict[str, dict], reference: Dict[str, dict]) -> set:
    out = set()
    for alias, kept_names in TIED:
        if any(k in bare for k in kept_names) and alias not in bare and alias in reference:
            out.add(alias)
    return out


def is_buffer(name: str, shape) -> bool:
    """Whether state_dict entry ``name`` of ``shape`` is a known buffer (no optimizer state), not a parameter.
    ``….attn.bias`` is GPT-2's and nanoGPT's causal mask only when it is a square mask (``(1, 1, T, T)``, at least
    2-D, last two sides equal); the bias of an ``nn.Linear`` named ``attn`` (1-D) is a parameter."""
    if not BUFFER_RE.search(name):
        return False
    if name.endswith(".attn.bias") and shape is not None:
        dims = list(shape)
        return len(dims) >= 2 and dims[-1] == dims[-2]
    return True


def _parameters(wsrc: str, tensors: Iterable[dict], bare: Dict[str, dict], prefix: str) -> List[str]:
    """The model's parameters in ``bare`` (weights without the wrapper ``prefix``), in insertion order: buffers
    left out, and one name per (file, storage, offset, shape) of the weights component ``wsrc`` — tied weights
    share all four, while views into one flat storage (cuDNN-flattened LSTM weights) differ in offset."""
    storage_of = {}
    for t in tensors:
        name = t["name"]
        if wsrc and wsrc != "(root)" and name.startswith(wsrc + "."):
            storage_of[name[len(wsrc) + 1:]] = (t["file"], t["storage_key"], t.get("storage_offset") or 0,
                                                tuple(t.get("shape") or ()))
    params = []
    seen = set()
    for k in bare:  # insertion order (was sorted by list(bare).index: quadratic in the tensors)
        if is_buffer(k, bare[k].get("shape")):
            continue
        sk = storage_of.get(prefix + k)
        if sk is not None and sk in seen:
            continue
        seen.add(sk if sk is not None else k)
        params.append(k)
    return params


def _moment_shapes(state: dict) -> Counter:
    """How many first moments (Adam's ``exp_avg``, SGD's ``momentum_buffer``) of each shape the optimizer state
    holds."""
    shapes: Counter = Counter()
    for v in state.values():
        if isinstance(v, dict):
            m = v.get("exp_avg") or v.get("momentum_buffer")
            if C.is_tensor(m):
                shapes[tuple(m.get("shape", []))] += 1
    return shapes


def _optimizer_checks(p: str, c: C.Components, tensors: Iterable[dict], bare: Dict[str, dict], prefix: str,
                      row: dict) -> List[F.Finding]:
    opt = c.optimizer
    if not opt or c.optimizer_partitioned or not isinstance(opt.get("param_groups"), list):
        return []
    groups = opt["param_groups"]
    sizes = [n for n in (C.group_size(g) for g in groups) if n is not None]
    if not sizes:
        return []
    params = _parameters(c.weights_source.split(":")[-1], tensors, bare, prefix)
    n_saved = sum(sizes)
    row.update(model_params=len(params), optimizer_params=n_saved)
    out = []
    # a tied pair saved as two separate storages is still one parameter
    tied = tied_pairs_present({k: bare[k] for k in params})
    if n_saved != len(params) and n_saved == len(params) - tied:
        params = [k for k in params if k not in {h for h, e, _ in TIED_FAMILIES if e in params}]
        row["model_params"] = len(params)
    if n_saved != len(params):
        out.append(F.make("optimizer_param_group_size_mismatch", path=p, saved=n_saved,
                          groups=f"{len(sizes)} group(s) of {', '.join(map(str, sizes))}", model=len(params)))
        return out
    moment_shapes = _moment_shapes(opt.get("state") or {})
    param_shapes = Counter(tuple(bare[k].get("shape", [])) for k in params)
    if moment_shapes and sum(moment_shapes.values()) == len(params) and moment_shapes != param_shapes:
        diff = list((moment_shapes - param_shapes).items())[:3]
        out.append(F.make("optimizer_state_shape_mismatch", path=p,
                          examples=", ".join(f"{n} moment(s) of shape {s} with no parameter of that shape"
                                             for s, n in diff)))
    return out


#: The columns of the ``tensors`` table this layer reads (a dict per tensor each: no more).
TENSOR_COLUMNS = ["unit", "file", "name", "dtype", "shape", "storage_key", "storage_offset"]


def run(ctx: StageContext, part: Part, rows: EarlierRows) -> StructureRows:
    """The structure layer of ``part``: a row per unit with a scan (``rows.scan``), against the target's weights
    (``ctx.target``, else built from ``ctx.config``); a unit whose analysis raises gets an ``audit_error`` row."""
    from .. import tables
    from . import liveness, target

    scans = rows.scan.by_unit()
    tens = tables.UnitRows(None, TENSOR_COLUMNS, rows.scan.tensors)  # a unit's rows as dicts while read
    cfg = dict(ctx.config)
    reference = (ctx.target if ctx.target is not None else target.build(cfg)).get("weights")
    return StructureRows(tuple(
        liveness.guard("structure", u, lambda: analyse_unit(u, scans[u["unit"]].row, tens.of(u["unit"]), cfg, reference,
                                                       lambda: scans[u["unit"]].parsed),
                       lambda f: StructureRow(u["unit"], findings=(f,)))
        for u in part.units if u["unit"] in scans))
