"""Files whose load would repeat another's: one real load per shape of file, the others shown to load as it did.

A run's checkpoints of one model come from one ``torch.save`` call: file for file, their bytes differ in the
tensor data, in literal numbers of data.pkl (the step, the loss, a learning rate), in the random
``.data/serialization_id``, in the CRC-32 fields and in the archive's folder name (torch names it after the file).
What ``torch.load(path, weights_only=True, mmap=True)`` does with a file depends on none of them, under the
conditions a template checks:

* tensor data is mapped, not read, while dense tensors are rebuilt (torch/serialization.py ``_load``,
  torch/_utils.py ``_rebuild_tensor_v2``): a template's data.pkl hands every storage only to its tensor's rebuild
  and every tensor only to plain containers or a parameter's rebuild
  (:func:`ckptaudit.pickle_walk.tensor_flow.only_rebuilt`; ``torch.Size`` of an int tensor, a ``BUILD`` on a
  tensor or a quantized or sparse rebuild would read values), and imports nothing outside :data:`VALUE_BLIND`;
* torch 2.13's zip reader checks no CRC-32 on a load (``tests/test_equivalent_loads.py`` flips each CRC field of
  a real file and loads it, so a torch that starts checking them fails that test);
* ``.data/serialization_id`` is decoded as text and logged (``_log_api_usage_metadata``): torch writes decimal
  digits there, and another file's may differ only by other digits;
* the folder name may be another of the same length, the same in every record, of letters, digits, ``.``,
  ``_`` or ``-`` (torch's reader takes the folder from the first record and looks the others up under it; a NUL
  ends its lookup early);
* a *loose* number of data.pkl (:func:`ckptaudit.pickle_walk.templates.loose_operand_bytes`) is only stored in a
  plain container, never passed to a call, used as a key, shared through the memo or read by a persistent id.

So a file of the same size and allowed globals whose bytes equal a loaded file's everywhere else loads as that
file did: its ``load`` row says so (``loaded_as``, the file whose load stands for it) and no child loads it.  A
file that matches no loaded file is loaded.  The records' payloads that may differ are known only from a zip
whose records are stored (not deflated), have distinct names (ignoring case), lie one after another in the order
of their local headers and end before the central directory: anything else gets no template.  safetensors:
``safe_open`` reads the 8-byte header length and the JSON header and checks the offsets in it against the file's
size (safetensors' format page), and a tensor read copies bytes, so a file of the same size with the same header
loads as the other did.

The reader (:class:`ckptaudit.stages.load.reader.ReaderLoads`) returns the objects it loads and loads every file.
"""

from __future__ import annotations

import dataclasses
import io
import os
import struct
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

#: The imports a template's data.pkl may hold: none reads a storage's bytes when torch loads it (the tensor
#: rebuilds of torch/_utils.py for dense tensors, the storage types named in persistent ids, and plain values).
VALUE_BLIND = frozenset({
    "collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state", "torch.Size", "torch.device",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "argparse.Namespace", "builtins.set",
    "builtins.frozenset", "builtins.slice", "_codecs.encode",
})
#: Files up to this size get a template (both it and a candidate are read whole, from the page cache the hash
#: stage left them in); a larger file's load costs little beside its hash.
MAX_FILE_BYTES = 8 << 20
#: Templates made per group of files of one kind, size and allowed globals: a group whose files keep failing to
#: match (numbers in bound places) stops paying for the walks and loads its files.
MAX_TEMPLATES = 4
#: A safetensors header up to this size is compared.
MAX_HEADER_BYTES = 8 << 20

_LOCAL, _CENTRAL, _DESCRIPTOR = b"PK\x03\x04", b"PK\x01\x02", b"PK\x07\x08"


def _byte_set(chars: bytes):
    import numpy as np

    out = np.zeros(256, dtype=bool)
    out[np.frombuffer(chars, np.uint8)] = True
    return out


#: bytes a folder name may hold in a file that follows a template; decimal digits (a serialization id)
_FOLDER_BYTES = _byte_set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_DIGITS = _byte_set(b"0123456789")


@dataclasses.dataclass
class Template:
    """A loaded file's bytes (``raw``, numpy uint8: the whole file, or a safetensors file's header) and where
    another file may differ from them (``free``, numpy bool, or None: nowhere); ``index``: its place in the load
    stage's list of files to load."""

    index: int
    raw: Any
    free: Optional[Any]
    #: numpy int array (records × name prefix length): where each record's name holds the archive's name (torch
    #: names the folder inside the zip after the file, ``ckpt_000100/data.pkl``), which may be another name of
    #: :data:`_FOLDER_BYTES`, the same in every record; None: nowhere
    prefixes: Optional[Any] = None
    #: numpy int array: the bytes of ``.data/serialization_id``, which may be other decimal digits; None: none
    digits: Optional[Any] = None

    def matches(self, data: bytes) -> bool:
        """Whether ``data`` (the same span of another file of the same size) equals :attr:`raw` outside
        :attr:`free`, with one archive name of the same length in every record."""
        import numpy as np

        if len(data) != self.raw.size:
            return False
        u = np.frombuffer(data, np.uint8)
        diff = np.flatnonzero(u != self.raw)
        if diff.size == 0:
            return True
        if self.free is None or not self.free[diff].all():
            return False
        if self.digits is not None and not _DIGITS[u[self.digits]].all():
            return False
        if self.prefixes is None:
            return True
        names = u[self.prefixes]
        return bool((names == names[0]).all() and _FOLDER_BYTES[names[0]].all())


