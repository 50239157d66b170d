"""What every ``ckptaudit`` sub-command shares: exit codes, usage errors as exit 3, checked paths."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click

from ..terminal_text import shown

#: the command itself failed (bad arguments or config, unreadable folder, workflow error)
EXIT_FAILED = 3
#: stopped by SIGINT (Ctrl-C): 128 + the signal's number, as a shell reports a command a signal ended
EXIT_INTERRUPTED = 130


class Interrupted(click.ClickException):
    """The command was stopped by SIGINT (Ctrl-C) while it ran; ``message`` says what was left undone."""


class ExitThreeOnUsageError(click.Command):
    """A command whose usage errors exit 3 (the audit's own failure), not click's 2 (which is "retrain")."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            e.exit_code = EXIT_FAILED
            raise


class ExitThreeGroup(click.Group):
    """The ``ckptaudit`` group: a usage error of the group or of any sub-command (a missing argument, an
    unknown option or command, a bad option value) exits 3, whichever module defines the command."""

    def __call__(self, *args, **kwargs):
        """The ``ckptaudit`` process's entry point (click's ``main`` in standalone mode ends the process with
        ``SystemExit``); tests call :meth:`main` and keep running, so only this path freezes the heap."""
        try:
            return super().__call__(*args, **kwargs)
        finally:
            if kwargs.get("standalone_mode", True):
                from ..stages.jobs.process import freeze_before_exit

                freeze_before_exit()

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as e:
            e.exit_code = EXIT_FAILED
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            e.exit_code = EXIT_FAILED
            raise


def check_paths(run_dir: str, out_dir: str) -> tuple:
    """(run folder, output folder) of ``audit``, both resolved; raises :class:`click.ClickException`.

    Refused: an empty run path (``Path("")`` is the current folder, which would be
    audited by accident), a local run path that does not exist or is a file
    (:func:`ckptaudit.pipeline.check_run_dir`), an empty ``--out``, an ``--out`` that is a
    file, and an ``--out`` that is the run folder or inside it (the audit would write
    ``.snakemake/``, tables and logs into what it audits)."""
    from ..pipeline import check_out_dir, check_run_dir

    if not run_dir.strip():
        raise click.ClickException("RUN_DIR is empty; give the run folder (or s3://bucket/prefix) to audit")
    if not out_dir.strip():
        raise click.ClickException("--out is empty; give the folder the report is written to")
    out = Path(out_dir).resolve()
    if out.exists() and not out.is_dir():
        raise click.ClickException(f"--out {out_dir}: is a file; give the folder the report is written to "
                                   "(it is created when missing)")
    if "://" in run_dir:  # s3://… is checked by the inventory stage
        return run_dir, out
    rd = Path(run_dir)
    try:
        check_run_dir(rd)
    except ValueError as e:
        raise click.ClickException(str(e))
    try:
        check_out_dir(rd, out)
    except ValueError as e:
        raise click.ClickException(f"--out {out_dir}: {e}")
    return str(rd.resolve()), out


@contextmanager
def failures_exit_3(prog: str, what: str) -> Iterator[None]:
    """Run a command's body; a :class:`click.ClickException` or any other failure of the command itself
    prints one line (``{prog}: error: …`` / ``{prog}: {what} itself failed: Type: …``) and exits 3; SIGINT
    (:class:`Interrupted`, or a ``KeyboardInterrupt`` outside the workflow) prints ``{prog}: interrupted
    (Ctrl-C): …`` and exits 130."""
    try:
        yield
    except (Interrupted, KeyboardInterrupt) as e:
        why = e.message if isinstance(e, Interrupted) else f"{what} did not finish"
        click.echo(shown(f"{prog}: interrupted (Ctrl-C): {why}"), err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as e:
        click.echo(f"{prog}: error: " + "\n".join(shown(ln) for ln in e.message.split("\n")), err=True)
        sys.exit(EXIT_FAILED)
    except Exception as e:  # noqa: BLE001 - any workflow failure is exit 3 with its cause
        click.echo(shown(f"{prog}: {what} itself failed: {type(e).__name__}: {e}"), err=True)
        sys.exit(EXIT_FAILED)
