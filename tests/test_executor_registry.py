"""The local audit's start does not import executor plugins it will not use (``cli/snakemake.py``)."""
import json
import subprocess
import sys

_PROBE = r"""
import json, sys
from ckptaudit.cli.snakemake import _every_executor, _local_executors_only
done = _local_executors_only()
import snakemake.api  # builds nothing more: the registry exists
from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry
local = sorted(ExecutorPluginRegistry().plugins)
imported = sorted(m for m in ("pandas", "snakemake_executor_plugin_slurm") if m in sys.modules)
_every_executor()
every = sorted(ExecutorPluginRegistry().plugins)
print(json.dumps({"done": done, "local": local, "imported": imported, "every": every}))
"""


def test_local_run_registers_only_snakemakes_own_executors():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["done"] is True
    assert got["local"] == ["dryrun", "local", "touch"]
    assert got["imported"] == []
    # a later run with another executor in the same process gets every installed plugin back
    assert {"dryrun", "local", "touch", "slurm"} <= set(got["every"])
