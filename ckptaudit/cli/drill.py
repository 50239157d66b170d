"""``ckptaudit drill``: audit a run with the workflow, then restore-drill its rollback point (rules/drill.smk)."""

from __future__ import annotations

import json
import sys

import click

from ..config import load_user_config
from .common import EXIT_FAILED, ExitThreeOnUsageError, check_paths, failures_exit_3
from ..drill.contract import EXIT_NO_UNIT
from ..drill.select import unknown_unit
from .snakemake import run_workflow
from ..terminal_text import shown_lines


def _unit_exists(run_dir: str, unit: str) -> bool:
    """True when ``unit`` is a path under ``run_dir``, or the base name of one (as the drill's selection takes it)."""
    from pathlib import Path

    root = Path(run_dir)
    if (root / unit).exists():
        return True
    return "/" not in unit and any(p.name == unit for _, p in zip(range(100_000), root.rglob(unit)))


def _check_hook(cfg: dict) -> None:
    """Import ``drill.hook`` in a throw-away interpreter, as the drill's child will, before the audit runs: a
    hook that cannot be imported is a configuration error (exit 3) now, not after the whole audit."""
    import subprocess

    from ..drill.settings import drill_config

    spec = str(drill_config(cfg).get("hook") or "")
    code = "import sys\nfrom ckptaudit.drill.contract import import_hook\nimport_hook(sys.argv[1])"
    try:
        r = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, timeout=300,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise click.ClickException(f"drill.hook {spec!r}: importing it took over 300 s")
    if r.returncode != 0:
        last = next((ln for ln in reversed(r.stderr.strip().splitlines()) if ln.strip()), f"exit {r.returncode}")
        raise click.ClickException(f"drill.hook {spec!r} cannot be imported: {last.strip()} (set drill.hook to "
                                   "your job's restore function, \"package.module:function\", see docs/drill.md)")


def _hook_path_for_children() -> None:
    """Put the folder ``ckptaudit drill`` runs in on ``PYTHONPATH`` (first), as :func:`_check_hook` imported the
    hook from there: the workflow's jobs and the drill's children run elsewhere, and a hook module beside the
    user (``drill.hook: "myhook:restore"``) passed the check and then failed in the child (a new user's trial)."""
    import os

    here = os.getcwd()
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *parts])


@click.command("drill", cls=ExitThreeOnUsageError)
@click.argument("run_dir")
@click.option("--out", "out_dir", required=True, metavar="DIR", help="Output folder (created when missing).")
@click.option("--unit", default="", help="Unit to drill (path relative to RUN_DIR); default: the rollback point.")
@click.option("--device", "devices", multiple=True, help="Device to drill on (repeatable); default drill.devices.")
@click.option("--config", "config_file", type=click.Path(),
              help="YAML/JSON with keys of config/config.yaml (drill.hook, drill.steps, …; a regular file of at "
                   "most 1 MiB).")
@click.option("--cores", default=2, show_default=True, type=click.IntRange(1), help="Snakemake cores.")
@click.option("--json", "as_json", is_flag=True, help="Print drill.json instead of the summary line.")
@click.option("--metrics", "metrics_path", default=None, metavar="PATH",
              help="Also write the audit's and the drill's result as Prometheus metrics to PATH (atomically, for "
                   "node_exporter's textfile collector): see docs/operations.md.")
@click.option("--junit", "junit_path", default=None, metavar="PATH",
              help="Also write JUnit XML to PATH: one test case per unit and per drill check and device.")
@click.option("--verbose", is_flag=True, help="Show Snakemake's own output.")
def drill_command(run_dir, out_dir, unit, devices, config_file, cores, as_json, metrics_path, junit_path, verbose):
    """Audit RUN_DIR, then restore its rollback point in a fresh process and continue training.

    Writes DIR/drill/drill.parquet, drill.json and drill.html next to the audit's report.  Exit codes:
    0 drill passed, 1 drill found a problem, 2 no restorable unit, 3 the drill itself failed (bad
    arguments or config included: one line on stderr says why)."""
    import time

    start = time.time()
    reached: dict = {}
    try:
        doc, out = _drill(run_dir, out_dir, unit, devices, config_file, cores, verbose, reached)
    except SystemExit as e:
        if e.code == EXIT_FAILED:
            _failed_outputs(run_dir, out_dir, metrics_path, junit_path, start, reached)
        raise
    _watched_outputs(doc, out, metrics_path, junit_path, time.time() - start)
    click.echo(json.dumps(doc, indent=2) if as_json else shown_lines(doc["summary"].split("\n")))
    if not as_json:
        click.echo(f"report: {out / 'drill' / 'drill.html'}")
    sys.exit(int(doc["exit_code"]))


