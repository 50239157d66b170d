"""The safetensors header's JSON: its rules of an entry and of ``__metadata__``, parsed whole or entry by entry.

The format's facts (huggingface/safetensors README, "Format"; the Rust ``Metadata::validate``) that both the
dict path of :mod:`.safetensors_check` and the columns of :mod:`.safetensors_columns` hold a header to.
"""

from __future__ import annotations

import json
from typing import Iterator, List, Optional, Tuple

from .. import fs

__all__ = ["DTYPE_BITS", "content_problem", "entry_problem", "iter_header", "parse_dict"]

#: Bits per element of each safetensors dtype (safetensors ``Dtype::bitsize``).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8, "E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
}

def parse_dict(text: str, nul_text: str = "") -> Tuple[Optional[dict], str]:
    """``(header, why)`` of a header's text parsed by ``json`` into one dict (header None if not a JSON object)."""
    obj, dup, why = _json_object(text, nul_text)
    if obj is None:
        return None, why
    if "\\u" in text:  # lone surrogate escapes cannot be written as UTF-8 (tables, report)
        obj = fs.without_lone_surrogates(obj)
    if dup:
        return obj, f"duplicate key(s) {sorted(set(dup))}"
    return obj, content_problem(obj)


def _json_object(text: str, nul_text: str) -> Tuple[Optional[dict], List[str], str]:
    """``(obj, duplicate keys, why)``: ``text`` parsed by ``json``; ``obj`` None (and ``why`` said) unless it
    is a JSON object."""
    dup: List[str] = []

    def pairs(kv):
        d = {}
        for k, v in kv:
            if k in d:
                dup.append(k)
            d[k] = v
        return d

    try:
        obj = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        return None, dup, f"{e.msg} (header byte {e.pos}){nul_text}"
    except RecursionError:
        return None, dup, "nesting too deep"
    except ValueError as e:  # e.g. an integer of more than 4300 digits (sys.get_int_max_str_digits)
        return None, dup, str(e).split(";", 1)[0]
    if not isinstance(obj, dict):
        return None, dup, "the header is not a JSON object"
    return obj, dup, ""


def content_problem(obj: dict) -> str:
    """Why a parsed header's ``__metadata__`` or first bad entry breaks the format; "" when none does."""
    meta = obj.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        return "__metadata__ is not a map of strings to strings"
    for name, e in obj.items():
        if name == "__metadata__":
            continue
        problem = entry_problem(name, e)
        if problem:
            return problem
    return ""


def entry_problem(name: str, e) -> str:
    """Why header entry ``name`` is not ``{"dtype": known, "shape": [int >= 0, ...], "data_offsets": [int >= 0,
    int >= 0]}``; "" when it is."""
    if not isinstance(e, dict):
        return f"entry {name!r} is not an object"
    missing = sorted({"dtype", "shape", "data_offsets"} - set(e))
    if missing:
        return f"tensor {name!r} lacks {missing}"
    if not isinstance(e["dtype"], str) or e["dtype"] not in DTYPE_BITS:
        return f"tensor {name!r} has unknown dtype {_short(e['dtype'])}"
    sh = e["shape"]
    if not (isinstance(sh, list) and all(type(d) is int and d >= 0 for d in sh)):
        return f"tensor {name!r} has shape {_short(sh)}, not a list of non-negative integers"
    off = e["data_offsets"]
    if not (isinstance(off, list) and len(off) == 2 and all(type(d) is int and d >= 0 for d in off)):
        return f"tensor {name!r} has data_offsets {_short(off)}, not two non-negative integers"
    return ""


def iter_header(text: str) -> Iterator[Tuple[str, object]]:
    """The ``(name, value)`` pairs of a safetensors JSON header (a str starting with ``{``), one at a time and in
    file order, so a caller that handles each in turn never holds one dict per tensor (a header of 1 M entries
    parses into ~1 GiB of dicts at once).  Values are parsed by the standard ``json`` decoder; a duplicate key
    is yielded again.  Raises ``json.JSONDecodeError`` (a ``ValueError``) where ``json.loads`` would."""
    dec = json.JSONDecoder()
    ws = json.decoder.WHITESPACE.match
    i = ws(text, 0).end()
    if text[i:i + 1] != "{":
        raise json.JSONDecodeError("Expecting '{'", text, i)
    i = ws(text, i + 1).end()
    if text[i:i + 1] == "}":
        return
    while True:
        if text[i:i + 1] != '"':
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
        key, i = json.decoder.scanstring(text, i + 1)
        i = ws(text, i).end()
        if text[i:i + 1] != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
        value, i = dec.raw_decode(text, ws(text, i + 1).end())
        yield key, value
        i = ws(text, i).end()
        c = text[i:i + 1]
        i = ws(text, i + 1).end()
        if c == "}":
            if i != len(text):
                raise json.JSONDecodeError("Extra data", text, i)
            return
        if c != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i - 1)


def _short(v, limit: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "…"
