"""Running the Snakemake workflow from the command line: through its API, or its own command line for profiles.

``ckptaudit audit`` and ``ckptaudit drill`` use :func:`run_workflow`; with ``--profile``
(e.g. ``slurm``: ``config/profiles/slurm``) or ``--executor``, ``audit`` goes through
Snakemake's command line in this process (:func:`run_snakemake_cli`), which reads profiles.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import click

from ..config import workflow_dir
from .common import Interrupted


@contextmanager
def _out_locked(workdir: Path) -> Iterator[None]:
    """Hold ``workdir``'s audit lock (:mod:`ckptaudit.workflow.outlock`) for the run; another holder is one line
    (:class:`click.ClickException`, exit 3).  With it held, Snakemake's own lock is off (its lock files
    outlive a SIGKILL) and an interrupted audit's incomplete outputs are redone."""
    from ..workflow import outlock

    try:
        outlock.hold(workdir)
    except outlock.OutputBusy as e:
        raise click.ClickException(str(e)) from None
    try:
        yield
    finally:
        outlock.release(workdir)


@contextmanager
def _interrupts(workdir: Path) -> Iterator[None]:
    """Tell SIGINT (Ctrl-C) from a failed job: a SIGINT while the workflow runs ends it as :class:`Interrupted`.

    Ctrl-C reaches the whole process group: the stage jobs die of it and Snakemake cancels the rest, so what
    comes out of the workflow is a failed job ("a job failed; see the logs"), or a ``KeyboardInterrupt``.  The
    handler notes the signal and hands it on to the one it replaced (Python's, which raises
    ``KeyboardInterrupt`` where Snakemake expects it); whatever the workflow then raises, or if it returns, the
    run ends as :class:`Interrupted`.  Only the main thread can set a handler; elsewhere, or where SIGINT is
    ignored (``nohup``), nothing changes."""
    seen: list = []
    prev = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or prev in (signal.SIG_IGN, None):
        yield
        return

    def noted(signum, frame):
        seen.append(signum)
        if callable(prev):
            prev(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, noted)
    why = (f"the workflow was stopped and wrote no verdict; run the same command again (the lock on {workdir} is "
           "released; unfinished jobs are redone)")
    try:
        try:
            yield
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - after a SIGINT, any error is its consequence
            if seen or isinstance(e, KeyboardInterrupt):
                raise Interrupted(why) from None
            raise
        if seen:
            raise Interrupted(why)
    finally:
        signal.signal(signal.SIGINT, prev)


@contextmanager
def _servers_early(cfg: dict, workdir: Path, executor: str) -> Iterator[None]:
    """Start the audit's servers before Snakemake is imported, when their jobs will run on this machine (the
    local executor): the stage job server (:mod:`ckptaudit.stages.jobs.server`: its imports, ~0.4 CPU-s, then run
    beside Snakemake's own start), and the load server (:mod:`ckptaudit.stages.load.server`) when every load job
    will run (no ``reuse``, no ``verify_budget``; loads enabled): its ``import torch`` (~1.3 CPU-s) then runs
    beside Snakemake's own start (~2 s on one core) rather than beside the hash pass, which wants both cores of
    a 2-core machine (issue 45).  The Snakefile's ``onstart`` keeps them, or stops one that is not wanted; both
    are stopped at the end whatever happens."""
    from ..stages.jobs import server as job_server
    from ..stages.load import server as load_server

    work = workdir.resolve() / "work"
    load = cfg.get("load")  # validated later, by the Snakefile: a malformed value only starts no server here
    enabled = load.get("enabled", True) if isinstance(load, dict) else load is None
    local = executor == "local"
    early = local and enabled is True and not cfg.get("reuse") and not cfg.get("verify_budget")
    if local:
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        job_server.stop(work)  # a record left by a killed audit
        job_server.start(work, workdir / "logs" / "stage_server.log")
    if early:
        load_server.stop(work)  # a record left by a killed audit
        load_server.start(work, workdir / "logs" / "load_server.log")
    try:
        yield
    finally:
        if early:
            load_server.stop(work)
        if local:
            job_server.stop(work)


