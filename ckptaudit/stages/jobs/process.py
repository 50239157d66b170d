"""A stage job's process: the short-lived ``python -m ckptaudit.stages …`` processes of the rules block
``import pandas`` and let Arrow allocate from jemalloc before their work starts.  Library users' processes are
not changed."""

from __future__ import annotations

import gc
import sys
from importlib.abc import MetaPathFinder


class _NoPandas(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError("pandas is not used by ckptaudit stage jobs", name=name)
        return None


def without_pandas() -> None:
    """Make ``import pandas`` fail in this process (stage jobs only).

    pyarrow probes for pandas whenever it builds an array (its pandas shim) and
    importing pandas costs ~0.4 s — more than a small stage job's own work.  The
    short-lived ``python -m ckptaudit.stages`` processes call this first; library
    users never do.
    """
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())


def job_memory_pool() -> str:
    """Make Arrow allocate from jemalloc in this process (stage jobs only, beside :func:`without_pandas`), unless a
    pool other than the wheel's default was chosen already (:func:`forked_job_memory_pool`); returns the pool's
    backend name.

    pyarrow's Linux wheels default to mimalloc, which kept far more of what a stage freed: on a torch.save of
    100,000 tensors (issue 22) the scan job peaked at 403 MB with mimalloc and 298 MB with jemalloc, the state
    job 354 and 279 MB, structure 224 and 195, hash 229 and 213 (GNU time, same inputs).  Where the wheel has
    no jemalloc (``NotImplementedError``) the default pool stays.  Library users' processes are not changed."""
    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "mimalloc":
        return pa.default_memory_pool().backend_name
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:
        pass
    return pa.default_memory_pool().backend_name


def forked_job_memory_pool(stage: str = "") -> str:
    """Make Arrow allocate from the C library's ``malloc`` in a job of ``stage`` forked by the stage job server
    (:mod:`ckptaudit.stages.jobs.server`); returns the pool's backend name.

    jemalloc returns freed pages to the system from its background threads (``background_thread:true`` in the
    configuration Arrow builds it with); a fork keeps no thread, and jemalloc's fork handler disables them in
    the child, so a forked job's freed pages were never returned: the report job of a 10,000-unit run peaked at
    761 MiB forked against 625 MiB in its own process.  In the same fork, the report peaked at 627 MiB with
    ``malloc`` (30.5 s) and 667 MiB with mimalloc (32.0 s); jemalloc with immediate purging
    (``jemalloc_set_decay_ms(0)``) at 611 MiB but 39.7 s (this machine, 2026-12-07).

    In the stages that hold a part's tensor rows as columns, and in the report, which holds every part's rows
    (:data:`FIXED_MMAP_STAGES`), ``malloc``'s threshold for serving a request by a mapping of its own is fixed at
    :data:`MMAP_THRESHOLD_BYTES` (``mallopt``'s ``M_MMAP_THRESHOLD``, glibc's ``mallopt(3)``): by default it rises
    to the size of each mapped block freed, up to 32 MiB, and the blocks below it come from the heap, whose free
    space goes back to the system only from its top.  The structure job of a safetensors header of 1,000,000 entries peaked at 338-474 MiB forked (284 MiB
    in its own process, with jemalloc), 271-276 MiB with the threshold fixed; the structure and state jobs of
    1,000 small units took the same CPU either way (medians of five: 0.93 / 0.94 s, 1.38 / 1.42 s), while a scan
    job of them took 13 % more (2.36 / 2.68 s, six each), so the other stages keep the default.  The report job
    of 50,000 small units peaked at 2,308 MiB forked, 2,118 with the threshold fixed (28.0 / 28.5 CPU-s; 10,000
    units: 538-557 / 511-521 MiB, 4.5-4.9 / 4.3-4.8 CPU-s).  Where the C library has no ``mallopt`` (not glibc)
    nothing changes."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    if stage in FIXED_MMAP_STAGES:
        try:
            import ctypes

            ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        except (OSError, AttributeError):
            pass
    return pa.default_memory_pool().backend_name


#: glibc ``<malloc.h>``: the ``mallopt`` parameter of the mmap threshold
M_MMAP_THRESHOLD = -3
#: a request of at least this many bytes is mapped on its own in a job of :data:`FIXED_MMAP_STAGES`
MMAP_THRESHOLD_BYTES = 2 * 1024 * 1024
#: the stages whose forked jobs fix ``malloc``'s mmap threshold (:func:`forked_job_memory_pool`)
FIXED_MMAP_STAGES = frozenset({"structure", "state", "report"})


#: a stage job's garbage collector runs a young collection every this many allocations (Python's default: 700)
YOUNG_COLLECTION_EVERY = 50_000


def fewer_collections() -> None:
    """Raise the garbage collector's first threshold to :data:`YOUNG_COLLECTION_EVERY` (stage jobs only).

    The stages build a unit's rows, trees and findings as many short-lived dicts and lists, none of them in
    reference cycles, and the collector's default walked them, and every object alive, thousands of times a job:
    the report of a 10,000-unit run took 14.7 s with the default and 9.5 s with this, the scan of a 1,000-unit
    part 5.0 and 4.5 s, state 1.9 and 1.6, structure 1.5 and 1.2, hash 3.3-3.4 and 3.3; peak RSS unchanged
    (GNU time, one process each, this machine, 2026-12-07).  A job's work leaves a few dozen objects in cycles
    (``json``'s encoder closures); a cycle that held a file's bytes (a class made per file in the hash stage's
    plan) made the hash job 35 % slower and 84 MiB larger with this threshold until it was removed, so a
    new one shows in the hash job's peak RSS (``bench_memory.py``).  Library users' processes are not changed."""
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


def freeze_before_exit() -> None:
    """Move every object alive now into the garbage collector's permanent generation (``gc.freeze``), for a
    process that is about to exit (a stage job, the ``ckptaudit`` command).

    The interpreter's shutdown runs a full collection over everything the process imported; with Snakemake,
    pandas and pyarrow loaded that took 0.23-0.26 s of the ``ckptaudit`` command's wall time, and ~0.04 s of
    each stage job's (``python -c "import snakemake.api"``: 0.98-1.02 s, 0.75 s with a freeze first; measured
    here, 2 cores).  Exit handlers, ``finally`` blocks and files' flushing still run as before; only objects
    in reference cycles alive at this point are not collected, which the exit returns to the system anyway.
    Never call it in a process that goes on working (a library user's, pytest's)."""
    gc.freeze()
