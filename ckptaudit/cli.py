"""``ckptaudit`` command line.

``ckptaudit audit RUN_DIR --out DIR`` runs the same Snakemake workflow as
``snakemake --cores N audit`` through Snakemake's Python API; with ``--profile``
(e.g. ``slurm``: ``config/profiles/slurm``) or ``--executor``, through Snakemake's
command line in this process (:func:`run_snakemake_cli`), which reads profiles.

Exit codes of ``audit`` (for cron and CI):

* 0 — the newest unit is usable for resume;
* 1 — roll back needed and possible (resume or warm-start from an older/other unit);
* 2 — nothing usable: retrain;
* 3 — the audit itself failed (bad arguments or config, unreadable folder, workflow error); one
  line on stderr says why.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ._version import __version__

from .cli_common import EXIT_FAILED, ExitThreeOnUsageError, check_paths  # noqa: F401 - re-exported
from .config import (CONFIG_MAX_BYTES, _json_or_none, _merge, load_user_config,  # noqa: F401 - re-exported
                     read_config_file, workflow_dir)
from .text import step_text


def run_workflow(cfg: dict, workdir: Path, cores: int, targets=("audit",), quiet: bool = True,
                 keep_going: bool = True, executor: str = "local", profile_args=None) -> bool:
    """Run the workflow through ``snakemake.api``; True on success."""
    from snakemake.api import SnakemakeApi
    from snakemake.settings.enums import Quietness
    from snakemake.settings.types import (ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings,
                                          ResourceSettings, StorageSettings)

    workdir.mkdir(parents=True, exist_ok=True)
    out = OutputSettings(quiet={Quietness.ALL} if quiet else set(), show_failed_logs=True)
    with SnakemakeApi(out) as api:
        wf = api.workflow(
            resource_settings=ResourceSettings(cores=cores),
            config_settings=ConfigSettings(config=cfg),
            storage_settings=StorageSettings(),
            snakefile=workflow_dir() / "Snakefile",
            workdir=workdir,
        )
        dag = wf.dag(dag_settings=DAGSettings(targets=set(targets)))
        dag.execute_workflow(executor=executor, execution_settings=ExecutionSettings(keep_going=keep_going))
    return True


def resolve_profile(name_or_path: str) -> str:
    """A ``--profile`` value as Snakemake should see it.

    An existing path (folder or YAML file) is used as is; otherwise a name of a profile
    bundled with the workflow (``config/profiles/NAME``, e.g. ``slurm``); otherwise the
    name is handed to Snakemake, which looks in ``~/.config/snakemake/NAME`` and
    ``/etc/xdg/snakemake/NAME``.  Raises :class:`click.ClickException` when none exists.
    """
    from snakemake.cli import get_profile_dir

    if Path(name_or_path).exists():
        return str(Path(name_or_path).resolve())
    bundled = workflow_dir() / "config" / "profiles" / name_or_path
    if bundled.is_dir():
        return str(bundled)
    if get_profile_dir(name_or_path) is None:
        names = sorted(p.name for p in (workflow_dir() / "config" / "profiles").glob("*") if p.is_dir())
        raise click.ClickException(
            f"--profile {name_or_path}: no such profile: not a path, not one of the bundled profiles "
            f"{names} in {workflow_dir() / 'config' / 'profiles'}, and not in Snakemake's profile folders")
    return name_or_path


def run_snakemake_cli(cfg: dict, workdir: Path, *, profile: str | None = None, executor: str | None = None,
                      cores: int | None = None, quiet: bool = True, extra_args=(), targets=("audit",)) -> bool:
    """Run the workflow through Snakemake's own command line, in this process; True on success.

    Used for ``--profile`` / ``--executor`` (and Snakemake arguments after ``--``).
    ``snakemake.api`` does not read profiles: a profile is read by the command-line parser,
    which maps each key to its option, including the settings of executor plugins
    (``slurm-…``) that exist only once the plugin is installed.  Translating a profile
    into API settings would re-implement that mapping for every key and plugin, so this
    builds the argument list ``snakemake --profile …`` would get and calls
    ``snakemake.cli.parse_args`` + ``args_to_api``: the same code path, the same result.

    The audit config (defaults, ``--config`` file, run and output folders) is written to
    ``WORKDIR/work/audit_config.yaml`` and passed with ``--configfile``; cluster jobs read
    it as well, so ``workdir`` must be on a file system the cluster nodes share.
    Snakemake's own state (``.snakemake/``, SLURM logs in ``.snakemake/slurm_logs/``) goes
    to ``workdir``.  ``cores`` is passed only when given; without a profile and with the
    local executor it defaults to 2, as in :func:`run_workflow`.
    """
    import yaml
    from snakemake.cli import args_to_api, parse_args

    workdir.mkdir(parents=True, exist_ok=True)
    cfg_file = workdir / "work" / "audit_config.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=True))
    argv = ["--snakefile", str(workflow_dir() / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(cfg_file), "--show-failed-logs"]
    if profile:
        argv += ["--profile", resolve_profile(profile)]
    if executor:
        argv += ["--executor", executor]
    if cores is None and not profile and executor in (None, "local"):
        cores = 2
    if cores is not None:
        argv += ["--cores", str(cores)]
    if quiet:
        argv += ["--quiet", "all"]
    argv += [*extra_args, "--", *targets]
    try:
        parser, args = parse_args(argv)
        ok = args_to_api(args, parser)
    except SystemExit as e:  # argparse and profile errors exit
        raise click.ClickException(f"snakemake {' '.join(argv)}: exited with {e.code}")
    if not ok:
        raise RuntimeError(f"snakemake failed (its log is in {workdir / '.snakemake' / 'log'})")
    return True


def summary(v: dict, out_dir: Path) -> str:
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


@click.group()
@click.version_option(__version__)
def main():
    """Audit the checkpoints of a training run and say where to roll back."""


@main.command(cls=ExitThreeOnUsageError)
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
def audit(run_dir, snakemake_args, out_dir, config_file, cores, profile, executor, as_json, verbose):
    """Audit RUN_DIR; write verdict.json, report.html and tables/ into --out.

    With --profile or --executor, or Snakemake arguments after `--` (e.g.
    `-- --default-resources slurm_account=ACC`), the workflow runs through
    Snakemake's command line, which reads profiles; otherwise through its API.
    """
    from .verdict import exit_code

    try:
        rd, out = check_paths(run_dir, out_dir)
        cfg = load_user_config(config_file)
        cfg.update(run_dir=rd, out_dir=str(out))
        if profile or executor or snakemake_args:
            run_snakemake_cli(cfg, out, profile=profile, executor=executor, cores=cores, quiet=not verbose,
                              extra_args=snakemake_args)
        else:
            run_workflow(cfg, out, cores or 2, quiet=not verbose)
        v = json.loads((out / "verdict.json").read_text())
    except click.ClickException as e:
        click.echo(f"ckptaudit: error: {e.message}", err=True)
        sys.exit(EXIT_FAILED)
    except Exception as e:  # noqa: BLE001 - any workflow failure is exit 3 with its cause
        click.echo(f"ckptaudit: the audit itself failed: {type(e).__name__}: {e}", err=True)
        sys.exit(EXIT_FAILED)
    click.echo(json.dumps(v, indent=2) if as_json else summary(v, out))
    sys.exit(exit_code(v))


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--max-steps", default=600, show_default=True)
@click.option("--save-every", default=100, show_default=True)
@click.option("--seed", default=1337, show_default=True)
@click.option("--no-incident", is_flag=True, help="Leave every checkpoint intact.")
def demo(out_dir, max_steps, save_every, seed, no_incident):
    """Train a tiny GPT on CPU into OUT_DIR and stage a real incident."""
    from .demo import make_demo_run

    run = make_demo_run(out_dir, max_steps=max_steps, save_every=save_every, seed=seed, incident=not no_incident)
    click.echo(f"demo run in {run.run_dir}: steps {run.steps}; truncated {run.truncated}; flipped {run.flipped}")


@main.command()
@click.option("--update-readme", is_flag=True, help="Rewrite the catalogue section of the repository README.")
def findings(update_readme):
    """Print the finding catalogue (Markdown)."""
    from .findings import catalogue_markdown
    from .findings import update_readme as _update

    if update_readme:
        changed = _update(workflow_dir() / "README.md")
        click.echo("README.md updated" if changed else "README.md already current")
        return
    click.echo(catalogue_markdown(), nl=False)


from .publish import prune_command, seal_command  # noqa: E402

main.add_command(seal_command, "seal")
main.add_command(prune_command, "prune")

from .drill import drill_command  # noqa: E402
main.add_command(drill_command, "drill")


if __name__ == "__main__":
    main()
