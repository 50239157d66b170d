"""The load stage: each file loaded by the framework's own loader in an isolated CPU child (:mod:`.loadtest`),
served by one process that has imported torch (:mod:`.server`)."""

from __future__ import annotations

from typing import Callable, List, Optional

from ..context import Part, StageContext
from ..rows import EarlierRows, LoadRow, LoadRows


def run(ctx: StageContext, part: Part, rows: EarlierRows, *, loader: Optional[Callable] = None) -> LoadRows:
    """The load test of ``part``'s units, given their scans (``rows.scan``); a remote object's copy leaves out the
    tensor data the hash stage's facts (``rows.hash``) name.  ``loader`` loads the files
    (:func:`.loadtest.load_units`; default: in this process): the rule's, :func:`.server.loader` (the audit's load
    server, which has imported torch once), or the reader's, :class:`.reader.ReaderLoads`.  The rows carry
    ``loadtest_bytes``, what the load children themselves read."""
    from ... import fs
    from .. import liveness
    from ..rows import HashRows
    from . import loadtest

    children_before = loadtest.child_bytes_read()  # the counter is per thread: this stage's share only
    scans = {s.unit: s.row for s in rows.scan.scans} if rows.scan is not None else {}
    # the facts only plan a remote object's sparse copy (ckptaudit.stages.load.remote_copy)
    facts = (rows.hash or HashRows(())).byte_facts(ctx.run_dir) if fs.is_remote(ctx.run_dir) else None
    units = list(part.units)
    cfg = dict(ctx.config)
    try:  # the part's units at once, so their small files share load children (ckptaudit.stages.load.child)
        out = _in_unit_order(units, loadtest.load_units(ctx.run_dir, units, scans, cfg, loader, facts))
    except Exception:  # noqa: BLE001 - again unit by unit: the error becomes a finding on the unit that raised it
        out = []
        for u in units:
            out.extend(liveness.guard("load", u, lambda: loadtest.load_units(ctx.run_dir, [u], scans, cfg),
                                      lambda f: [loadtest.skip_row(u["unit"], "", "the load stage failed on this "
                                                                                  "unit", (f,))]))
    return LoadRows(tuple(out), loadtest.child_bytes_read() - children_before)


def _in_unit_order(units: List[dict], rows: List[LoadRow]) -> List[LoadRow]:
    """``rows`` grouped by unit in the order of ``units`` (stable within a unit)."""
    order = {u["unit"]: i for i, u in enumerate(units)}
    return sorted(rows, key=lambda r: order.get(r.unit, len(order)))
