"""``ckptaudit findings``: print the finding catalogue, or rewrite docs/findings.md."""

from __future__ import annotations

import click

from ..config import workflow_dir
from .common import ExitThreeOnUsageError, failures_exit_3


@click.command("findings", cls=ExitThreeOnUsageError)
@click.option("--update-docs", "--update-readme", "update_readme", is_flag=True,
              help="Rewrite docs/findings.md (the catalogue the README links to).")
def findings_command(update_readme):
    """Print the finding catalogue (Markdown)."""
    from ..findings import catalogue_markdown
    from ..findings import update_readme as _update

    if update_readme:
        with failures_exit_3("ckptaudit findings", "the update"):
            changed = _update(workflow_dir() / "README.md")
        click.echo("docs/findings.md updated" if changed else "docs/findings.md already current")
        return
    click.echo(catalogue_markdown(), nl=False)
