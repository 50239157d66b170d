"""Check a ``.safetensors`` file from its bytes (no safetensors import, no torch).

Layout (huggingface/safetensors README, "Format"; checks mirror the Rust
``SafeTensors::read_metadata`` / ``Metadata::validate``):

* 8 bytes: ``N``, u64 little-endian, the header length; the Rust reader
  refuses ``N > 100_000_000`` (``MAX_HEADER_SIZE``) and ``8 + N > file size``;
* ``N`` bytes: UTF-8 JSON object starting with ``{`` (it may be padded with
  trailing spaces): ``name -> {"dtype", "shape", "data_offsets": [begin, end]}``
  plus an optional ``"__metadata__"`` string-to-string map;
* the data buffer: offsets are relative to its start; sorted by offset the
  tensors must be contiguous from 0 (no gap, no overlap), each exactly
  ``prod(shape) * dtype bits / 8`` bytes, and the last ``end`` must be the
  buffer's length.  (The Rust reader also refuses extra bytes after the last
  tensor: "incomplete metadata, file not fully covered".)

The format has no checksum: a changed byte inside tensor data cannot be seen
from the bytes alone (that needs a sidecar SHA-256).  What *can* be seen is a
zeroed block, within limits, see :func:`_suspicious_zero_runs`.
"""

from __future__ import annotations

import math
import struct
from typing import List, Optional, Tuple

from .. import findings, fs
from ..findings import Finding
from . import zeros
from .safetensors_header import DTYPE_BITS, entry_problem, iter_header, parse_dict  # noqa: F401 (face)
from .sniff import generic_findings, sniff
from .zeros import zero_runs

#: Largest header the safetensors Rust reader accepts (``MAX_HEADER_SIZE``), bytes.
MAX_HEADER_BYTES = 100_000_000
#: torch's dtype name of each safetensors dtype (safetensors ``Dtype`` names; ``safetensors.torch._TYPES``)
ST_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
    "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "U16": "uint16", "U32": "uint32", "U64": "uint64",
}
#: Shortest NUL run in the data buffer that can count as a lost block, bytes
#: (one filesystem block / page: the unit in which unflushed data is lost).
MIN_ZERO_RUN_BYTES = 4096
#: A flagged run must reach at least this many bytes into the partly non-zero
#: tensor(s) it cuts into (16 float32 zeros in a row at a tensor's edge).
MIN_ZERO_EDGE_BYTES = 64
_MAX_OFFSET_FINDINGS = 10
#: Headers of at least this many bytes are parsed into columns (:mod:`.safetensors_columns`: a few bytes per entry
#: in arrays, numpy to check them) rather than into one dict (~1 KiB per entry; issue 45).
COLUMNS_MIN_HEADER_BYTES = 1 << 20
_NOT_SAFETENSORS = ("empty", "all_zero", "lfs_pointer", "html", "text", "json", "npy", "npz", "pickle")


