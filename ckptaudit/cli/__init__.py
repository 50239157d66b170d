"""The ``ckptaudit`` command group: one click command per module of this package, registered here.

``ckptaudit audit RUN_DIR --out DIR`` runs the same Snakemake workflow as
``snakemake --cores N audit`` (:mod:`ckptaudit.cli.snakemake`); ``demo``, ``drill``,
``findings``, ``seal``, ``prune`` and ``salvage`` are the other commands.  Exit codes of ``audit``
(for cron and CI):

* 0 — the newest unit is usable for resume;
* 1 — roll back needed and possible (resume or warm-start from an older/other unit);
* 2 — nothing usable: retrain;
* 3 — the audit itself failed (bad arguments or config, unreadable folder, workflow error); one
  line on stderr says why.

Every command's usage errors (click's own, exit 2 by default, which here would read "retrain")
exit 3 (:class:`ExitThreeGroup`).

Each command module defines a plain ``@click.command``; none imports this face.
"""

from __future__ import annotations

import click

from .._version import __version__
from ..config import (CONFIG_MAX_BYTES, json_or_none, merge_config, load_user_config,  # noqa: F401 - re-exported
                      read_config_file, workflow_dir)
from ..publish import prune_command, seal_command
from ..outputs.summary import summary  # noqa: F401 - re-exported
from .audit import audit_command
from .common import EXIT_FAILED, ExitThreeGroup, ExitThreeOnUsageError, check_paths  # noqa: F401 - re-exported
from .demo import demo_command
from .drill import drill_command
from .findings import findings_command
from .salvage import salvage_command
from .snakemake import resolve_profile, run_snakemake_cli, run_workflow  # noqa: F401 - re-exported


@click.group(cls=ExitThreeGroup)
@click.version_option(__version__)
def main():
    """Audit the checkpoints of a training run and say where to roll back."""


main.add_command(audit_command, "audit")
main.add_command(demo_command, "demo")
main.add_command(findings_command, "findings")
main.add_command(seal_command, "seal")
main.add_command(prune_command, "prune")
main.add_command(drill_command, "drill")
main.add_command(salvage_command, "salvage")
