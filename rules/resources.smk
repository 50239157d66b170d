# Cluster resources: memory (MiB), runtime (minutes) and threads of each job,
# sized from the bytes of the units it audits (read from the inventory).  The
# sizing itself is plain functions in ckptaudit.cluster (testable without
# Snakemake); local runs ignore runtime, and mem_mb only matters there when
# --resources mem_mb=… is given.
#
# Per-part stages share group "unit": on a cluster, hash → scan → load →
# configdiff → structure → state of a part run as one job, and the profile's
# --group-components unit=N packs N parts into each (config/profiles/slurm).
import os

from snakemake.exceptions import IncompleteCheckpointException

from ckptaudit import cluster

PART_GROUP = "unit"
STAGE_THREADS = 1  # the stages after hash audit a part's units one after another


def get_inventory_done(wildcards):
    """No file: ties a per-part job to the inventory checkpoint.

    The part's params (``get_part_units``) and resources read the inventory.  In the
    main Snakemake process the checkpoint has run before any part job exists; in a
    cluster job Snakemake rebuilds only the submitted jobs, and a job whose inputs do
    not depend on the checkpoint cannot evaluate them ("Rule parameter depends on
    checkpoint but checkpoint output is not defined as input file").  Returns [] once
    the checkpoint is done, so it adds no input file and no re-run trigger."""
    checkpoints.inventory.get()
    return []


_SIZES = {}  # (inventory path, mtime_ns, size) -> ({part: sizes}, run sizes)


def _sizes():
    """({part: (total bytes, largest unit's bytes, units)}, the same for the whole run).

    Resources are evaluated for every job, several times; the inventory is parsed once
    per version of the file.  While the inventory checkpoint has not run (a dry run, or
    a job printed before it) the sizes are empty, so the baselines apply: Snakemake turns
    a resource function's IncompleteCheckpointException into the int 0 and then fails on
    it.  Jobs are sized again once the checkpoint is done."""
    try:
        path = checkpoints.inventory.get().output.json
    except IncompleteCheckpointException:
        return {}, (0, 0, 0)
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _SIZES:
        inv = ws.read_inventory(path)
        _SIZES.clear()
        _SIZES[key] = (cluster.part_sizes(inv), cluster.run_size(inv))
    return _SIZES[key]


def _part_size(wildcards):
    """(total bytes, largest unit's bytes, units) of the job's part."""
    return _sizes()[0].get(wildcards.part, (0, 0, 0))


def get_hash_threads(wildcards):
    """The hash job's threads (ckptaudit.cluster.hash_threads: one per 256 MiB of its part, at most one per
    unit; Snakemake caps it at --cores).  A part packs several units (ckptaudit.stages.inventory.parts.assign_parts) and the job
    hashes them at once, so packing big units costs no parallelism."""
    total, _largest, n = _part_size(wildcards)
    return cluster.hash_threads(total, n)


def get_part_mem_mb(stage):
    """mem_mb of a per-part stage: baseline plus what its largest unit needs."""

    def _mem_mb(wildcards, attempt):
        _total, largest, _n = _part_size(wildcards)
        return cluster.mem_mb_for(stage, largest, attempt, load_limit_mib=config["load"]["memory_limit_mib"])

    _mem_mb.__name__ = f"get_{stage}_mem_mb"
    return _mem_mb


def get_part_runtime(stage):
    """runtime (minutes) of a per-part stage: its bytes at a conservative read rate."""

    def _runtime(wildcards, attempt):
        total, _largest, n = _part_size(wildcards)
        return cluster.runtime_for(stage, total, n, attempt, load_timeout_s=config["load"]["timeout_seconds"])

    _runtime.__name__ = f"get_{stage}_runtime"
    return _runtime


def get_inventory_mem_mb(wildcards, attempt):
    return cluster.mem_mb_for("inventory", 0, attempt)


def get_inventory_runtime(wildcards, attempt):
    return cluster.runtime_for("inventory", 0, 0, attempt)


def get_report_mem_mb(wildcards, attempt):
    _total, _largest, n = _sizes()[1]
    return cluster.mem_mb_for("report", 0, attempt, n_units=n)


def get_report_runtime(wildcards, attempt):
    _total, _largest, n = _sizes()[1]
    return cluster.runtime_for("report", 0, n, attempt)
