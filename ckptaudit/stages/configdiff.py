"""Config and environment diff: saved model arguments and versions vs the target.

Each compared key is one row, classified as

* ``breaking`` — changes tensor shapes or key sets (sizes, layer/head counts,
  vocabulary, context length, bias on/off): the weights will not fit;
* ``risky`` — dtype/precision, or a library version with known format changes;
* ``harmless`` — everything else (dropout, learning rate, logging …).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace
from importlib import metadata
from typing import Callable, List, Optional

from .. import components as C
from .. import findings as F
from .. import producers, roles
from .context import Part, StageContext
from .rows import EarlierRows, ConfigdiffRow, ConfigdiffRows

BREAKING_RE = re.compile(
    r"^(n_?embd|d|d_model|dim|hidden(_size|_dim)?|n_?layers?|num_(hidden_)?layers|n_?heads?|num_attention_heads|"
    r"n_kv_heads|num_key_value_heads|vocab(_size)?|n_vocab|padded_vocab_size|block_size|ctx|n_ctx|seq_len|"
    r"max_position_embeddings|max_seq_len|intermediate_size|ffn_dim|ffn_hidden_size|bias|tie_word_embeddings|"
    r"head_dim|kv_channels|num_experts|n_positions)$", re.I)
RISKY_RE = re.compile(r"(dtype|precision|fp16|bf16|amp|quant)", re.I)


@functools.lru_cache(maxsize=64)
def installed_version(dist: str) -> str:
    """The installed version of distribution ``dist`` ("" when absent), read once per process (importlib.metadata
    parses the package's METADATA file each time: ~5 ms, once per unit before)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ""


def classify(key: str) -> str:
    if BREAKING_RE.match(key):
        return "breaking"
    if RISKY_RE.search(key):
        return "risky"
    return "harmless"


def _fmt(v) -> str:
    return json.dumps(v, sort_keys=True, default=str) if not isinstance(v, str) else v


def diff_unit(unit: dict, scan_row: dict, cfg: dict, torch_version: Optional[str] = None,
              parsed: Optional[Callable[[], tuple]] = None) -> List[ConfigdiffRow]:
    """Rows of the ``configdiff`` table for one unit (empty when nothing is compared); ``parsed``: gives the scan
    row's (components, tree, facts) already parsed (default: :func:`ckptaudit.components.of_scan_row`)."""
    p = unit["unit"]
    if not roles.weights_intact(scan_row):
        return []
    c, tree, facts = parsed() if parsed else C.of_scan_row(scan_row)
    exp = cfg.get("expected_model_args") or {}
    rows = _model_arg_rows(p, c, exp) if exp and c.model_args else []
    target_torch = (cfg.get("target") or {}).get("torch_version") or torch_version or installed_version("torch")
    rows.extend(_version_rows(p, c.versions, target_torch))
    return rows


def _model_arg_rows(p: str, c, exp: dict) -> List[ConfigdiffRow]:
    """A row per model argument whose saved value differs from ``expected_model_args``; the first breaking one
    carries ``model_args_mismatch`` (naming every breaking difference), a risky one ``config_value_differs``."""
    rows: List[ConfigdiffRow] = []
    breaking = []
    for key in sorted(exp):
        if key not in c.model_args:
            continue
        saved, want = c.model_args[key], exp[key]
        if saved == want:
            continue
        klass = classify(key)
        fl = []
        if klass == "breaking":
            breaking.append(f"{key}: saved {saved!r}, expected {want!r}")
        elif klass == "risky":
            fl.append(F.make("config_value_differs", path=p, key=key, saved=saved, target=want, klass=klass))
        rows.append(ConfigdiffRow(unit=p, source=c.model_args_source, key=key, saved=_fmt(saved),
                                  target=_fmt(want), klass=klass, findings=tuple(fl)))
    if breaking:
        f = F.make("model_args_mismatch", path=p, examples="; ".join(breaking))
        first = next(i for i, r in enumerate(rows) if r.klass == "breaking")
        rows[first] = replace(rows[first], findings=(f,))
    return rows


def _version_rows(p: str, versions: dict, target_torch: Optional[str]) -> List[ConfigdiffRow]:
    """A row for the torch version the unit was saved with against ``target_torch`` (``torch_version_differs``
    when the release differs), and one per other library against the version installed here."""
    rows: List[ConfigdiffRow] = []
    saved_torch = versions.get("torch")
    if saved_torch and target_torch:
        same = saved_torch.split("+")[0] == target_torch.split("+")[0]
        fl = [] if same else [F.make("torch_version_differs", path=p, saved=saved_torch, target=target_torch)]
        rows.append(ConfigdiffRow(unit=p, source="versions", key="torch_version", saved=saved_torch,
                                  target=target_torch, klass="harmless" if same else "risky", findings=tuple(fl)))
    for lib, v in sorted(versions.items()):
        if lib == "torch":
            continue
        here = installed_version(producers.VERSION_DISTS.get(lib, lib))
        rows.append(ConfigdiffRow(unit=p, source="versions", key=f"{lib}_version", saved=v, target=here or "",
                                  klass="harmless" if not here or here == v else "risky"))
    return rows


def run(ctx: StageContext, part: Part, rows: EarlierRows) -> ConfigdiffRows:
    """The config diff of ``part``: rows per unit with a scan (``rows.scan``) against ``ctx.config``'s expected
    model args and target; a unit whose diff raises gets one ``audit_error`` row."""
    from . import liveness

    scans = rows.scan.by_unit()
    cfg = dict(ctx.config)
    out: List[ConfigdiffRow] = []
    for u in part.units:
        if u["unit"] in scans:
            out.extend(liveness.guard("configdiff", u, lambda: diff_unit(u, scans[u["unit"]].row, cfg,
                                                                        parsed=lambda: scans[u["unit"]].parsed),
                                      lambda f: [ConfigdiffRow(u["unit"], source="", key="", findings=(f,))]))
    return ConfigdiffRows(tuple(out))
