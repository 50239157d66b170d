"""``ckptaudit audit``: run the workflow on a run folder, print the verdict's summary, exit with its code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..config import load_user_config
from ..outputs.summary import summary
from .common import EXIT_FAILED, ExitThreeOnUsageError, check_paths, failures_exit_3
from .snakemake import run_snakemake_cli, run_workflow


@click.command("audit", cls=ExitThreeOnUsageError)
@click.argument("run_dir")
@click.argument("snakemake_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--out", "out_dir", required=True, metavar="DIR", help="Output folder (created when missing).")
@click.option("--config", "config_file", type=click.Path(),
              help="YAML/JSON with keys of config/config.yaml (a regular file of at most 1 MiB).")
@click.option("--cores", default=None, type=click.IntRange(1),
              help="Snakemake cores (default 2; with --profile, the profile's).")
@click.option("--profile", default=None, metavar="NAME_OR_PATH",
              help="Snakemake profile: a bundled one (config/profiles/NAME, e.g. slurm) or a path.")
@click.option("--executor", default=None, metavar="NAME",
              help="Snakemake executor plugin (e.g. slurm); overrides the profile's.")
@click.option("--reuse", is_flag=True,
              help="Re-use earlier results in --out for files whose size, mtime, ctime, inode and device are "
                   "unchanged (config key reuse); by default every byte is hashed again. It cannot see bytes "
                   "that change below the file system: see docs/rerun.md.")
@click.option("--verify-budget", "verify_budget", default=None, metavar="BYTES|DURATION",
              help="Re-verify at most this much per audit (e.g. 2TiB, 500GB, 3h, 45m; config key verify_budget): new "
                   "and changed units first, then the least recently verified; the rest keep their last "
                   "verification, which the report dates (\"not verified since\"). See docs/rerun.md.")
@click.option("--json", "as_json", is_flag=True, help="Print verdict.json instead of the summary.")
@click.option("--sarif", "sarif_path", default=None, metavar="PATH",
              help="Also write the findings as SARIF 2.1.0 (GitHub code scanning) to PATH.")
@click.option("--metrics", "metrics_path", default=None, metavar="PATH",
              help="Also write the result as Prometheus metrics to PATH (atomically, for node_exporter's textfile "
                   "collector), also when the audit fails: see docs/operations.md.")
@click.option("--junit", "junit_path", default=None, metavar="PATH",
              help="Also write the result as JUnit XML to PATH (one test case per unit; for CI test reports), also "
                   "when the audit fails.")
@click.option("--verbose", is_flag=True, help="Show Snakemake's own output.")
def audit_command(run_dir, snakemake_args, out_dir, config_file, cores, profile, executor, reuse, verify_budget,
                  as_json, sarif_path, metrics_path, junit_path, verbose):
    """Audit RUN_DIR; write verdict.json, report.html and tables/ into --out.

    With --profile or --executor, or Snakemake arguments after `--` (e.g.
    `-- --default-resources slurm_account=ACC`), the workflow runs through
    Snakemake's command line, which reads profiles; otherwise through its API.
    On a terminal, stderr shows the bytes hashed, the rate and the ETA.
    A re-run into the same --out hashes every byte again unless --reuse; an
    interrupted audit's leftovers are redone; a second audit into an --out
    that another one is writing stops at once (exit 3).

    \b
    Exit codes (for cron and CI):
      0  the newest unit is usable for resume (and Lightning's last.ckpt, if
         any, is intact)
      1  roll back needed and possible (resume or warm-start from another unit),
         or last.ckpt is damaged: ckpt_path="last" would fail
      2  nothing usable: retrain
      3  the audit itself failed (bad arguments or config, missing, empty or
         checkpoint-less folder, workflow error); stderr says why
    """
    import time

    from ..verdict import exit_code

    start = time.time()
    if verify_budget is not None:
        from ..verification.budget import parse_budget

        try:
            parse_budget(verify_budget)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--verify-budget") from None
    try:
        v, out, text = _audit(run_dir, snakemake_args, out_dir, config_file, cores, profile, executor, reuse, sarif_path,
                        metrics_path, junit_path, verbose, start, verify_budget)
    except SystemExit as e:
        if e.code == EXIT_FAILED:  # a failed audit is a result too: alerts fire on it, CI shows it
            run = run_dir if "://" in run_dir else str(Path(run_dir).resolve())
            failed_outputs(run, metrics_path, junit_path, time.time() - start,
                           f"ckptaudit audit {run} failed (exit 3); its stderr says why")
        raise
    click.echo(text.rstrip("\n") if as_json else summary(v, out))  # verdict.json as the report wrote it
    sys.exit(exit_code(v))


def failed_outputs(run: str, metrics_path, junit_path, seconds: float, why: str) -> None:
    """The --metrics and --junit files of an audit that failed (exit 3); a file that cannot be written is said
    on stderr."""
    for path, what in ((metrics_path, "metrics"), (junit_path, "junit")):
        if not path:
            continue
        try:
            if what == "metrics":
                from ..outputs import metrics

                metrics.write(path, run, verdict=None, exit_code=EXIT_FAILED, duration_s=seconds)
            else:
                from ..outputs import junit

                junit.write(path, None, audit_seconds=seconds, error=why)
        except OSError as err:
            click.echo(f"ckptaudit: --{what} {path}: {err}", err=True)


def _audit(run_dir, snakemake_args, out_dir, config_file, cores, profile, executor, reuse, sarif_path, metrics_path,
           junit_path, verbose, start, verify_budget=None):
    """The audit itself: ``(verdict, output folder, verdict.json's text)``; exits 3 (``SystemExit``) when it fails."""
    import time

    from ..verdict import exit_code

    with failures_exit_3("ckptaudit", "the audit"):
        rd, out = check_paths(run_dir, out_dir)
        cfg = load_user_config(config_file)
        cfg.update(run_dir=rd, out_dir=str(out))
        if "://" in rd:  # one line for no credentials or an endpoint that does not answer, before any job
            from ..stages.inventory.run_folder import check_run_dir
            from ..workflow.support import configure_storage

            configure_storage(cfg)
            try:
                check_run_dir(rd)
            except ValueError as e:
                raise click.ClickException(str(e)) from None
        if reuse:
            cfg["reuse"] = True
        if verify_budget is not None:
            cfg["verify_budget"] = verify_budget
        if profile or executor or snakemake_args:
            run_snakemake_cli(cfg, out, profile=profile, executor=executor, cores=cores, quiet=not verbose,
                              extra_args=snakemake_args)
        else:
            run_workflow(cfg, out, cores or 2, quiet=not verbose)
        text = (out / "verdict.json").read_text()
        v = json.loads(text)
        if sarif_path:
            from ..outputs.sarif import write

            write(v, sarif_path)
        if metrics_path:
            from ..outputs import metrics

            metrics.write(metrics_path, rd, verdict=v, exit_code=exit_code(v), duration_s=time.time() - start)
        if junit_path:
            from ..outputs import junit

            junit.write(junit_path, v, audit_seconds=time.time() - start)
    return v, out, text