def _watched_outputs(doc: dict, out, metrics_path, junit_path, seconds: float) -> None:
    """--metrics and --junit of a drill that ran: the audit's verdict (when it was written) and the drill."""
    if not (metrics_path or junit_path):
        return
    try:
        v = json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        v = None
    audit_s = max(0.0, seconds - float(doc.get("wall_seconds") or 0.0))
    try:
        if metrics_path:
            from ..outputs import metrics
            from ..verdict import exit_code

            metrics.write(metrics_path, doc.get("run_dir") or "", verdict=v, drill=doc, duration_s=audit_s,
                          exit_code=exit_code(v) if v is not None else EXIT_FAILED)
        if junit_path:
            from ..drill.contract import INFRA_CHECKS
            from ..outputs import junit

            junit.write(junit_path, v, audit_seconds=audit_s, drill=doc, infra_checks=INFRA_CHECKS,
                        error="the drill's audit wrote no verdict.json")
    except OSError as err:
        raise click.ClickException(f"--metrics/--junit: {err}")


def _failed_outputs(run_dir: str, out_dir: str, metrics_path, junit_path, start: float, reached: dict) -> None:
    """--metrics and --junit of a drill that could not run (exit 3): the drill's series say so (success 0, exit
    code 3, the last success kept from the previous file, so that ``RestoreDrillNotPassing`` fires while the hook
    stays broken); the audit's say what the audit did: nothing when the drill stopped before it (``reached``
    has no ``"workflow"``), its verdict when it wrote one during this command, else a failed audit."""
    import time
    from pathlib import Path

    from .audit import failed_outputs

    run = str(Path(run_dir).resolve()) if "://" not in run_dir else run_dir
    seconds = time.time() - start
    if metrics_path:
        from ..outputs import metrics
        from ..verdict import exit_code

        v = None
        if reached.get("workflow"):
            vp = Path(out_dir).resolve() / "verdict.json"
            try:
                if vp.stat().st_mtime >= start:
                    v = json.loads(vp.read_text())
            except (OSError, ValueError):
                v = None
        try:
            metrics.write(metrics_path, run, verdict=v, exit_code=exit_code(v) if v is not None else EXIT_FAILED,
                          duration_s=seconds, drill={"exit_code": EXIT_FAILED, "wall_seconds": 0.0},
                          audit_ran=bool(reached.get("workflow")))
        except OSError as err:
            click.echo(f"ckptaudit: --metrics {metrics_path}: {err}", err=True)
    failed_outputs(run, None, junit_path, seconds, f"ckptaudit drill {run} failed (exit 3); its stderr says why")


def _drill(run_dir, out_dir, unit, devices, config_file, cores, verbose, reached: dict):
    """Run the workflow's drill target: ``(drill.json as a dict, output folder)``; exits 3 when it fails.
    ``reached["workflow"]`` is set once the workflow (the audit, then the drill) is started."""
    with failures_exit_3("ckptaudit drill", "the drill"):
        rd, out = check_paths(run_dir, out_dir)
        if "://" in rd:
            raise click.ClickException(f"{run_dir}: a drill restores from a local or shared folder; copy the unit "
                                       f"from object storage first")
        cfg = load_user_config(config_file)
        cfg.update(run_dir=rd, out_dir=str(out))
        cfg["drill"] = dict(cfg.get("drill") or {})
        if unit:
            cfg["drill"]["unit"] = unit
        if devices:
            import re

            bad = [d for d in devices if not re.fullmatch(r"cpu|cuda(:\d+)?", d)]
            if bad:
                raise click.ClickException(f"--device {bad[0]!r}: expected cpu, cuda or cuda:N")
            cfg["drill"]["devices"] = list(devices)
        if unit and not _unit_exists(rd, unit):  # before the audit: a typo'd --unit is a usage error
            raise click.ClickException(f"--unit {unit}: no such file or folder in {rd} (give the unit's path "
                                       "relative to RUN_DIR, e.g. checkpoint-20)")
        _check_hook(cfg)
        _hook_path_for_children()
        reached["workflow"] = True
        run_workflow(cfg, out, cores, targets=("drill",), quiet=not verbose)
        doc = json.loads((out / "drill" / "drill.json").read_text())
        if unit and doc.get("exit_code") == EXIT_NO_UNIT and (out / "verdict.json").exists() \
                and unknown_unit(json.loads((out / "verdict.json").read_text()), unit):
            raise click.ClickException(f"--unit {unit}: not a unit of the audited run; "
                                       f"{doc.get('summary', '').split(': ', 2)[-1]}")
    return doc, out
