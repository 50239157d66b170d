"""The local audit's start does not import executor plugins it will not use (``cli/snakemake.py``)."""
import json
import subprocess
import sys

_PROBE = r"""
import json, sys
from ckptaudit.cli.snakemake import _local_executors_only
with _local_executors_only() as done:
    import snakemake.api  # builds nothing more: the registry exists
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry
    local = sorted(ExecutorPluginRegistry().plugins)
    imported = sorted(m for m in ("pandas", "snakemake_executor_plugin_slurm") if m in sys.modules)
every = sorted(ExecutorPluginRegistry().plugins)  # after the run: whoever builds it next collects every plugin
print(json.dumps({"done": done, "local": local, "imported": imported, "every": every}))
"""


def test_local_run_registers_only_snakemakes_own_executors():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["done"] is True
    assert got["local"] == ["dryrun", "local", "touch"]
    assert got["imported"] == []
    # after the run, a run with another executor in the same process (or a library caller) gets every plugin
    assert {"dryrun", "local", "touch", "slurm"} <= set(got["every"])


_PARAMS_PROBE = r"""
import json, sys
from pathlib import Path
from snakemake.persistence import PersistenceBase
builtin = PersistenceBase._serialize_param_builtin
types = []
def recording(self, value):
    types.append(type(value).__module__ + "." + type(value).__qualname__)
    return builtin(self, value)
PersistenceBase._serialize_param_builtin = recording
from ckptaudit.cli.snakemake import run_workflow
original = PersistenceBase.__dict__["_serialize_param"]
from ckptaudit.config import load_user_config
cfg = load_user_config(None)
cfg.update(run_dir=sys.argv[1], out_dir=sys.argv[2])
ok = run_workflow(cfg, Path(sys.argv[2]), cores=2)
print(json.dumps({"ok": ok, "types": sorted(set(types)), "n": len(types), "pandas": "pandas" in sys.modules,
                  "restored": PersistenceBase.__dict__["_serialize_param"] is original}))
"""


def test_job_records_serialise_params_without_pandas(demo_run, tmp_path):
    """Snakemake records every finished job's params; ours are never pandas objects, so the builtin serialiser
    gives the records the pandas one would, and the scheduler does not import pandas to write them."""
    out = subprocess.run([sys.executable, "-c", _PARAMS_PROBE, str(demo_run.run_dir), str(tmp_path / "audit")],
                         capture_output=True, text=True, timeout=600)
    got = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else None
    assert got is not None, out.stderr[-3000:]
    assert got["n"] > 0 and got["pandas"] is False, got
    assert got["restored"] is True  # another workflow run later in this process gets Snakemake's own choice back
    assert not any(t.startswith("pandas.") for t in got["types"]), got["types"]
    assert (tmp_path / "audit" / "verdict.json").exists()
