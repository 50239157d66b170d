"""``python -m ckptaudit.cli``: the ``ckptaudit`` command."""

from . import main

main()
