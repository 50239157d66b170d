"""Generate the real-framework fixtures.

Every module ``tests/frameworks/fw_*.py`` defines::

    REQUIRES = ["transformers", ...]        # import names the fixtures need
    FIXTURES = {"name": make_fn, ...}       # make_fn(dest: Path) -> truth dict
    PYTHON = ".fixture-cache/venv-tf4/bin/python"   # optional: the interpreter its fixtures run under
    PYTHON_SETUP = "..."                             # optional: how to create that interpreter

Frameworks are imported only inside functions, so :func:`list_fixtures` reads
the modules without importing any framework (it parses them; it imports a
module only when its ``FIXTURES`` is not a literal dict).

``python -m tests.frameworks.generate --out DIR [--only NAME ...] [--jobs N]``
runs each fixture's ``make_fn`` in a fresh subprocess (so SIGKILLs and imports
stay isolated) with an empty ``DIR/NAME/``; the fixture writes its run folder to
``DIR/NAME/run`` and returns its truth, written to ``DIR/NAME/truth.json`` with
``framework_version`` and ``torch_version`` added.  The processes the fixture
starts (training ranks, resume probes: ``_dist.launch``, ``_util.run_child``) fork
from a fork server that imported torch, REQUIRES and the module first
(:mod:`._forked`).  A fixture whose REQUIRES are not
installed gets ``DIR/NAME/skipped.json`` (the reason) instead; one that fails
gets ``DIR/NAME/failed.json``.  ``DIR/index.json`` lists every fixture's status
and seconds.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

FW_DIR = Path(__file__).resolve().parent
REPO = FW_DIR.parent.parent
INSTALL_HINT = "pip install torch==2.13.0 -e '.[frameworks]'"
SKIP_RC = 3


@dataclass(frozen=True)
class Spec:
    name: str
    module: str                     # tests.frameworks.fw_x
    requires: tuple = ()
    python: str | None = None       # interpreter (relative to the repo, or absolute); None: this one
    python_setup: str = ""

    def interpreter(self) -> str:
        if not self.python:
            return sys.executable
        p = Path(self.python)
        return str(p if p.is_absolute() else REPO / p)

    def skip_hint(self, missing: str) -> str:
        if self.python and missing == "interpreter":
            return f"needs the interpreter {self.python}: {self.python_setup or 'create it'}"
        if self.python:
            return f"needs {missing} in {self.python}: {self.python_setup or 'create that interpreter'}"
        return f"needs {missing}: {INSTALL_HINT}"


def _literal(node):
    try:
        return ast.literal_eval(node)
    except Exception:
        return None


def _parse_module(path: Path) -> list[Spec]:
    tree = ast.parse(path.read_text(), filename=str(path))
    module = f"tests.frameworks.{path.stem}"
    found: dict = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in ("REQUIRES", "FIXTURES", "PYTHON", "PYTHON_SETUP"):
                    found[t.id] = node.value
    requires = tuple(_literal(found["REQUIRES"]) or ()) if "REQUIRES" in found else ()
    python = _literal(found["PYTHON"]) if "PYTHON" in found else None
    setup = _literal(found["PYTHON_SETUP"]) if "PYTHON_SETUP" in found else ""
    names = None
    fx = found.get("FIXTURES")
    if isinstance(fx, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in fx.keys):
        names = [k.value for k in fx.keys]
    if names is None:           # not a literal dict: import the module (it imports no framework at top level)
        mod = importlib.import_module(module)
        names = list(mod.FIXTURES)
        requires = tuple(getattr(mod, "REQUIRES", requires))
        python = getattr(mod, "PYTHON", python)
        setup = getattr(mod, "PYTHON_SETUP", setup)
    return [Spec(n, module, requires, python, setup or "") for n in names]


def fixture_specs() -> dict[str, Spec]:
    """Every fixture of every fw_*.py module, by name (no framework is imported)."""
    out: dict[str, Spec] = {}
    for path in sorted(FW_DIR.glob("fw_*.py")):
        for s in _parse_module(path):
            if s.name in out:
                raise ValueError(f"fixture {s.name} defined in {out[s.name].module} and {s.module}")
            out[s.name] = s
    return out


def list_fixtures() -> dict[str, list[str]]:
    """{fixture name: REQUIRES}, without running or importing any framework."""
    return {n: list(s.requires) for n, s in fixture_specs().items()}


# ---- versions (run in the fixture's interpreter; importlib.metadata only, nothing is imported)
_VERSIONS_SRC = r"""
import importlib.metadata as md, importlib.util, json, sys
names = json.loads(sys.argv[1])
dists = md.packages_distributions()
out = {}
for n in names:
    v = None
    if importlib.util.find_spec(n) is not None:
        for d in dists.get(n, [n]):
            try:
                v = md.version(d); break
            except md.PackageNotFoundError:
                pass
        v = v or "unknown"
    out[n] = v
