"""Argument parsers of the workflow's internal job commands: ``python -m ckptaudit.<module> COMMAND ARG…``.

A rule's shell command calls one sub-command with positional arguments, all required, so a missing one
is a usage error (exit 2) that names it, before any work starts.  (``ckptaudit.stages`` has flags
instead, one set per rule; the user-facing commands are click, in :mod:`ckptaudit.cli`.)
"""

from __future__ import annotations

import argparse
from typing import Mapping, Sequence, Tuple

#: {command: (help, [(METAVAR, help), …])}
Commands = Mapping[str, Tuple[str, Sequence[Tuple[str, str]]]]


def parser(prog: str, description: str, commands: Commands) -> argparse.ArgumentParser:
    """One sub-command per entry of ``commands``; each argument is stored under its metavar in lower case
    (``CONFIG_JSON`` → ``args.config_json``) and the chosen sub-command under ``args.command``."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_, args) in commands.items():
        sp = sub.add_parser(name, help=help_)
        for metavar, arg_help in args:
            sp.add_argument(metavar.lower(), metavar=metavar, help=arg_help)
    return ap
