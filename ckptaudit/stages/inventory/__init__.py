"""The inventory stage: every unit, pointer and leftover of a run (:mod:`ckptaudit.discovery`), grouped into
the parts the other stages take (:mod:`.parts`)."""
