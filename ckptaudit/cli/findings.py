"""``ckptaudit findings``: print the finding catalogue, or rewrite the README's catalogue section."""

from __future__ import annotations

import click

from ..config import workflow_dir


@click.command("findings")
@click.option("--update-readme", is_flag=True, help="Rewrite the catalogue section of the repository README.")
def findings_command(update_readme):
    """Print the finding catalogue (Markdown)."""
    from ..findings import catalogue_markdown
    from ..findings import update_readme as _update

    if update_readme:
        changed = _update(workflow_dir() / "README.md")
        click.echo("README.md updated" if changed else "README.md already current")
        return
    click.echo(catalogue_markdown(), nl=False)
