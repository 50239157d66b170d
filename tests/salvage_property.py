"""The property salvage keeps, as a hypothesis strategy and one check: shared by tests/test_salvage_property.py
(a CI-sized number of examples) and benchmarks/bench_salvage_property.py (≥ 500).

A random state dict (every dtype torch saves, 0-d and zero-element tensors, views sharing a storage with their
own strides and storage offsets, nested dicts and lists whose keys hold dots and percent signs) is saved by the
real writers (``torch.save``, ``safetensors.torch.save_file``, ``ckptaudit.publish``: a sealed file unit, a
sealed safetensors file, a sealed folder unit with both) and damaged once at random: cut, one bit flipped, a
4 KiB page zeroed, a header rewritten (a safetensors dtype for another of its length; a byte of a torch zip's
data.pkl), or two tensors' offsets swapped (safetensors ``data_offsets``; the local-header offsets of two
central-directory entries).  Salvage then must never raise, every file it writes must load with
``safetensors.torch.load_file`` holding exactly the keys ``salvage.json`` lists for it, and every tensor it
labels ``intact`` or ``filled`` must equal the original in dtype, shape and bytes.  The original of a tensor is
found by the path ``salvage.json`` gives (its components), never by the code under test's key.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch
from hypothesis import strategies as st
from safetensors.torch import _TYPES as ST_TYPES
from safetensors.torch import load_file
from safetensors.torch import save as st_save

from ckptaudit import publish as P
from ckptaudit.salvage import salvage

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.complex64,
          torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
KEYS = ["a", "b", "a.b", "0", "x.y.z", "%2E", "w%"]
SHAPES = [(), (0,), (4, 0), (0, 3), (1,), (7,), (3, 5), (2, 3, 4), (64, 33)]
FORMATS = ["zip", "zip_sealed", "st", "st_sealed", "folder_sealed"]
DAMAGES = ["none", "truncate", "flip", "zero_page", "rewrite_header", "swap_offsets"]


def _tensor(dtype: torch.dtype, shape: Tuple[int, ...], seed: int) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw & 1
    return raw.view(dtype).reshape(shape).clone()


def _view(base: torch.Tensor, how: int) -> torch.Tensor:
    """A view sharing ``base``'s storage: its own stride and storage offset where the shape allows."""
    if base.dim() == 2 and base.shape[0] > 1 and base.shape[1] > 1:
        return [base[1:], base.t(), base[:, ::2], base[0], base[1:, 1:].t()][how % 5]
    if base.dim() >= 1 and base.shape[0] > 1:
        return [base[1:], base[::2], base[-1]][how % 3]
    if base.dim() == 1 and base.numel() == 1:
        return base.expand(3)
    return base


@st.composite
def case(draw) -> Dict[str, Any]:
    """``{"obj": the saved object, "format", "damage", "at": a fraction in [0, 1), "bit", "chunk_bytes",
    "include_unproven"}``."""
    n = draw(st.integers(1, 9))
    entries: List[Tuple[tuple, torch.Tensor]] = []
    for i in range(n):
        path = tuple(draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)))
        if entries and draw(st.booleans()):
            t = _view(draw(st.sampled_from([e[1] for e in entries])), draw(st.integers(0, 9)))
        else:
            t = _tensor(draw(st.sampled_from(DTYPES)), draw(st.sampled_from(SHAPES)), draw(st.integers(0, 2**31)))
        entries.append((path, t))
    obj: Dict[Any, Any] = {}
    for path, t in entries:
        _put(obj, path, t, as_list=draw(st.booleans()))
    return {"obj": {"model": obj, "step": 10}, "format": draw(st.sampled_from(FORMATS)),
            "damage": draw(st.sampled_from(DAMAGES)), "at": draw(st.floats(0, 1, exclude_max=True)),
            "bit": draw(st.integers(0, 7)), "chunk_bytes": draw(st.sampled_from([4096, 64 << 20])),
            "include_unproven": draw(st.booleans())}


def _put(obj: dict, path: tuple, t: torch.Tensor, as_list: bool) -> None:
    """Place ``t`` at ``path`` unless a tensor or a dict is already in the way; a last component may hold a
    list of one tensor instead (its index is the path's last component then)."""
    d = obj
    for k in path[:-1]:
        nxt = d.setdefault(k, {})
        if not isinstance(nxt, dict):
            return
        d = nxt
    if path[-1] not in d:
        d[path[-1]] = [t] if as_list else t


