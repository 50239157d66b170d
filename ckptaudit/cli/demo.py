"""``ckptaudit demo``: train the bundled tiny GPT into a folder and stage a real incident."""

from __future__ import annotations

import click

from .common import ExitThreeOnUsageError, failures_exit_3


@click.command("demo", cls=ExitThreeOnUsageError)
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--max-steps", default=600, show_default=True)
@click.option("--save-every", default=100, show_default=True)
@click.option("--seed", default=1337, show_default=True)
@click.option("--no-incident", is_flag=True, help="Leave every checkpoint intact.")
def demo_command(out_dir, max_steps, save_every, seed, no_incident):
    """Train a tiny GPT on CPU into OUT_DIR and stage a real incident."""
    from ..demo import make_demo_run

    with failures_exit_3("ckptaudit demo", "the demo"):
        run = make_demo_run(out_dir, max_steps=max_steps, save_every=save_every, seed=seed, incident=not no_incident)
    click.echo(f"demo run in {run.run_dir}: steps {run.steps}; truncated {run.truncated}; flipped {run.flipped}")