def plan(paths: List[Optional[str]], kinds: List[str], benign: List[List[str]]) -> Dict[int, List[int]]:
    """{index of a file to load: indexes of the files shown to load as it does}: ``paths[i]`` (a local path, or
    None for a file that must be loaded: a remote object), of kind ``kinds[i]``, loaded with ``benign[i]`` allowed.
    Files of one kind, size and allowed globals are compared with templates made from the first files of the
    group that match none (at most :data:`MAX_TEMPLATES`); each template's file is loaded.  Reads the files of
    groups of two or more (up to :data:`MAX_FILE_BYTES` each, a safetensors file's header only)."""
    groups: Dict[tuple, List[int]] = {}
    for i, p in enumerate(paths):
        size = _size(p) if p is not None and kinds[i] in ("torch_zip", "safetensors") else -1
        if 0 < size and (kinds[i] == "safetensors" or size <= MAX_FILE_BYTES):
            groups.setdefault((kinds[i], size, tuple(sorted(benign[i]))), []).append(i)
    out: Dict[int, List[int]] = {}
    for (kind, _size_, _), members in groups.items():
        if len(members) < 2:
            continue
        held: List[Template] = []
        made = 0
        for i in members:
            data = _span(paths[i], kind)
            hit = next((t for t in held if data is not None and t.matches(data)), None)
            if hit is not None:
                out.setdefault(hit.index, []).append(i)
                continue
            if made < MAX_TEMPLATES and data is not None:
                made += 1
                t = (zip_template if kind == "torch_zip" else safetensors_template)(i, paths[i], data)
                if t is not None:
                    held.insert(0, t)
    return out


def load_or_follow(run_dir: Path, todo: List[Tuple[dict, str, str, List[str]]], cfg: dict, timeout: float,
                   limit: int, loader: Callable, kept) -> List[Dict]:
    """``loader``'s results for ``todo`` ((unit, file, kind, allowed globals) of
    :func:`ckptaudit.stages.load.loadtest.load_units`), in order; a file shown to load as another of ``todo`` does
    (:func:`plan`, unless ``load.by_equivalence`` is false or the loader loads every file) takes that file's
    ``ok`` with ``loaded_as`` naming it, and is loaded itself when that file did not load."""
    from ... import fs

    follows: Dict[int, List[int]] = {}
    if cfg.get("load", {}).get("by_equivalence", True) and not getattr(loader, "loads_every_file", False):
        follows = plan([None if fs.is_remote(run_dir / f) else str(run_dir / f) for _, f, _, _ in todo],
                       [k for _, _, k, _ in todo], [list(b) for _, _, _, b in todo])
    followers = {j for js in follows.values() for j in js}
    first = [i for i in range(len(todo)) if i not in followers]
    results: List[Dict] = [{}] * len(todo)
    for i, res in zip(first, loader(run_dir, [todo[i] for i in first], cfg, timeout, limit, kept=kept)):
        results[i] = res
    again = []
    for i, js in follows.items():
        if results[i].get("status") == "ok":
            for j in js:
                results[j] = {"status": "ok", "load_seconds": 0.0, "peak_rss_bytes": 0, "loaded_as": todo[i][1],
                              "n_top_level_keys": results[i].get("n_top_level_keys"),
                              "n_tensors": results[i].get("n_tensors")}
        else:
            again.extend(js)
    again.sort()
    for j, res in zip(again, loader(run_dir, [todo[j] for j in again], cfg, timeout, limit, kept=kept)
                      if again else []):
        results[j] = res
    return results


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _span(path: str, kind: str) -> Optional[bytes]:
    """The bytes a template compares: a torch zip whole (up to one byte past :data:`MAX_FILE_BYTES`), a safetensors
    file's length field and JSON header (None past :data:`MAX_HEADER_BYTES` or unreadable)."""
    try:
        with open(path, "rb") as f:
            if kind != "safetensors":
                return f.read(MAX_FILE_BYTES + 1)
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else MAX_HEADER_BYTES + 1
            return head + f.read(n) if n <= MAX_HEADER_BYTES else None
    except OSError:
        return None


