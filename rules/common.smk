# Config validation, paths, wildcard constraints and named input functions.
# Logic lives in the ckptaudit package (plain functions, testable without
# Snakemake); nothing heavy is imported here.
import json
import os
import shlex
import sys

from snakemake.utils import validate

import ckptaudit
from ckptaudit.stages.load import server as load_server
from ckptaudit.stages.jobs import server as job_server
from ckptaudit.workflow import outlock
from ckptaudit.workflow.sigterm import hand_sigterm_to_a_thread
from ckptaudit.verification import reverify, budget as verify_budget
from ckptaudit.workflow import support as ws
from ckptaudit.config import typed_cli_values
from ckptaudit.stages.inventory.parts import SMALL_PART_BYTES
from ckptaudit.pipeline import check_config, check_out_dir, check_run_dir

SCHEMA = os.path.join(workflow.basedir, "config", "schema.yaml")


def usage_error(message):
    """A config or path error: one line on stderr and exit 3 (the audit's own failure), as ``ckptaudit audit``
    does; a WorkflowError would exit 1, which means "roll back"."""
    sys.stderr.write(f"ckptaudit: error: {message}\n")
    sys.stderr.flush()
    sys.exit(3)


# `--config 'load={timeout_seconds: 300}'` (how Snakemake sets a nested key; a dotted key is refused by its own
# parser before this file is read) gives '300': read as the number the schema wants
config.update(typed_cli_values(config, SCHEMA))
try:  # the schema's bounds plus finiteness (NaN passes every JSON Schema bound), in one line
    check_config(config, SCHEMA)
except ValueError as e:
    usage_error(e)
validate(config, SCHEMA)  # cannot fail after check_config (same schema); its defaults equal config/config.yaml's
ws.configure_storage(config)  # s3: settings for this process and the jobs it starts (no secrets)

PYTHON = ws.rule_python(workflow.deployment_settings)  # the conda env's python under --use-conda
os.environ.setdefault("CKPTAUDIT_SOURCE", workflow.basedir)  # the checkout envs/ckptaudit.yaml installs
VERSION = ckptaudit.__version__
DEMO_DIR = "demo_run"
RUN_DIR = config["run_dir"] or DEMO_DIR
RUN_NAME = config["run_name"] or ws.run_name(RUN_DIR)
OUT = (config["out_dir"] or os.path.join("reports", ws.report_folder(RUN_DIR, config["run_name"]))).rstrip("/")
try:
    check_out_dir(RUN_DIR, OUT, state_dir=os.getcwd())  # Snakemake keeps .snakemake/ in its working directory
    if config["run_dir"]:  # a missing path or a file stops here, in one line (not in the inventory job)
        check_run_dir(RUN_DIR)
except ValueError as e:
    usage_error(e)
TABLES = f"{OUT}/tables"
PARTS = f"{OUT}/tables/parts"
LOGS = f"{OUT}/logs"
BENCH = f"{OUT}/benchmarks"
WORK = f"{OUT}/work"
# Every audit re-verifies bytes unless `reuse: true` (ckptaudit/verification/reverify.py): its id is a param of the
# inventory and of every part job, so a new audit re-runs them all.
AUDIT_ID = reverify.audit_id(workflow.is_main_process)
try:  # a nightly that fits its window (ckptaudit/verification/budget.py): the least recently verified units first
    VERIFY_BUDGET = verify_budget.parse_budget(config["verify_budget"])
except ValueError as e:
    usage_error(e)
REVERIFY = None if config["reuse"] or VERIFY_BUDGET else AUDIT_ID
VERIFY_PLAN = f"{WORK}/{verify_budget.PLAN}"


def notice_sigint():
    """Tell Ctrl-C from a failed job in `onerror` (ckptaudit/outputs/job_errors.py: "interrupted", exit 130)."""
    from ckptaudit.outputs import job_errors

    job_errors.notice_sigint()


def hold_out_lock():
    """One audit at a time per output folder (ckptaudit/workflow/outlock.py), from `onstart` to the end.  The kernel
    drops the lock when this process ends, however it ends, so the workflow runs with Snakemake's own lock
    off and incomplete outputs redone (profiles/default; ckptaudit.cli.snakemake for `ckptaudit audit`)."""
    try:
        outlock.hold(OUT)
    except outlock.OutputBusy as e:
        usage_error(e)


def start_load_server():
    """One `import torch` for the audit's load jobs (ckptaudit/stages/load/server.py): started here, while the inventory
    and the hash stage run, when this machine runs the jobs in this interpreter (not on a cluster, not under
    --use-conda) and a load job is to run, or the inventory (whose parts bring the load jobs).  A server that
    `ckptaudit audit` started before this workflow was read (ckptaudit/cli/snakemake.py) is kept when one is
    wanted, and stopped when none is."""
    if not (workflow.local_exec and PYTHON == sys.executable and config["load"]["enabled"] and needs_loads()):
        load_server.stop(WORK)  # a record left by a killed audit is removed (its server, if any, is not this one)
        return
    if load_server.started_here(WORK):
        return
    load_server.stop(WORK)
    os.makedirs(LOGS, exist_ok=True)
    load_server.start(WORK, f"{LOGS}/load_server.log")


