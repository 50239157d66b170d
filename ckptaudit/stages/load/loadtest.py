"""Isolated CPU load test: does the framework's own loader accept each file?

Only units without file-layer or security errors are loaded, and only with
``torch.load(path, map_location="cpu", weights_only=True, mmap=True)``
(legacy pre-1.6 files cannot be memory-mapped — torch/serialization.py raises
for ``mmap=True`` on them — so they load without ``mmap`` under the same
limits) or ``safetensors.safe_open``.  Each load runs in a forked child with an
address-space limit (``RLIMIT_AS``) and a wall-clock timeout; torch is
imported once in the parent, so each child costs a ``fork``, not an import.

Globals that the static scan classified as known-benign (``argparse.Namespace``,
numpy scalars …) are allowed for the child with
``torch.serialization.add_safe_globals``; one whose module is not importable
here (e.g. Lightning's ``AttributeDict`` without Lightning) is mapped by name to
``dict`` (``add_safe_globals`` accepts ``(obj, "module.Name")`` pairs since
torch 2.5).

Errors are classified into plain words (:func:`explain`); the raw message stays
in the ``load`` table for the postmortem, never in the headline.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

from ... import findings as F
from ... import roles
from ... import fs, producers
from ..rows import LoadRow
from . import equivalent, whole_modules
from .remote_copy import skeleton, with_tensor_data
from .child import batched_loads, load_file, read_chars, resolve_benign  # noqa: F401 - resolve_benign re-exported

LOADABLE = ("torch_zip", "torch_legacy", "safetensors")

# (substring of the error, plain words).  Sources: messages of
# torch/serialization.py, caffe2/serialize/inline_container.cc (PytorchStreamReader)
# and torch/_weights_only_unpickler.py in torch 2.x.
_EXPLAIN: List[Tuple[str, str]] = [
    ("failed finding central directory", "the zip central directory is missing (the file is truncated)"),
    ("failed reading zip archive", "the zip archive is damaged or truncated"),
    ("invalid header or archive is corrupted", "a zip record header is damaged"),
    ("Unsupported global", "the pickle names a global that weights_only does not allow"),
    ("Unsupported operand", "the bytes are not a pickle torch can read (text, an LFS pointer, or garbage)"),
    ("invalid load key", "the file is not a torch.save file (wrong first byte)"),
    ("Ran out of input", "the pickle ends early (the file is truncated)"),
    ("unexpected EOF", "the file ends early (truncated)"),
    ("storage has wrong byte size", "a tensor's storage has the wrong size (truncated or overwritten)"),
    ("size mismatch", "a tensor's size disagrees with its storage"),
    ("Cannot allocate memory", "the load ran out of its memory limit"),
    ("MemoryError", "the load ran out of its memory limit"),
    ("HeaderTooLarge", "the safetensors header length is impossible"),
    ("MetadataIncompleteBuffer", "the safetensors data is shorter than its header says"),
    ("InvalidHeaderDeserialization", "the safetensors JSON header is broken"),
    ("Weights only load failed", "torch refused the pickle under weights_only=True"),
    ("with TorchScript archives", "it is a TorchScript archive (torch.jit.save): torch.load refuses it under "
                                  "weights_only=True; torch.jit.load reads it"),
    ("legacy .tar format", "it is a legacy .tar torch file: torch.load refuses it under weights_only=True"),
    # ckptaudit.stages.load.reader.ChangedSinceVerified: the reader loads only the bytes it verified
    ("changed after its bytes were verified", "the file changed after its bytes were verified (renamed over or "
                                              "rewritten): not loaded"),
    ("was written while it was loaded", "the file changed after its bytes were verified (written while it was "
                                        "loaded): not used"),
]


def explain(message: str) -> str:
    for needle, words in _EXPLAIN:
        if needle in message:
            return words
    return "the loader raised an error the audit does not recognise (see the load table)"


def failed_load(e: BaseException) -> Dict:
    """The result of a load that raised ``e``: status ``memory`` for a ``MemoryError`` or an allocation failure
    (torch's "… alloc … memory" messages), else ``failed``; the error's type and message."""
    if isinstance(e, MemoryError):
        return {"status": "memory", "error_type": "MemoryError", "error_message": str(e)[:2000]}
    msg = str(e)
    status = "memory" if "alloc" in msg.lower() and "memory" in msg.lower() else "failed"
    return {"status": status, "error_type": type(e).__name__, "error_message": msg[:4000]}


def _child(path: str, kind: str, benign: List[str], limit_bytes: int, wfd: int) -> None:
    """Runs in the forked child: limit memory, load, report over the pipe, exit."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    except (ValueError, OSError):
        pass
    result: Dict = {}
    rchar0 = read_chars()
    try:
        import torch

        torch.set_num_threads(1)
        if kind == "safetensors":
            import safetensors  # noqa: F401 - imported before the count starts
        rchar0 = read_chars()  # the load's own reads: imports (a cold .pyc cache reads MBs of sources) not counted
        result = load_file(path, kind, benign)
    except BaseException as e:  # noqa: BLE001 - the child reports every failure as data
        result = failed_load(e)
    result["read_bytes"] = max(0, read_chars() - rchar0)
    try:
        os.write(wfd, json.dumps(result).encode())
    finally:
        os._exit(0)


_CHILD_BYTES = threading.local()  # per thread: the load server serves each load job on a thread of its own


def child_bytes_read() -> int:
    """Bytes the load children started by this thread read so far (each child's ``rchar`` around its load)."""
    return getattr(_CHILD_BYTES, "n", 0)


def count_child_bytes(n: int) -> None:
    """Add ``n`` bytes that load children read on this thread's behalf (a load server's answer)."""
    _CHILD_BYTES.n = child_bytes_read() + n


#: Kinds the child maps rather than reads (``torch.load(mmap=True)``, ``safe_open``): their mapping takes the
#: file's size of address space, which RLIMIT_AS counts although the pages are the file's, not the heap's.
MAPPED_KINDS = ("torch_zip", "safetensors")


def load_in_child(path: str, kind: str, benign: List[str], *, timeout_seconds: float,
                  memory_limit_bytes: int) -> Dict:
    """Fork a child that loads ``path``; return {status, error_type, error_message,
    load_seconds, peak_rss_bytes, n_top_level_keys, n_tensors}.  status is ok | failed |
    timeout | memory.

    ``memory_limit_bytes`` (``load.memory_limit_mib``) is what the load may allocate: the child's
    ``RLIMIT_AS`` is that plus the file's size for a kind it maps (:data:`MAPPED_KINDS`), so a 9 GiB
    checkpoint under an 8 GiB limit is load-tested, not called unusable for the size of its own mapping."""
    if kind in MAPPED_KINDS:
        try:
            memory_limit_bytes += os.path.getsize(path)
        except OSError:
            pass  # the child's open fails and says why
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        _child(path, kind, benign, memory_limit_bytes, w)
    os.close(w)
    chunks, timed_out = _read_until(r, t0 + timeout_seconds)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    os.close(r)
    dt = time.perf_counter() - t0
    rss = int(usage.ru_maxrss) * 1024  # Linux reports KiB
    if timed_out:
        return {"status": "timeout", "error_type": "Timeout", "error_message": f"killed after {timeout_seconds} s",
                "load_seconds": dt, "peak_rss_bytes": rss}
    try:
        res = json.loads(b"".join(chunks).decode() or "{}")
    except ValueError:
        res = {}
    if not res:
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        res = {"status": "memory" if sig == signal.SIGKILL else "failed", "error_type": "ChildDied",
               "error_message": f"load child exited with status {status} (signal {sig})"}
    res.update(load_seconds=dt, peak_rss_bytes=rss)
    count_child_bytes(int(res.pop("read_bytes", 0) or 0))
    return res


def _read_until(r: int, deadline: float) -> Tuple[List[bytes], bool]:
    """``(chunks, timed_out)``: what the pipe ``r`` gave until its writer closed it, or until ``deadline``
    (a ``time.perf_counter()`` value) passed (``timed_out`` True)."""
    chunks: List[bytes] = []
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return chunks, True
        ready, _, _ = select.select([r], [], [], left)
        if not ready:
            continue
        data = os.read(r, 1 << 16)
        if not data:
            return chunks, False
        chunks.append(data)


def unreadable(path: str, why: str) -> F.Finding:
    """``load_failed`` for a file the hash stage could not even read (``why``), so no load can succeed
    (:func:`ckptaudit.stages.hash.hash_unit`); a load that fails in its isolated child is :func:`load_units`'."""
    return F.make("load_failed", path=path, why=why)


def load_units(run_dir: Path, units: List[dict], scans: Dict[str, dict], cfg: dict,
               loader: Callable | None = None, facts=None) -> List[LoadRow]:
    """Rows of the ``load`` table for ``units`` (:class:`ckptaudit.stages.rows.LoadRow`).

    ``scans`` maps unit → its ``scan`` row; ``facts``: the hash stage's
    (:class:`ckptaudit.onepass.facts.ByteFacts`), which name a remote object's tensor data for its sparse copy
    (:mod:`ckptaudit.stages.load.remote_copy`) and hold the bytes that copy is served from (``facts.kept``); a
    unit with a file or security error is skipped (and never opened by torch), as are all units when
    ``load.enabled`` is false.  ``loader``: what loads the files to load, with :func:`load_todo`'s
    arguments (``kept=`` among them: ``facts.kept``) and results (default: that function, in this process); the
    load stage passes the audit's load server's (:func:`ckptaudit.stages.load.server.loader`), which gives the
    same rows.
    """
    lcfg = cfg.get("load", {})
    timeout = float(lcfg.get("timeout_seconds", 120))
    limit = int(lcfg.get("memory_limit_mib", 8192)) << 20
    rows: List[LoadRow] = []
    todo: List[Tuple[dict, str, str, List[str]]] = []
    for u in units:
        _plan_unit(run_dir, u, scans.get(u["unit"]), lcfg, facts, rows, todo)
    if todo:
        results = equivalent.load_or_follow(run_dir, todo, cfg, timeout, limit, loader or load_todo,
                                            None if facts is None else facts.kept)
        modules: Dict[str, Dict[str, List[str]]] = {}  # unit -> its whole-module pickles, read when one failed
        for (u, f, k, benign), res in zip(todo, results):
            if res.get("status") not in (None, "ok") and u["unit"] not in modules:
                modules[u["unit"]] = whole_modules.modules_by_file(scans.get(u["unit"]) or {})
            rows.append(_load_row(u["unit"], f, res, timeout, limit,
                                  whole_modules.classes_in(f, modules.get(u["unit"]) or {})))
    return rows


def _plan_unit(run_dir: Path, u: dict, s: dict | None, lcfg: dict, facts, rows: List[LoadRow],
               todo: List[Tuple[dict, str, str, List[str]]]) -> None:
    """The files of unit ``u`` (its scan row ``s``) to load, appended to ``todo``; a row to ``rows`` for each
    file or the whole unit not loaded, and why."""
    if s is None:
        rows.append(_skip(u["unit"], "", "the unit was not scanned"))
        return
    if not s["security_ok"]:
        rows.append(_skip(u["unit"], "", "security: the static scan found imports that could run code"))
        return
    damaged = set()
    if not s["file_ok"]:
        if not roles.weights_intact(s):
            rows.append(_skip(u["unit"], "", "file layer: the bytes are already known to be damaged"))
            return
        damaged = set(roles.damaged_files(json.loads(s.get("findings_json") or "[]")))
        for f in sorted(damaged):
            rows.append(_skip(u["unit"], f, "file layer: this file's bytes are already known to be damaged"))
    if not lcfg.get("enabled", True):
        rows.append(_skip(u["unit"], "", "load test disabled in the config (load.enabled: false)"))
        return
    unit_facts = json.loads(s.get("facts_json") or "{}")
    kinds = unit_facts.get("file_kinds", {})
    # training_args.bin is not read on resume (transformers Trainer) and pickles
    # TrainingArguments, which needs transformers installed to rebuild
    loadable = [(f, k) for f, k in kinds.items() if k in LOADABLE and not f.endswith("training_args.bin")
                and f not in damaged]
    if not loadable:
        rows.append(_skip(u["unit"], "", "no file of this unit has a weights_only loader "
                                         f"(layout {s['layout']})"))
        return
    per_file = unit_facts.get("benign_by_file")
    for f, k in loadable:
        benign = per_file.get(f, []) if isinstance(per_file, dict) else list(s.get("benign_globals") or [])
        absent = missing_packages(benign)
        if absent:
            rows.append(_not_checked(u["unit"], f, absent))
            continue
        todo.append((with_tensor_data(u, run_dir, f, facts), f, k, benign))


def _load_row(unit: str, f: str, res: dict, timeout: float, limit: int, module_classes: List[str]) -> LoadRow:
    """The ``load`` row of file ``f`` from its child's result ``res``, with a finding when it did not load: a
    refusal of a file that pickles whole modules (``module_classes``) is :func:`ckptaudit.stages.load.whole_modules.refusal`,
    not ``load_failed``."""
    if "skipped_reason" in res:
        return _skip(unit, f, res["skipped_reason"])
    fl = []
    if res["status"] == "timeout":
        fl.append(F.make("load_timeout", path=f, timeout_seconds=timeout))
    elif res["status"] == "memory":
        fl.append(F.make("load_memory_limit", path=f, memory_limit_bytes=limit))
    elif res["status"] != "ok":
        fl.append(whole_modules.refusal(f, module_classes, res.get("error_message", ""))
                  or F.make("load_failed", path=f, why=explain(res.get("error_message", ""))))
    return LoadRow(unit=unit, file=f, status=res["status"], skipped_reason="",
                   error_type=res.get("error_type", ""), error_message=res.get("error_message", ""),
                   load_seconds=res["load_seconds"], peak_rss_bytes=res["peak_rss_bytes"],
                   n_top_level_keys=res.get("n_top_level_keys"), n_tensors=res.get("n_tensors"),
                   loaded_as=res.get("loaded_as", ""), findings=tuple(fl))


def load_todo(run_dir: Path, todo: List[Tuple[dict, str, str, List[str]]], cfg: dict, timeout: float,
              limit: int, kept=None) -> List[Dict]:
    """Load each (unit, file, kind, allowed globals) of ``todo`` in forked children (:func:`load_in_child`; small
    local files share a child, :mod:`ckptaudit.stages.load.child`); one result per item, in order: ``load_in_child``'s
    dict, or ``{"skipped_reason": why}`` for a remote object that could not be copied for the load.  Imports
    torch (once per process) so each child is a fork, not an import; the load server
    (:mod:`ckptaudit.stages.load.server`) runs this on a thread per load job.  Adds the children's reads to this
    thread's :func:`child_bytes_read`.  ``kept``: bytes of remote objects already read
    (:class:`ckptaudit.fs.kept.KeptBytes`, or None), which a remote object's copy is served from first."""
    import torch  # noqa: F401 - imported once here so each forked child is cheap

    batched = batched_loads(run_dir, todo, timeout, limit, alone=load_in_child)  # small local files
    out: List[Dict] = []
    for i, (u, f, k, benign) in enumerate(todo):
        src, scratch = run_dir / f, None
        if fs.is_remote(src):  # object storage: download to a scratch folder under a size limit
            dl_limit = int((cfg.get("s3") or {}).get("download_limit_mib", 4096)) << 20
            scratch = tempfile.mkdtemp(prefix="ckptaudit-load-")
            try:
                local = (skeleton(src, k, scratch, dl_limit, (u.get("tensor_data") or {}).get(f), kept)
                         or fs.download(src, scratch, dl_limit, kept=kept))
            except OSError as e:
                local, why = None, f"cannot download the object: {type(e).__name__}"
            else:
                why = (f"the object is {fs.size(src)} bytes, over s3.download_limit_mib "
                       f"({dl_limit >> 20} MiB): not downloaded for the load test")
            if local is None:
                shutil.rmtree(scratch, ignore_errors=True)
                out.append({"skipped_reason": why})
                continue
            src = local
        try:
            res = batched.get(i) or load_in_child(str(src), k, benign, timeout_seconds=timeout,
                                                  memory_limit_bytes=limit)
            count_child_bytes(int(res.pop("read_bytes", 0) or 0))  # a batched load's own reads
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        out.append(res)
    return out


def missing_packages(qualnames: List[str]) -> List[str]:
    """Top-level packages of ``qualnames`` that cannot be imported where the audit runs.

    Classes the load test must allowlist are imported in the child; when their
    package is absent the file cannot be checked here (it is no fault of the
    file).  Names that the repair maps to ``dict`` (Lightning's AttributeDict)
    need nothing installed.  Looked up with ``importlib.util.find_spec``, which
    imports nothing.
    """
    import importlib.util

    from ...security import BENIGN

    out = set()
    for q in qualnames:
        b = BENIGN.get(q)
        if b is not None and b.add_safe.startswith("(dict,"):
            continue
        top = q.split(".", 1)[0]
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.add(top)
    return sorted(out)


def _not_checked(unit: str, file: str, packages: List[str]) -> LoadRow:
    f = F.make("load_not_checked", path=file, packages=", ".join(packages),
               install=" ".join(PIP_NAMES.get(p, p) for p in packages))
    return _skip(unit, file, f"not checked: needs {', '.join(packages)} (import failed)", (f,))


#: Module -> pip package, for the install line of a load that needs a framework (the producers' modules say).
PIP_NAMES = producers.PIP_NAMES


def skip_row(unit: str, file: str, why: str, findings: Tuple[F.Finding, ...] = ()) -> LoadRow:
    """A ``load`` row for a file (or unit) that was not loaded, and why, with ``findings``."""
    return _skip(unit, file, why, findings)


def _skip(unit: str, file: str, why: str, findings: Tuple[F.Finding, ...] = ()) -> LoadRow:
    return LoadRow(unit=unit, file=file, status="skipped", skipped_reason=why, error_type="", error_message="",
                   load_seconds=0.0, peak_rss_bytes=0, n_top_level_keys=None, n_tensors=None, findings=findings)

