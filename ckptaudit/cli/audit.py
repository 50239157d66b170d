"""``ckptaudit audit``: run the workflow on a run folder, print the verdict's summary, exit with its code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..config import load_user_config
from ..text import step_text
from .common import ExitThreeOnUsageError, check_paths, failures_exit_3
from .snakemake import run_snakemake_cli, run_workflow


def summary(v: dict, out_dir: Path) -> str:
    """The lines ``ckptaudit audit`` prints: the recommendation, one line per unit, the first reasons."""
    lines = [f"ckptaudit: {v['recommendation'].upper()}"
             + (f" from {v['rollback']['unit']} ({step_text(v['rollback']['step'])})" if v["rollback"] else "")
             + (f", {v['steps_lost']} steps lost" if v.get("steps_lost") else "")]
    for u in v["units"]:
        errs = [f["kind"] for f in u["findings"] if f["severity"] == "error"]
        mark = {"resume": "ok  ", "warm-start": "warm", "none": "BAD "}[u["usable_for"]]
        step = "?" if u["step"] is None else str(u["step"])
        lines.append(f"  {mark} {u['unit']:<40} step {step:>8}  {', '.join(errs)}")
    for r in v["reasons"][1:4]:
        lines.append(f"  - {r}")
    lines.append(f"report: {out_dir / 'report.html'}")
    return "\n".join(lines)


@click.command("audit", cls=ExitThreeOnUsageError)
@click.argument("run_dir")
@click.argument("snakemake_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option("--config", "config_file", type=click.Path(),
              help="YAML/JSON with keys of config/config.yaml (a regular file of at most 1 MiB).")
@click.option("--cores", default=None, type=click.IntRange(1),
              help="Snakemake cores (default 2; with --profile, the profile's).")
@click.option("--profile", default=None, metavar="NAME_OR_PATH",
              help="Snakemake profile: a bundled one (config/profiles/NAME, e.g. slurm) or a path.")
@click.option("--executor", default=None, metavar="NAME",
              help="Snakemake executor plugin (e.g. slurm); overrides the profile's.")
@click.option("--json", "as_json", is_flag=True, help="Print verdict.json instead of the summary.")
@click.option("--verbose", is_flag=True, help="Show Snakemake's own output.")
def audit_command(run_dir, snakemake_args, out_dir, config_file, cores, profile, executor, as_json, verbose):
    """Audit RUN_DIR; write verdict.json, report.html and tables/ into --out.

    With --profile or --executor, or Snakemake arguments after `--` (e.g.
    `-- --default-resources slurm_account=ACC`), the workflow runs through
    Snakemake's command line, which reads profiles; otherwise through its API.
    """
    from ..verdict import exit_code

    with failures_exit_3("ckptaudit", "the audit"):
        rd, out = check_paths(run_dir, out_dir)
        cfg = load_user_config(config_file)
        cfg.update(run_dir=rd, out_dir=str(out))
        if profile or executor or snakemake_args:
            run_snakemake_cli(cfg, out, profile=profile, executor=executor, cores=cores, quiet=not verbose,
                              extra_args=snakemake_args)
        else:
            run_workflow(cfg, out, cores or 2, quiet=not verbose)
        v = json.loads((out / "verdict.json").read_text())
    click.echo(json.dumps(v, indent=2) if as_json else summary(v, out))
    sys.exit(exit_code(v))
