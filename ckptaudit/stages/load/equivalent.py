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
import struct
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .compared_bytes import JoinedOffsets, Reader, file_size, outside, stored_records

#: The imports a template's data.pkl may hold: none reads a storage's bytes when torch loads it (the tensor
#: rebuilds of torch/_utils.py for dense tensors, the storage types named in persistent ids, and plain values).
VALUE_BLIND = frozenset({
    "collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state", "torch.Size", "torch.device",
    "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "argparse.Namespace", "builtins.set",
    "builtins.frozenset", "builtins.slice", "_codecs.encode",
})
#: Templates made per group of files of one kind, size and allowed globals: a group whose files keep failing to
#: match (numbers in bound places) stops paying for the walks and loads its files.
MAX_TEMPLATES = 4
#: A safetensors header up to this size is compared.
MAX_HEADER_BYTES = 8 << 20

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
    """What a loaded file holds where another may not differ: ``raw`` (numpy uint8), its bytes at ``regions``
    (numpy int64, rows ``(start, end)``: everything but its tensor data for a torch zip, the length field and
    header of a safetensors file), and where in ``raw`` another file may differ anyway (``free``, numpy bool, or
    None: nowhere); ``index``: its place in the load stage's list of files to load."""

    index: int
    size: int
    regions: Any
    raw: Any
    free: Optional[Any] = None
    #: numpy int array (records × name prefix length), positions in ``raw``: where each record's name holds the
    #: archive's name (torch names the folder inside the zip after the file, ``ckpt_000100/data.pkl``), which
    #: may be another name of :data:`_FOLDER_BYTES`, the same in every record; None: nowhere
    prefixes: Optional[Any] = None
    #: numpy int array, positions in ``raw``: the bytes of ``.data/serialization_id``, which may be other decimal
    #: digits; None: none
    digits: Optional[Any] = None

    def file_offsets(self, positions):
        """The file offsets of ``positions`` in :attr:`raw` (a numpy int array)."""
        import numpy as np

        lengths = self.regions[:, 1] - self.regions[:, 0]
        before = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        i = np.searchsorted(before, positions, side="right") - 1
        return self.regions[i, 0] + positions - before[i]

    def matches(self, other: "bytes | Reader") -> bool:
        """Whether another file (a :class:`Reader`, or its bytes) of :attr:`size` bytes equals :attr:`raw` at
        :attr:`regions` outside :attr:`free`, with one archive name of the same length in every record.  Reads
        only :attr:`regions` of it."""
        import numpy as np

        if not isinstance(other, Reader):
            other = Reader.of(other)
        if other.size != self.size:
            return False
        data = other.spans(self.regions)
        if data is None or len(data) != self.raw.size:
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
    group that match none (at most :data:`MAX_TEMPLATES`); each template's file is loaded.  Reads, of the files
    of groups of two or more, what a template compares (a zip's directory, headers, data.pkl and small records,
    never its tensor data; a safetensors file's header), counted as the stage's reads."""
    groups: Dict[tuple, List[int]] = {}
    for i, p in enumerate(paths):
        size = file_size(p) if p is not None and kinds[i] in ("torch_zip", "safetensors") else -1
        if size > 0:
            groups.setdefault((kinds[i], size, tuple(sorted(benign[i]))), []).append(i)
    out: Dict[int, List[int]] = {}
    for (kind, _size_, _), members in groups.items():
        if len(members) < 2:
            continue
        held: List[Template] = []
        made = 0
        for i in members:
            reader = Reader(paths[i])
            try:
                hit = next((t for t in held if t.matches(reader)), None)
                if hit is not None:
                    out.setdefault(hit.index, []).append(i)
                elif made < MAX_TEMPLATES:
                    made += 1
                    t = (zip_template if kind == "torch_zip" else safetensors_template)(i, reader)
                    if t is not None:
                        held.insert(0, t)
            finally:
                reader.close()
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


def safetensors_template(index: int, reader: "Reader | bytes") -> Optional[Template]:
    """A template of a safetensors file (a :class:`Reader`, or its bytes): another file of the same size must hold
    the same length field and header, byte for byte; None for a header past :data:`MAX_HEADER_BYTES`."""
    import numpy as np

    reader = reader if isinstance(reader, Reader) else Reader.of(reader)
    head = reader.read(0, 8)
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else MAX_HEADER_BYTES + 1
    if n > MAX_HEADER_BYTES or 8 + n > reader.size:
        return None
    regions = np.array([[0, 8 + n]], dtype=np.int64)
    data = reader.spans(regions)
    if data is None:
        return None
    return Template(index, reader.size, regions, np.frombuffer(data, np.uint8).copy())


def zip_template(index: int, reader: "Reader | bytes") -> Optional[Template]:
    """A template of a torch zip (a :class:`Reader`, or its bytes), or None when the module's conditions do not
    hold (a deflated record, two records of one name, records out of order or overlapping, an import outside
    :data:`VALUE_BLIND`, a storage or tensor handed elsewhere than its rebuild, a data.pkl the walk makes no
    template of).  Its regions are the whole file but the tensor data.  Record layout: PKWARE APPNOTE 4.3.7
    (local header), 4.3.9 (data descriptor), 4.3.12 (central directory header), 4.3.16 (end of central
    directory)."""
    import numpy as np

    from ...pickle_walk.streams import MAX_OPS
    from ...pickle_walk.templates import loose_operand_bytes
    from ...pickle_walk.tensor_flow import only_rebuilt

    reader = reader if isinstance(reader, Reader) else Reader.of(reader)
    records = stored_records(reader)
    if records is None:
        return None
    prefix = records[0][0].split("/", 1)[0]
    if not prefix or not all(r[0].startswith(prefix + "/") for r in records):
        return None
    pkl_at = next((r for r in records if r[0] == f"{prefix}/data.pkl"), None)
    pkl = reader.read(pkl_at[2], pkl_at[3] - pkl_at[2]) if pkl_at is not None else b""
    got = loose_operand_bytes(pkl, MAX_OPS) if pkl and len(pkl) == pkl_at[3] - pkl_at[2] else None
    if got is None:
        return None
    res, loose = got
    if any(f"{g.module}.{g.name}" not in VALUE_BLIND and not _storage_type(g) for g in res.globals):
        return None
    if not only_rebuilt(pkl, MAX_OPS):
        return None
    storages = {f"{prefix}/data/{k}" for k in res.storages}
    regions = outside(sorted((r[2], r[3]) for r in records if r[0] in storages), reader.size)
    data = reader.spans(regions)
    if data is None:
        return None
    raw = np.frombuffer(data, np.uint8).copy()
    at = JoinedOffsets(regions)
    free = np.zeros(raw.size, dtype=bool)
    free[at(pkl_at[2]) + np.flatnonzero(loose)] = True
    n = len(prefix.encode())
    names = np.array([[at(o) + i for i in range(n)] for r in records for o in r[4]], dtype=np.int64)
    if not _FOLDER_BYTES[raw[names[0]]].all():
        return None
    free[names.ravel()] = True
    digits = None
    for name, crc_fields, start, end, _ in records:
        for c in crc_fields:
            free[at(c):at(c) + 4] = True
        if name == f"{prefix}/.data/serialization_id" and _DIGITS[raw[at(start):at(start) + end - start]].all():
            digits = np.arange(at(start), at(start) + end - start, dtype=np.int64)
            free[digits] = True
    return Template(index, reader.size, regions, raw, free, names, digits)


def _storage_type(g: Any) -> bool:
    return g.module == "torch" and g.name.endswith("Storage") and g.literal
