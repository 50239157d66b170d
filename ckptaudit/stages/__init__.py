"""The audit's stages, one module or package per rule of ``rules/*.smk`` (``python -m ckptaudit.stages STAGE``,
the rules' CLI: :mod:`.cli`), and their order, defined once.  Imports nothing, so that importing one stage
does not import them all."""

#: The audit's stages in workflow order, defined here once: each is a rule of ``rules/*.smk`` whose shell line is
#: ``python -m ckptaudit.stages STAGE …`` and a module or package ``ckptaudit/stages/STAGE``.  ``inventory``,
#: ``target`` and ``report`` run once per audit, the others once per part of units.  Whoever else needs the list
#: (the verdict's and the reader's tables, the report's arguments, the findings' stages) is held equal to it by
#: tests/test_architecture.py.
STAGES = ("inventory", "hash", "scan", "load", "target", "structure", "configdiff", "state", "report")
#: The per-part stages and the tables each writes per part, in stage order (the order the verdict reads findings).
TABLES = {"hash": ("hash",), "scan": ("scan", "tensors", "imports"), "load": ("load",), "structure": ("structure",),
          "configdiff": ("configdiff",), "state": ("state",)}