def check_safetensors(path, *, display: Optional[str] = None, scan_zeros: bool = True, chunk: int = 1 << 20,
                      min_zero_run: int = MIN_ZERO_RUN_BYTES, facts=None) -> Tuple[Optional[dict], List[Finding]]:
    """Parse and validate the safetensors file at ``path``.

    Returns ``(header, findings)``: ``header`` is the parsed JSON header
    (tensor name -> ``{"dtype", "shape", "data_offsets"}``, plus
    ``"__metadata__"``) whenever it parsed as a JSON object, else None; a header of
    :data:`COLUMNS_MIN_HEADER_BYTES` or more comes as its columns
    (:class:`.safetensors_columns.HeaderColumns`: its names iterate, ``get("__metadata__")``).
    Reads the 8-byte prefix and the header (at most :data:`MAX_HEADER_BYTES`);
    with ``scan_zeros`` the data buffer is streamed once in ``chunk``-byte reads
    to look for zeroed blocks (not when ``facts.tensor_bytes`` is false:
    :data:`ckptaudit.fs.read_depth.METADATA_ONLY`).  The findings name ``display`` (default: ``path``), the file as it
    sits in the run folder.  ``facts`` (the hash stage's :class:`ckptaudit.onepass.facts.ByteFacts`) answer
    for the NUL runs its pass listed in the data buffer, and the bytes it kept (``facts.kept``) for the reads.
    Never raises on bad content; raises OSError only if the file cannot be opened.
    """
    path = fs.fspath(path)
    shown = path if display is None else display
    scan_zeros = scan_zeros and (facts is None or facts.tensor_bytes)  # the reader's run pass reads the header only
    kept = None if facts is None else facts.kept
    s = sniff(path, kept=kept)
    if s.kind in _NOT_SAFETENSORS:
        return None, generic_findings(s, shown)
    size = s.size_bytes
    header, n, bad = _read_header(path, shown, size, s.detail.get("zero_head_bytes"), kept)
    if bad:
        return header, bad
    if not isinstance(header, dict) and header.source is None:  # the columns (issue 45): no object per tensor
        return header, _span_findings(path, shown, header, size, n, scan_zeros, min_zero_run, chunk, facts)
    src = header if isinstance(header, dict) else header.source
    tensors = sorted(((name, e) for name, e in src.items() if name != "__metadata__"),
                     key=lambda t: (t[1]["data_offsets"][0], t[1]["data_offsets"][1], t[0]))
    out, data_len = _offset_findings(tensors, shown)
    present = size - 8 - n
    if present < data_len:
        out.append(_truncated(shown, tensors, present, data_len))
    elif present > data_len:
        out.append(findings.make("safetensors_trailing_bytes", path=shown, extra_bytes=present - data_len,
                                 expected_bytes=8 + n + data_len, size_bytes=size))
    if scan_zeros and not any(x.severity == "error" for x in out) and data_len >= min_zero_run:
        out.extend(_suspicious_zero_runs(path, shown, tensors, 8 + n, data_len, min_zero_run, chunk, facts))
    return header, out


def _span_findings(path: str, shown: str, cols, size: int, n: int, scan_zeros: bool, min_zero_run: int,
                   chunk: int, facts) -> List[Finding]:
    """The findings of a well-formed header's spans (:class:`.safetensors_columns.HeaderColumns`), as the
    dict path above makes them, over sorted arrays."""
    from . import safetensors_spans as spans

    order = spans.sorted_order(cols)
    out, data_len = spans.offset_findings(cols, order, shown, _MAX_OFFSET_FINDINGS, _span_problem)
    present = size - 8 - n
    if present < data_len:
        out.append(spans.truncated(cols, order, shown, present, data_len))
    elif present > data_len:
        out.append(findings.make("safetensors_trailing_bytes", path=shown, extra_bytes=present - data_len,
                                 expected_bytes=8 + n + data_len, size_bytes=size))
    if scan_zeros and not any(x.severity == "error" for x in out) and data_len >= min_zero_run:
        listed = None if facts is None else facts.nul_runs_in(path, 8 + n, data_len, min_zero_run)
        runs = listed if listed is not None else zero_runs(path, min_run=min_zero_run, chunk=chunk, start=8 + n,
                                                           end=8 + n + data_len,
                                                           kept=None if facts is None else facts.kept)
        out.extend(spans.zero_run_findings(cols, order, shown, runs, 8 + n, data_len, MIN_ZERO_EDGE_BYTES))
    return out


def _read_header(path: str, shown: str, size: int, zero_head_bytes, kept=None
                 ) -> Tuple[Optional[dict], int, List[Finding]]:
    """``(header, n, findings)``: the parsed header (None when it is no JSON object), its length ``n`` in bytes
    and the findings that end the check (an empty list when the header is well formed).  Reads the 8-byte
    prefix and the ``n`` bytes after it (answered from ``kept`` first)."""
    if size < 8:
        return None, 0, [findings.make("header_too_small", path=shown, size_bytes=size)]
    with fs.open_binary(path, kept=kept) as f:
        n = struct.unpack("<Q", f.read(8))[0]
        if n > MAX_HEADER_BYTES or 8 + n > size:
            return None, n, [findings.make("header_too_large", path=shown, header_len=n, size_bytes=size,
                                           max_header_bytes=MAX_HEADER_BYTES)]
        if n == 0:
            return None, 0, zeros.head(shown, zero_head_bytes, size) or [findings.make(
                "invalid_header_json", path=shown, header_len=0,
                why="the header length prefix is 0 (an empty header is not a JSON object)")]
        raw = f.read(n)
    text, nul_text, why = _header_text(raw)
    del raw  # 100 MB of bytes need not sit beside their text while it is parsed
    header, why = (None, why) if text is None else _parse_text(text, nul_text)
    if header is None or why:  # None: not a JSON object; else a violation inside it
        return header, n, [findings.make("invalid_header_json", path=shown, header_len=n, why=why)]
    return header, n, []