def flat(obj: Any, path: tuple = ()) -> Dict[tuple, torch.Tensor]:
    """``{path components: tensor}`` of every tensor in ``obj``."""
    if isinstance(obj, torch.Tensor):
        return {path: obj}
    out: Dict[tuple, torch.Tensor] = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.update(flat(v, path + (k,)))
    return out


def st_dict(obj: Any) -> Dict[str, torch.Tensor]:
    """What safetensors can hold of ``obj``: joined names (the first of colliding ones), contiguous copies
    (``save_file`` refuses shared storages), dtypes it has."""
    out: Dict[str, torch.Tensor] = {}
    for p, t in flat(obj).items():
        name = ".".join(map(str, p))
        if t.dtype in ST_TYPES.values() and name not in out:
            out[name] = t.contiguous().clone()
    return out


def build(c: Dict[str, Any], run: Path) -> Tuple[Path, Dict[str, Dict[tuple, torch.Tensor]], Path]:
    """Save case ``c`` into ``run``; returns ``(unit, {data file name in the unit: {path: original}},
    the file to damage)``.  A pristine ``ckpt_000005.pt`` beside a torch zip unit is the ``--fill-from``."""
    obj, fmt, cb = c["obj"], c["format"], c["chunk_bytes"]
    run.mkdir(parents=True)
    if fmt == "zip":
        unit = run / "ckpt_000010.pt"
        torch.save(obj, unit)
        return unit, {unit.name: flat(obj)}, unit
    if fmt == "zip_sealed":
        with P.publish(run, 10, chunk_bytes=cb) as pub:
            pub.save(obj)
        unit = run / "ckpt_000010.pt"
        return unit, {unit.name: flat(obj)}, unit
    sd = st_dict(obj)
    st_orig = {(k,): v for k, v in sd.items()}
    if fmt == "st":
        unit = run / "model.safetensors"
        unit.write_bytes(st_save(sd))
        return unit, {unit.name: st_orig}, unit
    if fmt == "st_sealed":
        with P.publish(run, 10, name="model.safetensors", chunk_bytes=cb) as pub:
            pub.open().write(st_save(sd))
        unit = run / "model.safetensors"
        return unit, {unit.name: st_orig}, unit
    with P.publish(run, 10, folder=True, chunk_bytes=cb) as pub:
        pub.save(obj, "model.pt")
        pub.open("model.safetensors").write(st_save(sd))
    unit = run / "checkpoint-10"
    target = unit / ("model.pt" if c["bit"] % 2 else "model.safetensors")
    return unit, {"model.pt": flat(obj), "model.safetensors": st_orig}, target


def damage(path: Path, how: str, at: float, bit: int) -> None:
    """Damage ``path`` once, in place (see the module docstring); ``at`` picks where, ``bit`` which bit."""
    raw = bytearray(path.read_bytes())
    if how == "none" or not raw:
        return
    pos = int(at * len(raw))
    if how == "truncate":
        raw = raw[:pos]
    elif how == "flip":
        raw[pos] ^= 1 << bit
    elif how == "zero_page":
        page = pos // 4096 * 4096
        raw[page:page + 4096] = bytes(len(raw[page:page + 4096]))
    elif how == "rewrite_header":
        raw = _rewrite_header(raw, at, bit)
    elif how == "swap_offsets":
        raw = _swap_offsets(raw, at)
    path.write_bytes(bytes(raw))


_SAME_LENGTH = [[b'"F32"', b'"I32"', b'"U32"'], [b'"F16"', b'"I16"', b'"U16"'], [b'"F64"', b'"I64"', b'"U64"'],
                [b'"U8"', b'"I8"'], [b'"BF16"', b'"BOOL"']]


def _st_header(raw: bytearray):
    if len(raw) < 8:
        return None
    n = struct.unpack("<Q", raw[:8])[0]
    try:
        return n, json.loads(bytes(raw[8:8 + n]))
    except ValueError:
        return None


