# ckptaudit: audit every checkpoint of a training run.
#   snakemake --cores 8 audit                      # the bundled demo run
#   snakemake --cores 8 audit --config run_dir=/path/to/run
from snakemake.utils import min_version

min_version("9.0")


configfile: os.path.join(workflow.basedir, "config", "config.yaml")


include: "rules/common.smk"
include: "rules/resources.smk"
include: "rules/demo.smk"
include: "rules/inventory.smk"
include: "rules/hash.smk"
include: "rules/scan.smk"
include: "rules/load.smk"
include: "rules/configdiff.smk"
include: "rules/structure.smk"
include: "rules/state.smk"
include: "rules/report.smk"
include: "rules/drill.smk"


rule audit:
    default_target: True
    input:
        get_report_outputs(),
        load_server_done=f"{WORK}/load_server.done",  # beside the report, not before it (rules/load.smk)


# One audit at a time per output folder: the lock is taken before the first job (not in a dry run); the load
# server (ckptaudit/stages/load/server.py) starts importing torch while the first jobs run.
onstart:
    hold_out_lock()
    start_job_server()
    start_load_server()
    notice_sigint()  # Ctrl-C: "interrupted", exit 130 (ckptaudit/outputs/job_errors.py)
    hand_sigterm_to_a_thread()  # `kill PID`: Snakemake's handler off the main thread (ckptaudit/workflow/sigterm.py)


# The end of every run says what happened: the verdict's summary (ckptaudit/outputs/summary.py), or each
# failed job's own error line from its log (ckptaudit/outputs/job_errors.py).  `ckptaudit audit` prints both itself.
# Then `snakemake … audit` / `snakemake … drill` exit with the codes `ckptaudit audit` / `ckptaudit drill` give
# (the verdict's or the drill's; 3 when a job failed), so that cron and CI see the same answer.
onsuccess:
    from ckptaudit.outputs import summary as _summary

    load_server.stop(WORK)
    job_server.stop(WORK)
    _summary.on_success(workflow, OUT)
    outlock.release(OUT)
    _summary.exit_as_ckptaudit(workflow, OUT)


onerror:
    from ckptaudit.outputs import job_errors as _job_errors

    load_server.stop(WORK)
    job_server.stop(WORK)
    _job_errors.on_error(workflow, OUT)
    outlock.release(OUT)
    _job_errors.exit_as_ckptaudit()