def start_job_server():
    """The stage jobs forked from one process that has imported the stages (ckptaudit/stages/jobs/server.py), when
    they run on this machine in this interpreter (not on a cluster, not under --use-conda).  A server that
    `ckptaudit audit` started before this workflow was read (ckptaudit/cli/snakemake.py) is kept."""
    if not (workflow.local_exec and PYTHON == sys.executable):
        job_server.stop(WORK)
        return
    if job_server.started_here(WORK):
        return
    job_server.stop(WORK)
    os.makedirs(LOGS, exist_ok=True)
    job_server.start(WORK, f"{LOGS}/stage_server.log")


def needs_loads():
    """Whether a load job is to run, or the inventory (a checkpoint: the part jobs, load among them, join the
    DAG when it has run)."""
    try:
        return any(job.rule.name in ("inventory", "load") for job in workflow.dag.needrun_jobs())
    except Exception:  # noqa: BLE001 - Snakemake's DAG API moved: start it; an unused server costs an import
        return True


wildcard_constraints:
    part=r"p\d{4}",


def get_run_dir_input(wildcards):
    """The demo run is made by the workflow; any other run is only read."""
    return DEMO_DIR if RUN_DIR == DEMO_DIR and not config["run_dir"] else []


def get_listing_fingerprint(wildcards):
    return ws.listing_fingerprint(RUN_DIR) + (f" audit {REVERIFY}" if REVERIFY else "")


def get_part_bytes(wildcards):
    """The inventory's byte bound of an "auto" part (ckptaudit.stages.inventory.parts.assign_parts): none on one machine (the hash
    job hashes a part's units at once on every core, so a big unit needs no chain of jobs of its own), 4 GiB
    with a cluster executor (big units on several nodes).  A cluster job re-reads this under its job-step
    executor (SLURM's slurm-jobstep is not local either), so the inventory job gets the same bound."""
    return "none" if workflow.local_exec else str(SMALL_PART_BYTES)


def get_stage_config(wildcards):
    return json.dumps(ws.stage_config(config, RUN_DIR, RUN_NAME), sort_keys=True)


def get_inventory():
    """The inventory document (after the inventory checkpoint has run), parsed once
    per version of the file (input functions call this for every job)."""
    return ws.read_inventory_cached(checkpoints.inventory.get().output.json)


def get_part_ids():
    return sorted(get_inventory()["parts"])


def get_part_files(wildcards):
    return ws.part_files(get_inventory(), wildcards.part)


_PART_SIGNATURES = {}  # (inventory version, part) -> signature: six rules ask per part; stat each file once


def get_part_units(wildcards):
    path = checkpoints.inventory.get().output.json
    st = os.stat(path)
    key = (st.st_mtime_ns, st.st_size, wildcards.part)
    if key not in _PART_SIGNATURES:
        sig = ws.part_signature(get_inventory(), wildcards.part, reverify=REVERIFY)
        if VERIFY_BUDGET:  # a part with a unit to read tonight runs again; the others are reused by strong key
            sig += verify_budget.part_token(get_verify_plan(), wildcards.part)
        _PART_SIGNATURES[key] = sig
    return _PART_SIGNATURES[key]


_VERIFY_PLANS = {}  # inventory version -> this audit's verify plan


def get_verify_plan():
    """This audit's choice of units to read under `verify_budget` (ckptaudit.verification.budget.plan_for_audit),
    made once by the main process after the inventory and read from work/verify_plan.json by any other."""
    st = os.stat(checkpoints.inventory.get().output.json)
    key = (st.st_mtime_ns, st.st_size)
    if key not in _VERIFY_PLANS:
        _VERIFY_PLANS[key] = verify_budget.plan_for_audit(get_inventory(), WORK, VERIFY_BUDGET, AUDIT_ID,
                                                          workflow.is_main_process)
    return _VERIFY_PLANS[key]


def get_verify_plan_arg(wildcards):
    """`--verify-plan work/verify_plan.json` for the hash and report jobs of a `verify_budget` audit, else ''."""
    return f"--verify-plan {shlex.quote(VERIFY_PLAN)}" if VERIFY_BUDGET else ""


def get_parts_of(stage):
    def _parts(wildcards):
        return expand(f"{PARTS}/{stage}/{{part}}.parquet", part=get_part_ids())

    _parts.__name__ = f"get_{stage}_parts"
    return _parts


def get_report_outputs():
    return [f"{OUT}/verdict.json", f"{OUT}/report.html", f"{TABLES}/units.parquet"]


def get_out_dir(wildcards, output):
    """The report folder, derived from the verdict's path."""
    return os.path.dirname(output.verdict)
