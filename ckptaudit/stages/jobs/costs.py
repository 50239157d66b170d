"""What each job run in the stage job server (:mod:`ckptaudit.stages.jobs.server`) cost: one JSON line per job in
``<work>/stage_jobs.jsonl``, written by the server as it reaps the job's forked child (``wait4``).

Snakemake's ``benchmark:`` file of such a job measures the job's own process, which only waited for the child;
the report's cost table and the benchmarks take the child's CPU and peak RSS from here.  Each line:
``{"stage", "part" ("" for a once-per-audit stage), "status" (exit status, a signal's negative), "wall_s",
"cpu_s" (user + system seconds), "max_rss_mib"}``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: the file, in the audit's work folder
JOBS_NAME = "stage_jobs.jsonl"


def job_costs(work_dir: str | os.PathLike) -> dict:
    """{(stage, part or stage): {"cpu_s", "max_rss_mib", "wall_s", "status"}} of the jobs the server of
    ``work_dir`` ran (a job run again counts its last run); empty without a server.  Snakemake's ``benchmark:``
    file of such a job measures its own process, which only waited: these are the forked child's (``wait4``)."""
    out: dict = {}
    try:
        with open(Path(work_dir) / JOBS_NAME) as f:
            for line in f:
                try:
                    d = json.loads(line)
                    out[(d["stage"], d.get("part") or d["stage"])] = d
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out
