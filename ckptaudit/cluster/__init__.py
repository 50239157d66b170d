"""Cluster execution: resource sizing for the rules, and a single-node SLURM for tests and CI.

A face (stdlib only: ``rules/resources.smk`` imports it, and ``.ci/slurm-setup.sh`` runs
``python3 -m ckptaudit.cluster start`` with the system python before any venv exists):

* :mod:`.sizing` — :func:`mem_mb_for`, :func:`runtime_for`, :func:`part_size` for the rules'
  ``resources:`` and :func:`hash_threads` for the hash rule's ``threads:`` (MiB and minutes, growing with the ``attempt`` number);
* :mod:`.local_slurm` — :func:`start_local_slurm` / :func:`stop_local_slurm`, a one-node
  ``slurm-wlm`` + ``munge`` cluster, and :data:`LOCAL_EXECUTOR_ARGS` for Snakemake's executor;
* ``python -m ckptaudit.cluster start|stop|status`` (:mod:`.__main__`).
"""

from .local_slurm import (DEFAULT_CONF, DEFAULT_STATE, LOCAL_EXECUTOR_ARGS, MARKER, PARTITION, SLURM_BINARIES,
                          USABLE_STATES, LocalSlurm, SlurmSetupError, cluster_ready, munge_works, node_states,
                          slurm_conf_text, slurm_installed, start_local_slurm, stop_local_slurm)
from .sizing import (BASE_MEM_MB, BASE_RUNTIME_MIN, DEFAULT_BASE_RUNTIME_MIN, DEFAULT_SECONDS_PER_UNIT,
                     HASH_BYTES_PER_THREAD, MEM_MB_PER_UNIT, MEM_PER_UNIT_BYTE, MIB, READ_MIB_PER_S, SECONDS_PER_UNIT,
                     hash_threads, mem_mb_for, part_size, part_sizes, run_size, runtime_for)

__all__ = ["BASE_MEM_MB", "BASE_RUNTIME_MIN", "DEFAULT_BASE_RUNTIME_MIN", "DEFAULT_CONF", "DEFAULT_SECONDS_PER_UNIT",
           "DEFAULT_STATE", "HASH_BYTES_PER_THREAD", "LOCAL_EXECUTOR_ARGS", "MARKER", "MEM_MB_PER_UNIT", "MEM_PER_UNIT_BYTE", "MIB",
           "PARTITION", "READ_MIB_PER_S", "SECONDS_PER_UNIT", "SLURM_BINARIES", "USABLE_STATES", "LocalSlurm",
           "SlurmSetupError", "cluster_ready", "hash_threads", "main", "mem_mb_for", "munge_works", "node_states", "part_size",
           "part_sizes", "run_size", "runtime_for", "slurm_conf_text", "slurm_installed", "start_local_slurm",
           "stop_local_slurm"]


def __getattr__(name):  # `main` lives in __main__; imported on demand so `python -m` does not warn
    if name == "main":
        from .__main__ import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
