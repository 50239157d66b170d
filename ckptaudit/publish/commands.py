"""The ``ckptaudit seal`` and ``ckptaudit prune`` commands (click), registered by :mod:`ckptaudit.cli`."""

from __future__ import annotations

import sys

import click

from .names import DEFAULT_CHUNK_BYTES
from .retention import prune
from .seal import seal


def _require_units(cmd: str, run_dir: str) -> None:
    """Exit 3 with one line when ``run_dir`` is missing or holds no checkpoint (:mod:`ckptaudit.stages.inventory.run_folder`)."""
    from ..stages.inventory.run_folder import check_has_units

    try:
        check_has_units(run_dir)
    except (ValueError, OSError) as e:
        click.echo(f"ckptaudit {cmd}: error: {e}", err=True)
        sys.exit(3)


@click.command("seal")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--chunk-mib", default=DEFAULT_CHUNK_BYTES >> 20, show_default=True, type=click.IntRange(1),
              help="MiB per chunk digest in the manifests.")
@click.option("--dry-run", is_flag=True, help="Say what would be sealed; write nothing.")
def seal_command(run_dir, chunk_mib, dry_run):
    """Write SHA-256 sidecars and manifests for the checkpoints of RUN_DIR that pass the audit.

    A Megatron-Core torch_dist iteration folder also gets integrity.json, in Megatron's format (for
    --verify-integrity); one already there that disagrees with the bytes is never overwritten.  Never touches
    data files.  Exit 0 when every unit is sealed (or already was), 1 when
    some unit was refused (the reason is printed), 3 when the audit itself failed (a missing, empty or
    checkpoint-less folder included)."""
    _require_units("seal", run_dir)
    try:
        outcomes = seal(run_dir, chunk_bytes=chunk_mib << 20, dry_run=dry_run)
    except Exception as e:  # noqa: BLE001 - an infrastructure failure is exit 3 with its cause
        click.echo(f"ckptaudit seal: error: {type(e).__name__}: {e}", err=True)
        sys.exit(3)
    for o in outcomes:
        click.echo(f"{o.action:<15} {o.unit}: {o.reason}")
        for w in o.written:
            click.echo(f"{'':<15}   wrote {w}")
    sys.exit(1 if any(o.action == "refused" for o in outcomes) else 0)


@click.command("prune")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--keep-last", type=click.IntRange(1), help="Keep the N newest verified units (a unit that does "
              "not verify is never counted, and never deleted).")
@click.option("--keep-every", type=click.IntRange(1), help="Keep units whose step is a multiple of K.")
@click.option("--keep-best", type=click.IntRange(1), help="Keep the N verified units with the best --metric.")
@click.option("--metric", help="Manifest metrics key for --keep-best.")
@click.option("--mode", type=click.Choice(["min", "max"]), default="min", show_default=True)
@click.option("--sweep-stale", is_flag=True, help="Also remove temp leftovers of dead writers on this host, and "
              "sidecars/manifests left without their file unit by a killed save or delete.")
@click.option("--dry-run", is_flag=True, help="Print what would be deleted; delete nothing.")
def prune_command(run_dir, keep_last, keep_every, keep_best, metric, mode, sweep_stale, dry_run):
    """Delete old verified checkpoints of RUN_DIR; never the newest verified one.

    With --sweep-stale and no --keep-* rule, only remove the leftovers of dead writers (every unit is kept).

    Exit 0 on success, 3 on bad arguments or an unreadable, missing, empty or checkpoint-less folder."""
    _require_units("prune", run_dir)
    try:
        plan = prune(run_dir, keep_last=keep_last, keep_every=keep_every, keep_best=keep_best, metric=metric,
                     mode=mode, sweep_stale=sweep_stale, dry_run=dry_run, echo=None)
    except (ValueError, OSError) as e:
        click.echo(f"ckptaudit prune: error: {e}", err=True)
        sys.exit(3)
    if sweep_stale and keep_last is None and keep_every is None and keep_best is None:
        click.echo("rollback point: not looked for (--sweep-stale alone reads no unit)")
    else:
        click.echo(f"rollback point: {plan.rollback or 'none (no unit verifies)'}")
    for d in sorted(plan.decisions, key=lambda d: d.action != "keep"):  # keeps first, then deletions
        step = f" (step {d.step})" if d.step is not None else ""
        if d.action == "keep":
            click.echo(f"keep    {d.unit}{step}: {d.reason}")
        else:
            click.echo(f"{'would delete' if dry_run else 'deleted'} {d.unit}{step}: {d.reason}")
    sys.exit(0)