def _offset_findings(tensors, shown: str) -> Tuple[List[Finding], int]:
    """``(findings, data_len)`` over ``tensors`` sorted by offsets: at most :data:`_MAX_OFFSET_FINDINGS`
    ``safetensors_offsets_invalid`` findings (an end before its begin, an overlap, a gap, a span that is not the
    dtype x shape's bytes) and the end of the data buffer the header describes (bytes)."""
    out: List[Finding] = []
    expected = 0
    prev = None
    for name, e in tensors:
        b, en = e["data_offsets"]
        problem = _span_problem(e, b, en, expected, prev)
        if problem and len(out) < _MAX_OFFSET_FINDINGS:
            from .safetensors_spans import offset_invalid

            out.append(offset_invalid(shown, name, [b, en], problem))
        expected = max(expected, en)
        prev = name
    return out, expected


def _span_problem(e: dict, b: int, en: int, expected: int, prev: Optional[str]) -> Optional[str]:
    """Why the span ``[b, en)`` of entry ``e`` is wrong where the previous tensor ``prev`` ends at ``expected``."""
    if en < b:
        return f"end ({en}) before they begin ({b})"
    if b < expected:
        return f"overlap the previous tensor {prev!r}, which ends at {expected}" if prev else "do not start at 0"
    if b > expected:
        return (f"leave a gap of {b - expected} bytes after {prev!r} (which ends at {expected})"
                if prev else f"leave the first {b} bytes of the data buffer uncovered")
    nbits = math.prod(e["shape"]) * DTYPE_BITS[e["dtype"]]
    if nbits % 8:
        return f"cannot hold {e['dtype']} x {e['shape']} ({nbits} bits is not whole bytes)"
    if nbits // 8 != en - b:
        return f"span {en - b} bytes but {e['dtype']} x {list(e['shape'])} needs {nbits // 8} bytes"
    return None


def _parse_header(raw: bytes) -> Tuple[Optional[dict], str]:
    """``(header, why)``: header None if not a JSON object; ``why`` non-empty on any violation."""
    text, nul_text, why = _header_text(raw)
    return (None, why) if text is None else _parse_text(text, nul_text)


def _header_text(raw: bytes) -> Tuple[Optional[str], str, str]:
    """``(text, nul_text, why)``: the header's bytes decoded (None, and ``why`` said, when they are not UTF-8 or
    do not start with ``{``); ``nul_text``: what an error adds about NUL bytes in them."""
    nul = raw.find(b"\0")
    nul_text = ""
    if nul >= 0:
        k = len(raw) - nul - len(raw[nul:].lstrip(b"\0"))
        nul_text = f"; {k} NUL bytes from header byte {nul} (a zeroed or lost block?)"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, nul_text, f"not UTF-8 at header byte {e.start}{nul_text}"
    if not text.startswith("{"):
        return None, nul_text, f"it starts with {text[:8]!r}, not '{{'{nul_text}"
    return text, nul_text, ""


def _parse_text(text: str, nul_text: str):
    """``(header, why)`` of a header's text that starts with ``{``: a dict, or its columns when it is large."""
    if len(text) < COLUMNS_MIN_HEADER_BYTES:  # a dict: no numpy for the file layer's usual headers
        return parse_dict(text, nul_text)
    from . import safetensors_columns

    return safetensors_columns.parse(text, nul_text)


