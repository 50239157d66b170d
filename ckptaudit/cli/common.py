"""What every ``ckptaudit`` sub-command shares: exit codes, usage errors as exit 3, checked paths."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click

#: the command itself failed (bad arguments or config, unreadable folder, workflow error)
EXIT_FAILED = 3


class ExitThreeOnUsageError(click.Command):
    """A command whose usage errors exit 3 (the audit's own failure), not click's 2 (which is "retrain")."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            e.exit_code = EXIT_FAILED
            raise


def check_paths(run_dir: str, out_dir: str) -> tuple:
    """(run folder, output folder) of ``audit``, both resolved; raises :class:`click.ClickException`.

    Refused: an empty run path (``Path("")`` is the current folder, which would be
    audited by accident), a local run path that is not a folder, an empty ``--out``, and
    an ``--out`` that is the run folder or inside it (the audit would write
    ``.snakemake/``, tables and logs into what it audits)."""
    from ..pipeline import check_out_dir

    if not run_dir.strip():
        raise click.ClickException("RUN_DIR is empty; give the run folder (or s3://bucket/prefix) to audit")
    if not out_dir.strip():
        raise click.ClickException("--out is empty; give the folder the report is written to")
    out = Path(out_dir).resolve()
    if "://" in run_dir:  # s3://… is checked by the inventory stage
        return run_dir, out
    rd = Path(run_dir)
    if not rd.is_dir():
        raise click.ClickException(f"{run_dir}: not a folder")
    try:
        check_out_dir(rd, out)
    except ValueError as e:
        raise click.ClickException(f"--out {out_dir}: {e}")
    return str(rd.resolve()), out


@contextmanager
def failures_exit_3(prog: str, what: str) -> Iterator[None]:
    """Run a command's body; a :class:`click.ClickException` or any other failure of the command itself
    prints one line (``{prog}: error: …`` / ``{prog}: {what} itself failed: Type: …``) and exits 3."""
    try:
        yield
    except click.ClickException as e:
        click.echo(f"{prog}: error: {e.message}", err=True)
        sys.exit(EXIT_FAILED)
    except Exception as e:  # noqa: BLE001 - any workflow failure is exit 3 with its cause
        click.echo(f"{prog}: {what} itself failed: {type(e).__name__}: {e}", err=True)
        sys.exit(EXIT_FAILED)