@contextmanager
def _as_cli(workdir: Path) -> Iterator[None]:
    """Run a workflow for the CLI: its ``onsuccess``/``onerror`` handlers stay quiet (the CLI prints the
    summary itself) and a failure becomes one :class:`click.ClickException` that gives each failed job's own
    error line (:mod:`ckptaudit.outputs.job_errors`, from ``workdir/work/failed_jobs.txt``)."""
    from ..outputs import job_errors

    failed = workdir / job_errors.FAILED_JOBS
    failed.unlink(missing_ok=True)
    old = os.environ.get(job_errors.CLI_ENV)
    os.environ[job_errors.CLI_ENV] = "1"
    try:
        yield
    except click.ClickException:
        raise
    except Exception as e:  # noqa: BLE001 - Snakemake's own errors: the jobs' lines say more than its message
        lines = job_errors.read_failed(workdir)
        if not lines:
            raise
        more = f"\n  … and {len(lines) - 10} more failed jobs (logs in {workdir / 'logs'})" if len(lines) > 10 else ""
        raise click.ClickException("the workflow failed:\n" + "\n".join(f"  {ln}" for ln in lines[:10]) + more) from e
    finally:
        if old is None:
            os.environ.pop(job_errors.CLI_ENV, None)
        else:
            os.environ[job_errors.CLI_ENV] = old


@contextmanager
def _local_executors_only() -> Iterator[bool]:
    """While a run on this machine: Snakemake's executor registry holds the three executors Snakemake itself
    ships (``local``, ``dryrun``, ``touch``) instead of every installed ``snakemake_executor_plugin_*`` package;
    yields True when that was done.  On exit the registry is dropped, so whatever next builds it in this process
    (a ``--profile``/``--executor`` run, a library caller's own Snakemake) collects every plugin as usual.

    Snakemake builds the registry when ``snakemake.api`` is imported (a module-level singleton of
    ``snakemake_interface_executor_plugins``); collecting it imports each plugin.  Importing the SLURM plugin
    (snakemake-executor-plugin-slurm 2.x) imports pandas and runs ``which sacct``, ``which squeue`` and
    ``scontrol show config`` to word its help texts: 0.45-0.5 s of the command's start with the controller up
    (measured here, 2 cores), and ~9 s when ``scontrol`` is installed but no controller answers (its 10 s
    timeout), on a machine that then runs no SLURM job at all.  The singleton is made the way its own class
    makes it (``__new__``, then ``plugins`` and ``register_plugin``); if that API is not there, or the registry
    exists already, it is left to Snakemake (False), which costs only the time above."""
    try:
        from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry
    except ImportError:
        yield False
        return
    ours = False
    if ExecutorPluginRegistry._instance is None:
        try:
            from snakemake.executors import dryrun, local, touch

            registry = ExecutorPluginRegistry.__new__(ExecutorPluginRegistry)
            registry.plugins = {}
            for name, module in (("local", local), ("dryrun", dryrun), ("touch", touch)):
                registry.register_plugin(name, module)
            ours = True
        except Exception:  # noqa: BLE001 - another version's internals: Snakemake collects the plugins itself
            ExecutorPluginRegistry._instance = None
    try:
        yield ours
    finally:
        if ours:
            ExecutorPluginRegistry._instance = None