def _rewrite_header(raw: bytearray, at: float, bit: int) -> bytearray:
    """safetensors: one dtype rewritten as another of its length (F32 → I32: the offsets still fit); a torch
    zip: one byte of data.pkl (its first record) overwritten."""
    if raw[:4] == b"PK\x03\x04":
        n, x = struct.unpack("<HH", raw[26:30])
        start, size = 30 + n + x, struct.unpack("<I", raw[18:22])[0] or 64
        raw[start + int(at * size) % max(size, 1)] ^= 1 << bit
        return raw
    head = _st_header(raw)
    if head is None:
        return raw
    n = head[0]
    text = bytes(raw[8:8 + n])
    for group in _SAME_LENGTH:
        for i, dt in enumerate(group):
            if dt in text:
                new = text.replace(dt, group[(i + 1 + bit) % len(group)] if len(group) > 1 else dt, 1)
                raw[8:8 + n] = new
                return raw
    return raw


def _swap_offsets(raw: bytearray, at: float) -> bytearray:
    """safetensors: two tensors' ``data_offsets`` swapped (re-padded to the header's length when it fits); a
    torch zip: the local-header offsets of two central-directory entries swapped."""
    if raw[:4] == b"PK\x03\x04":
        eocd = raw.rfind(b"PK\x05\x06")
        if eocd < 0:
            return raw
        cd = struct.unpack("<I", raw[eocd + 16:eocd + 20])[0]
        entries, pos = [], cd
        while raw[pos:pos + 4] == b"PK\x01\x02":
            n, x, k = struct.unpack("<HHH", raw[pos + 28:pos + 34])
            entries.append(pos)
            pos += 46 + n + x + k
        if len(entries) < 2:
            return raw
        i = int(at * len(entries)) % len(entries)
        a, b = entries[i], entries[(i + 1) % len(entries)]
        raw[a + 42:a + 46], raw[b + 42:b + 46] = raw[b + 42:b + 46], raw[a + 42:a + 46]
        return raw
    head = _st_header(raw)
    if head is None:
        return raw
    n, h = head
    names = [k for k in h if k != "__metadata__"]
    if len(names) < 2:
        return raw
    i = int(at * len(names)) % len(names)
    a, b = names[i], names[(i + 1) % len(names)]
    h[a]["data_offsets"], h[b]["data_offsets"] = h[b]["data_offsets"], h[a]["data_offsets"]
    text = json.dumps(h, separators=(",", ":")).encode()
    if len(text) <= n:
        raw[8:8 + n] = text + b" " * (n - len(text))
    return raw


def check(c: Dict[str, Any], tmp: Path) -> dict:
    """Build, damage and salvage case ``c`` under ``tmp``; assert the property; returns salvage.json."""
    run = tmp / "run"
    unit, originals, target = build(c, run)
    fill = None
    if c["format"] == "zip" and c["bit"] % 2:
        fill = run / "ckpt_000005.pt"
        torch.save(c["obj"], fill)
    damage(target, c["damage"], c["at"], c["bit"])
    out = tmp / "out"
    report = salvage(unit, out, fill_from=fill, include_unproven=c["include_unproven"])
    rows = report["tensors"]
    n_keys = 0
    for file, name in report["outputs"].items():
        got = load_file(str(out / name))
        listed = {r["key"] for r in rows if r["file"] == file and r["key"] is not None}
        assert set(got) == listed, (file, sorted(got), sorted(listed))
        n_keys += len(got)
        for r in rows:
            if r["file"] != file or r["key"] is None or r["status"] not in ("intact", "filled"):
                continue
            orig = originals[file][tuple(r["path"])]  # a filled one came from the pristine copy of the same object
            x = got[r["key"]]
            assert x.dtype == orig.dtype and r["dtype"] == str(orig.dtype).removeprefix("torch."), (r, orig.dtype)
            assert tuple(x.shape) == tuple(orig.shape), (r, orig.shape)
            assert _bytes(x) == _bytes(orig), r
    assert report["written"] == n_keys == sum(r["key"] is not None for r in rows), report["written"]
    return report


def _bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of ``t``'s elements in row-major order (a bool's byte as stored, never normalised)."""
    if not t.numel():
        return b""
    flat = t.contiguous().reshape(-1)
    if flat.stride(0) != 1:  # a one-element expanded view: its one element, repeated
        flat = flat[:1].clone().expand(t.numel()).contiguous()
    return flat.view(torch.uint8).numpy().tobytes()
