"""Salvage's property over random state dicts, writers and damage (tests/salvage_property.py): it never raises,
never writes a tensor labelled intact or filled that differs from the original in dtype, shape or bytes, and
every file it writes loads with safetensors.torch.load_file holding exactly the keys salvage.json lists.  A
CI-sized number of examples; ``python benchmarks/bench_salvage_property.py`` runs ≥ 500."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from tests.salvage_property import case, check


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case())
def test_salvage_never_writes_what_differs_and_every_file_loads(c):
    tmp = Path(tempfile.mkdtemp(prefix="salvage-property-"))
    try:
        check(c, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