def safetensors_template(index: int, path: str, data: bytes) -> Optional[Template]:
    """A template of a safetensors file whose first bytes are ``data`` (its length field and header): another
    file of the same size must hold the same header, byte for byte."""
    import numpy as np

    if len(data) < 8 or len(data) != 8 + struct.unpack_from("<Q", data)[0]:
        return None
    return Template(index, np.frombuffer(data, np.uint8).copy(), None)


def zip_template(index: int, path: str, data: bytes) -> Optional[Template]:
    """A template of a torch zip whose bytes are ``data``, or None when the module's conditions do not hold
    (a deflated record, records out of order or overlapping, an import outside :data:`VALUE_BLIND`, a data.pkl
    the walk does not make a template of).  Record layout: PKWARE APPNOTE 4.3.7 (local header), 4.3.9 (data
    descriptor), 4.3.12 (central directory header), 4.3.16 (end of central directory)."""
    import numpy as np

    from ...pickle_walk.streams import MAX_OPS
    from ...pickle_walk.templates import loose_operand_bytes
    from ...pickle_walk.tensor_flow import only_rebuilt

    records = _records(data)
    if records is None:
        return None
    free = np.zeros(len(data), dtype=bool)
    prefix = records[0][0].split("/", 1)[0]
    if not prefix or not all(r[0].startswith(prefix + "/") for r in records):
        return None
    pkl_at = next((r for r in records if r[0] == f"{prefix}/data.pkl"), None)
    if pkl_at is None:
        return None
    got = loose_operand_bytes(data[pkl_at[2]:pkl_at[3]], MAX_OPS)
    if got is None:
        return None
    res, loose = got
    if any(f"{g.module}.{g.name}" not in VALUE_BLIND and not _storage_type(g) for g in res.globals):
        return None
    if not only_rebuilt(data[pkl_at[2]:pkl_at[3]], MAX_OPS):
        return None
    free[pkl_at[2]:pkl_at[3]] = loose
    storages = {f"{prefix}/data/{k}" for k in res.storages}
    raw = np.frombuffer(data, np.uint8).copy()
    n = len(prefix.encode())
    names = np.array([[at + i for i in range(n)] for r in records for at in r[4]], dtype=np.int64)
    if not _FOLDER_BYTES[raw[names[0]]].all():
        return None
    free[names.ravel()] = True
    digits = None
    for name, crc_fields, start, end, _ in records:
        for at in crc_fields:
            free[at:at + 4] = True
        if name in storages:
            free[start:end] = True
        elif name == f"{prefix}/.data/serialization_id" and _DIGITS[raw[start:end]].all():
            digits = np.arange(start, end, dtype=np.int64)
            free[start:end] = True
    return Template(index, raw, free, names, digits)


def _storage_type(g: Any) -> bool:
    return g.module == "torch" and g.name.endswith("Storage") and g.literal


def _records(data: bytes) -> Optional[List[Tuple[str, Tuple[int, ...], int, int, Tuple[int, int]]]]:
    """``(name, offsets of its CRC-32 fields, payload start, payload end, offsets of its name in the central
    directory and the local header)`` of each record of the zip ``data``, in archive order; None unless every
    record is stored, the local headers agree with the central directory on the name, and the records follow one
    another without overlap up to the central directory."""
    import zipfile

    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
        cd = zf.start_dir
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error):
        return None
    if len({i.filename.casefold() for i in infos}) != len(infos):  # a reader finds one of two equal names
        return None
    out = []
    at = cd
    for info in infos:  # central directory entries, in their order (4.3.12: fixed 46 bytes, then n, m, k)
        if data[at:at + 4] != _CENTRAL or info.compress_type != 0 or info.compress_size != info.file_size:
            return None
        n, m, k = struct.unpack_from("<HHH", data, at + 28)
        lho = info.header_offset
        if data[lho:lho + 4] != _LOCAL:
            return None
        ln, lm = struct.unpack_from("<HH", data, lho + 26)
        start = lho + 30 + ln + lm
        if data[lho + 30:lho + 30 + ln] != data[at + 46:at + 46 + n]:
            return None
        crcs = [at + 16, lho + 14]
        end = start + info.compress_size
        if info.flag_bits & 0x8:  # a data descriptor follows the payload, with or without its signature
            crcs.append(end + 4 if data[end:end + 4] == _DESCRIPTOR else end)
        out.append((info.filename, tuple(crcs), start, end, (at + 46, lho + 30)))
        at += 46 + n + m + k
    order = sorted(range(len(out)), key=lambda i: infos[i].header_offset)
    limit = [infos[i].header_offset for i in order[1:]] + [cd]
    for i, nxt in zip(order, limit):  # each record (and its descriptor's CRC) ends before the next one starts
        if max([out[i][3]] + [c + 4 for c in out[i][1][1:]]) > nxt:
            return None
    return out if out else None