def valid_entries(header) -> List[Tuple[str, dict]]:
    """``(name, entry)`` of the tensors of a parsed header (a dict, or the :class:`.safetensors_columns.HeaderColumns`
    :func:`check_safetensors` returns) whose entry is well formed (:func:`entry_problem`).

    :func:`check_safetensors` returns the header also when an entry is wrong (with an
    ``invalid_header_json`` finding, an error); a caller that lists tensors takes only these."""
    if not isinstance(header, dict) and header.source is not None:  # columns that fell back to json's dict
        header = header.source
    if not isinstance(header, dict):
        return [(header.name(i), header.entry(i)) for i in header.valid_indices().tolist()]
    return [(k, e) for k, e in header.items() if k != "__metadata__" and not entry_problem(k, e)]


def _truncated(display: str, tensors, present: int, data_len: int) -> Finding:
    whole = [t for t in tensors if t[1]["data_offsets"][1] <= present]
    cut = next((t for t in tensors if t[1]["data_offsets"][0] <= present < t[1]["data_offsets"][1]), None)
    text = f"{len(whole)} of {len(tensors)} tensors lie wholly inside the file"
    if cut is not None:
        b, e = cut[1]["data_offsets"]
        text += (f"; the cut falls inside {cut[0]!r} after {present - b} of its {e - b} bytes "
                 f"(data byte {present})")
    text += "."
    from .safetensors_spans import truncated_in_data

    return truncated_in_data(display, data_len, present, text, len(whole), len(tensors))


def _suspicious_zero_runs(path: str, display: str, tensors, data_start: int, data_len: int, min_run: int,
                          chunk: int, facts=None) -> List[Finding]:
    """Zero-filled spans in the data buffer that a legitimate save cannot explain.

    Choice (and why): tensors that are legitimately all zero are common (biases
    and LayerNorm shifts initialised to 0, Adam moments at step 0, masks), so a
    NUL run that merely covers whole tensors is never flagged.  A run is flagged
    only when it is at least ``min_run`` bytes (default 4096, one block) *and*
    cuts across a tensor boundary *and* reaches at least
    :data:`MIN_ZERO_EDGE_BYTES` into a tensor that is not all zero on the other
    side of the cut (the first tensor it touches has non-zero bytes before it;
    the last has non-zero bytes after it, or the run runs to EOF).  A lost block
    lands anywhere, so it cuts tensors; a legitimate zero tensor starts and
    ends on its own boundaries.  Remaining false positive: a tensor that ends in
    >= 16 exact float32 zeros right before an all-zero tensor.  Missed: a lost
    block inside one tensor (indistinguishable from bytes alone; that needs a
    checksum).  A run reaching EOF is reported as ``zero_filled_tail``.
    """
    spans = [(t[1]["data_offsets"][0], t[1]["data_offsets"][1], t[0]) for t in tensors
             if t[1]["data_offsets"][1] > t[1]["data_offsets"][0]]
    out: List[Finding] = []
    file_end = data_start + data_len
    listed = None if facts is None else facts.nul_runs_in(path, data_start, data_len, min_run)  # the hash stage's
    runs = listed if listed is not None else zero_runs(path, min_run=min_run, chunk=chunk, start=data_start,
                                                       end=file_end, kept=None if facts is None else facts.kept)
    for off, length in runs:
        rb, re_ = off - data_start, off - data_start + length
        touched = [s for s in spans if s[0] < re_ and s[1] > rb]
        if len(touched) < 2:
            continue
        first, last = touched[0], touched[-1]
        starts_inside = rb > first[0] and first[1] - rb >= MIN_ZERO_EDGE_BYTES
        to_eof = off + length >= file_end
        ends_inside = re_ < last[1] and re_ - last[0] >= MIN_ZERO_EDGE_BYTES
        if not starts_inside or not (ends_inside or to_eof):
            continue
        member = f"tensors {first[2]!r}..{last[2]!r}" if len(touched) > 2 else \
            f"tensors {first[2]!r} and {last[2]!r}"
        if to_eof:
            out.append(zeros.tail(display, length, off, member=member))
        else:
            out.append(zeros.span(display, length, off, member))
    return out