print(json.dumps(out))
"""


def versions(spec: Spec) -> dict:
    """{import name: installed version or None} for torch and the REQUIRES, in the fixture's interpreter."""
    names = ["torch", *[r for r in spec.requires if r != "torch"]]
    py = spec.interpreter()
    if not Path(py).exists():
        return {n: None for n in names}
    r = subprocess.run([py, "-c", _VERSIONS_SRC, json.dumps(names)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return {n: None for n in names}
    return json.loads(r.stdout)


def missing(spec: Spec) -> str | None:
    """Why the fixture cannot run here (None: it can)."""
    if spec.python and not Path(spec.interpreter()).exists():
        return spec.skip_hint("interpreter")
    miss = [n for n, v in versions(spec).items() if v is None]
    return spec.skip_hint(", ".join(miss)) if miss else None


def cache_key(specs: dict[str, Spec] | None = None) -> str:
    """Hash of the fixture sources and the framework versions each interpreter has."""
    specs = specs if specs is not None else fixture_specs()
    h = hashlib.sha256()
    for p in sorted(FW_DIR.glob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    groups: dict = {}
    for s in specs.values():
        groups.setdefault((s.python or "", s.python_setup), set()).update(s.requires)
    for (py, setup), reqs in sorted(groups.items(), key=lambda kv: kv[0]):
        spec = Spec("-", "-", tuple(sorted(reqs)), py or None, setup)
        h.update(json.dumps([py, versions(spec)], sort_keys=True).encode())
    return h.hexdigest()[:16]


# ---- running one fixture
def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1", "WANDB_MODE": "disabled", "CUDA_VISIBLE_DEVICES": "",
        "PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "1",
    })
    env.setdefault("HF_HOME", str(Path(tempfile.gettempdir()) / "ckptaudit-fixtures-hf-home"))
    return env


def _child(module: str, name: str, dest: str) -> int:
    """In the fresh subprocess: find REQUIRES, name them for the fork server, run make_fn, write truth.json."""
    from . import _forked, _torchvision

    _torchvision.install()  # torchvision (timm's and ultralytics' dependency, torchmetrics' import) with the CPU torch
    mod = importlib.import_module(module)
    requires = list(getattr(mod, "REQUIRES", []))
    spec = Spec(name, module, tuple(requires), getattr(mod, "PYTHON", None), getattr(mod, "PYTHON_SETUP", ""))
    # The framework runs in the processes the fixture starts, which fork from a server that imported it once
    # (megatron.core costs ~4.3 CPU-s an import, lightning ~4.4); here it is only found, and a make function that
    # runs it in this process imports it there.  A framework that is installed but does not import is then an
    # error in the fixture's output, not a skip.
    for r in requires:
        try:
            found = importlib.util.find_spec(r) is not None
            err = None if found else f"ModuleNotFoundError: No module named {r!r}"
        except Exception as e:  # noqa: BLE001 - a parent package that does not import: cannot run here
            err = f"{type(e).__name__}: {e}"
        if err:
            Path(dest, "skipped.json").write_text(json.dumps(
                {"fixture": name, "reason": spec.skip_hint(r), "error": err}, indent=1))
            return SKIP_RC
    _forked.set_preload([*requires, module])
    truth = mod.FIXTURES[name](Path(dest))
    if not isinstance(truth, dict):
        raise TypeError(f"{module}.FIXTURES[{name!r}] returned {type(truth).__name__}, not a dict")
    if not Path(dest, "run").is_dir():
        raise RuntimeError(f"{name}: make_fn wrote no run folder at {dest}/run")
    truth.setdefault("fixture", name)
    v = versions(spec)
    truth["framework_version"] = {r: v.get(r) for r in requires}
    truth["torch_version"] = v.get("torch")
    Path(dest, "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=False) + "\n")
    return 0


def _run_child_session(py: str, spec: Spec, work: Path, timeout: float) -> tuple:
    """``(exit code, output tail)`` of the fixture's child, run in a session of its own: its output goes to files
    (a process it leaves behind cannot hold a pipe that this one waits on), and whatever of the session is still
    running when the child has ended is killed (a worker a SIGKILLed rank had spawned, say)."""
    cmd = [py, "-m", "tests.frameworks.generate", "--child", spec.module, spec.name, str(work)]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=str(work), env=child_env(), stdout=out, stderr=err, start_new_session=True)
        try:
            rc = p.wait(timeout)
            note = ""
        except subprocess.TimeoutExpired:
            rc, note = -1, f"timed out after {timeout} s\n"
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        out.seek(0)
        err.seek(0)
        tail = note + out.read().decode("utf-8", "replace")[-3000:] + err.read().decode("utf-8", "replace")[-6000:]
    return rc, tail


def run_one(spec: Spec, out: Path, timeout: float = 900) -> dict:
    final = out / spec.name
    work = out / f".work-{spec.name}"
    for p in (work,):
        if p.exists():
            shutil.rmtree(p)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    py = spec.interpreter()
    if spec.python and not Path(py).exists():
        (work / "skipped.json").write_text(json.dumps(
            {"fixture": spec.name, "reason": spec.skip_hint("interpreter")}, indent=1))
        rc, tail = SKIP_RC, ""
    else:
        rc, tail = _run_child_session(py, spec, work, timeout)
    secs = round(time.monotonic() - t0, 2)
    if rc == 0:
        status = "ok"
    elif rc == SKIP_RC and (work / "skipped.json").exists():
        status = "skipped"
    else:
        status = "failed"
        (work / "failed.json").write_text(json.dumps({"fixture": spec.name, "returncode": rc, "output_tail": tail},
                                                     indent=1))
    if final.exists():
        shutil.rmtree(final)
    work.rename(final)
    res = {"fixture": spec.name, "module": spec.module, "status": status, "seconds": secs}
    if status == "skipped":
        res["reason"] = json.loads((final / "skipped.json").read_text())["reason"]
    if status == "failed":
        res["output_tail"] = tail[-1500:]
    return res


def generate(out: Path, only: list[str] | None = None, jobs: int = 1, timeout: float = 900,
             quiet: bool = False) -> dict:
    specs = fixture_specs()
    unknown = sorted(set(only or []) - set(specs))
    if unknown:
        raise SystemExit(f"unknown fixture(s): {', '.join(unknown)}; known: {', '.join(specs)}")
    todo = [specs[n] for n in (only or specs)]
    out = Path(out).resolve()  # each fixture's child runs in its own folder: a relative --out would not be found
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def one(s):
        r = run_one(s, out, timeout)
        if not quiet:
            extra = f" ({r['reason']})" if r["status"] == "skipped" else ""
            extra = f"\n{r['output_tail']}" if r["status"] == "failed" else extra
            print(f"{r['fixture']:<40} {r['status']:<8} {r['seconds']:7.1f} s{extra}", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(one, todo))
    total = round(time.monotonic() - t0, 2)
    index_path = out / "index.json"
    with open(out / ".index.lock", "w") as lock:  # generators for other fixtures may share the folder (pytest workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = json.loads(index_path.read_text()) if index_path.exists() else {"fixtures": {}}
        for r in results:
            index["fixtures"][r["fixture"]] = r
        index["last_total_seconds"] = total
        index["jobs"] = jobs
        tmp = index_path.with_name(".index.json.tmp")
        tmp.write_text(json.dumps(index, indent=1) + "\n")
        tmp.replace(index_path)
    if not quiet:
        n = {s: sum(r["status"] == s for r in results) for s in ("ok", "skipped", "failed")}
        print(f"{len(results)} fixtures in {total:.1f} s (jobs {jobs}): {n['ok']} ok, {n['skipped']} skipped, "
              f"{n['failed']} failed -> {out}", flush=True)
    return index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.frameworks.generate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder to write DIR/NAME/{run,truth.json} into")
    ap.add_argument("--only", nargs="+", action="extend", metavar="NAME", help="only these fixtures")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per fixture")
    ap.add_argument("--list", action="store_true", help="list fixtures with their REQUIRES and interpreter")
    ap.add_argument("--child", nargs=3, metavar=("MODULE", "NAME", "DEST"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        return _child(*a.child)
    if a.list:
        for n, s in fixture_specs().items():
            print(f"{n:<40} {s.module:<36} {','.join(s.requires)}" + (f"  [{s.python}]" if s.python else ""))
        return 0
    if not a.out:
        ap.error("--out is required")
    index = generate(a.out, a.only, a.jobs, a.timeout)
    names = a.only or list(index["fixtures"])
    return 1 if any(index["fixtures"][n]["status"] == "failed" for n in names) else 0


if __name__ == "__main__":
    sys.exit(main())