@contextmanager
def _params_without_pandas() -> Iterator[bool]:
    """While a run: Snakemake's job records serialise this workflow's ``params`` with Snakemake's builtin
    serialiser instead of the one that imports pandas first; yields True when that was done, and puts the
    original back on exit (another workflow in this process may pass DataFrames).

    Snakemake records each finished job's params (to re-run a job whose params changed) through
    ``PersistenceBase._serialize_param``, which picks ``_serialize_param_pandas`` whenever pandas is installed; that
    imports pandas (~0.3 s here) in the scheduler's process when the first job finishes, while the next job
    waits.  It differs from ``_serialize_param_builtin`` only for a pandas DataFrame, Series or Index, and the
    rules in ``rules/*.smk`` pass strings, numbers and booleans: the records are the same strings either way
    (``tests/test_executor_registry.py`` records every value serialised during an audit).  If the class has no
    such property (another Snakemake version), nothing is changed."""
    try:
        from snakemake.persistence import PersistenceBase
    except ImportError:
        yield False
        return
    original = PersistenceBase.__dict__.get("_serialize_param")
    if not isinstance(original, property) or not hasattr(PersistenceBase, "_serialize_param_builtin"):
        yield False
        return
    PersistenceBase._serialize_param = property(lambda self: self._serialize_param_builtin)
    try:
        yield True
    finally:
        PersistenceBase._serialize_param = original


def run_workflow(cfg: dict, workdir: Path, cores: int, targets=("audit",), quiet: bool = True,
                 keep_going: bool = True, executor: str = "local", profile_args=None) -> bool:
    """Run the workflow through ``snakemake.api``; True on success."""
    from .ticker import progress_line

    workdir.mkdir(parents=True, exist_ok=True)
    with _out_locked(workdir), _servers_early(cfg, workdir, executor), _interrupts(workdir), _as_cli(workdir), \
            progress_line(workdir), ExitStack() as stack:
        if executor == "local":
            stack.enter_context(_local_executors_only())
        from snakemake.api import SnakemakeApi  # after the load server's start: its import runs beside this one

        stack.enter_context(_params_without_pandas())
        from snakemake.settings.enums import Quietness
        from snakemake.settings.types import (ConfigSettings, DAGSettings, ExecutionSettings, OutputSettings,
                                              ResourceSettings, StorageSettings)

        out = OutputSettings(quiet={Quietness.ALL} if quiet else set(), show_failed_logs=not quiet)
        with SnakemakeApi(out) as api:
            wf = api.workflow(
                resource_settings=ResourceSettings(cores=cores),
                config_settings=ConfigSettings(config=cfg),
                storage_settings=StorageSettings(),
                snakefile=workflow_dir() / "Snakefile",
                workdir=workdir,
            )
            dag = wf.dag(dag_settings=DAGSettings(targets=set(targets), force_incomplete=True))
            dag.execute_workflow(executor=executor,
                                 execution_settings=ExecutionSettings(keep_going=keep_going, lock=False))
    return True


def _refuse_dotted_keys(args) -> None:
    """One line for a ``--config KEY=VALUE`` among Snakemake arguments whose key has dots: Snakemake's parser
    refuses it with a traceback ("Config entry must start with a valid identifier"); the line shows the form it
    takes (:func:`ckptaudit.config.dotted_key_form`).  Raises :class:`click.ClickException`."""
    from ..config import dotted_key_form

    entries, taking = [], False
    for a in args:
        if a in ("--config", "-C"):
            taking = True
        elif a.startswith("-"):
            taking = False
        elif taking:
            entries.append(a)
    for e in entries:
        form = dotted_key_form(e)
        if form:
            raise click.ClickException(f"--config {e}: Snakemake takes no dots in a config key; "
                                       f"write --config '{form}'")


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

    _refuse_dotted_keys(extra_args)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_file = workdir / "work" / "audit_config.yaml"
    cfg_file.parent.mkdir(parents=True, exist_ok=True)
    cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=True))
    argv = ["--snakefile", str(workflow_dir() / "Snakefile"), "--directory", str(workdir),
            "--configfile", str(cfg_file), "--nolock", "--rerun-incomplete"] + ([] if quiet else ["--show-failed-logs"])
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
    from .ticker import progress_line

    with _out_locked(workdir), _interrupts(workdir), _as_cli(workdir), progress_line(workdir):
        try:
            parser, args = parse_args(argv)
            ok = args_to_api(args, parser)
        except SystemExit as e:  # argparse and profile errors exit
            raise click.ClickException(f"snakemake {' '.join(argv)}: exited with {e.code}")
        if not ok:
            raise RuntimeError(f"snakemake failed (its log is in {workdir / '.snakemake' / 'log'})")
    return True
