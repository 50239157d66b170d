"""Runs written by real frameworks (tests/frameworks/fw_*.py) are judged as the way they were made says.

The fixtures are generated into a cache keyed by the fixture sources and the
framework versions of the interpreter they run under: ``<repo>/.fixture-cache/<key>/``
(``CKPTAUDIT_FIXTURE_CACHE`` replaces ``<repo>/.fixture-cache``), and reused when
present.  Each is generated when a test first asks for it (``fixture_cache / name``),
under a lock of its own, so the two pytest-xdist workers generate different
fixtures at once (tests/conftest.py keeps each framework's tests on one worker).
Generate them all by hand with ``python -m tests.frameworks.generate --out DIR --jobs 2``.

Each fixture is audited twice: with the producer contracts on, and off
(``CKPTAUDIT_PRODUCER_CONTRACTS=0``); both must reach the fixture's truth.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptaudit.pipeline import audit_in_process

from .conftest import PAYLOAD, REPO, tree_digest
from .frameworks import generate as G

FIXTURES = G.list_fixtures()
NAMES = sorted(FIXTURES)


def _cache_base() -> Path:
    return Path(os.environ.get("CKPTAUDIT_FIXTURE_CACHE") or REPO / ".fixture-cache")


def _usable(d: Path) -> bool:
    return (d / "truth.json").exists() or (d / "skipped.json").exists()


def _ensure_interpreter(spec: G.Spec) -> None:
    """Create the extra interpreter ``spec`` runs under (transformers 4.57 beside 5.x), once, under a lock: two
    pytest workers must not build one venv at once, nor compute its fixtures' cache key while it is half made.
    Only the fixtures of that interpreter wait for it: the others' cache key does not depend on it.

    A failed set-up is not an error here: those fixtures are then skipped with the set-up command
    as the reason (generate.py writes skipped.json).
    """
    if not spec.python or not spec.python_setup:
        return
    base = _cache_base()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "interpreters.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not Path(spec.interpreter()).exists():
            r = subprocess.run(spec.python_setup, shell=True, cwd=str(REPO), capture_output=True, text=True,
                               timeout=900)
            sys.stderr.write(f"set-up of {spec.python}: exit {r.returncode}\n{r.stdout[-2000:]}"
                             f"{r.stderr[-2000:]}")


class FixtureCache:
    """The generated fixtures; ``cache / name`` is ``<base>/<key>/<name>``, generated first when it is not there
    yet (``python -m tests.frameworks.generate --only name``, under the fixture's own file lock: every pytest
    worker shares the folder, and one that asks for a fixture another is generating waits for it).  ``<key>``
    hashes the fixture sources and the framework versions of the interpreter the fixture runs under
    (:func:`tests.frameworks.generate.cache_key` of the fixtures that share it), so the fixtures of this
    interpreter are found without building another one first.
    A fixture whose generation failed is generated once more (a multi-rank launch on a loaded machine can die
    of the machine: a DeepSpeed rank once aborted mid-step in a fresh clone's CI, and its regeneration passed),
    then not again in this process (its test reports failed.json; the first failure is in its stderr)."""

    def __init__(self, base: Path):
        self.base = base
        self._specs = G.fixture_specs()
        self._roots: dict = {}
        self._tried: set = set()

    def root(self, python: str | None = None) -> Path:
        """The folder of the fixtures run under ``python`` (None: this interpreter), made when missing."""
        if python not in self._roots:
            group = {n: s for n, s in self._specs.items() if s.python == python}
            self._roots[python] = self.base / G.cache_key(group)
            self._roots[python].mkdir(parents=True, exist_ok=True)
        return self._roots[python]

    def __truediv__(self, name: str) -> Path:
        spec = self._specs.get(name)
        if spec is not None:
            _ensure_interpreter(spec)
        root = self.root(spec.python if spec is not None else None)
        d = root / name
        if name in FIXTURES and name not in self._tried and not _usable(d):
            self._tried.add(name)
            with open(root / f".{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                cmd = [sys.executable, "-m", "tests.frameworks.generate", "--out", str(root), "--only", name]
                for attempt in (1, 2):
                    if _usable(d):
                        break
                    if attempt == 2:  # one more try, the first one's output kept in the test's report
                        failed = d / "failed.json"
                        sys.stderr.write(f"{name}: generation failed once, trying again; it said:\n"
                                         f"{failed.read_text()[-4000:] if failed.exists() else '(nothing)'}\n")
                    r = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True)
                    sys.stderr.write(r.stdout[-6000:])  # the fixture's time, shown with -s / on failure
        return d


@pytest.fixture(scope="session")
def fixture_cache() -> FixtureCache:
    """The generated fixtures, each generated when first asked for (:class:`FixtureCache`)."""
    return FixtureCache(_cache_base())


def _summary(v: dict) -> str:
    lines = [f"recommendation={v['recommendation']} rollback={(v.get('rollback') or {}).get('unit')}"]
    for u in v["units"]:
        lines.append(f"  unit {u['unit']} (layout {u.get('layout')}, step {u.get('step')}): usable_for={u['usable_for']}")
        for f in u["findings"]:
            if f["severity"] != "info":
                lines.append(f"    {f['severity']:<7} {f['layer']:<9} {f['kind']}: {f['message'].splitlines()[0][:240]}")
    for p in v.get("pointers") or []:
        lines.append(f"  pointer {p}")
    for f in v.get("pointer_findings") or []:
        lines.append(f"  pointer finding {f.get('severity')} {f.get('kind')}: {str(f.get('message'))[:200]}")
    return "\n".join(lines)


def test_listing_imports_no_framework():
    """list_fixtures() reads the fw modules without importing torch or any framework."""
    code = ("import sys; from tests.frameworks import generate as G; n = G.list_fixtures(); "
            "bad = sorted(m for m in ('torch', 'transformers', 'accelerate', 'lightning', 'deepspeed', 'safetensors') "
            "if m in sys.modules); print(len(n), bad); assert n and not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("contracts", ["on", "off"])
@pytest.mark.parametrize("name", NAMES)
def test_framework_fixture(name, contracts, fixture_cache, tmp_path, monkeypatch):
    d = fixture_cache / name
    if (d / "skipped.json").exists():
        pytest.skip(json.loads((d / "skipped.json").read_text())["reason"])
    if (d / "failed.json").exists() or not (d / "truth.json").exists():
        tail = json.loads((d / "failed.json").read_text())["output_tail"] if (d / "failed.json").exists() else ""
        pytest.fail(f"fixture {name} was not generated ({d}):\n{tail[-4000:]}")
    truth = json.loads((d / "truth.json").read_text())
    exp = truth["expect"]
    if contracts == "off":
        monkeypatch.setenv("CKPTAUDIT_PRODUCER_CONTRACTS", "0")
    else:
        monkeypatch.delenv("CKPTAUDIT_PRODUCER_CONTRACTS", raising=False)
    run = d / "run"
    before = tree_digest(run)

    v = audit_in_process(run, truth["audit_config"], out_dir=tmp_path / "out")

    assert tree_digest(run) == before, "the audit changed the run folder"
    payloads = [p for where in (run, tmp_path) for p in where.rglob(PAYLOAD)]
    assert not payloads, f"a pickle's payload ran: {payloads}"
    s = f"{name} [{truth['description']}]\n{_summary(v)}"
    got_rollback = (v.get("rollback") or {}).get("unit")
    assert (v["recommendation"], got_rollback) == (exp["recommendation"], exp["rollback"]), \
        f"expected {exp['recommendation']} / rollback {exp['rollback']}\n{s}"
    if "rollback_step" in exp:  # where the framework's own resume continues (timm's, ultralytics' epoch)
        assert (v.get("rollback") or {}).get("step") == exp["rollback_step"], \
            f"rollback step {(v.get('rollback') or {}).get('step')}, the framework resumes at " \
            f"{exp['rollback_step']}\n{s}"
    units = {u["unit"]: u for u in v["units"]}
    if exp["clean"]:
        errors = [(u["unit"], f["kind"], f["message"].splitlines()[0]) for u in v["units"] for f in u["findings"]
                  if f["severity"] == "error"]
        assert not errors, "clean run has error findings:\n" + "\n".join(f"  {e}" for e in errors) + f"\n{s}"
    # 0 security false alarms on every framework fixture, clean or damaged (issues 12 and 24): each file here
    # is the framework's own, so no security warning or error may name one (info on benign globals is fine)
    # (a fixture whose own resume unpickles without weights_only lists the warnings that are then true)
    sec = [(u["unit"], f["kind"], f["severity"], f.get("path")) for u in v["units"] for f in u["findings"]
           if f["layer"] == "security" and f["severity"] != "info" and f["kind"] not in exp.get("security_true", ())]
    assert not sec, f"security false alarm on a framework's own files: {sec}\n{s}"
    for unit, want in exp["damaged"].items():
        assert unit in units, f"damaged unit {unit} not among the audited units {sorted(units)}\n{s}"
        u = units[unit]
        assert u["usable_for"] == want["usable_for"], \
            f"{unit}: usable_for {u['usable_for']}, expected {want['usable_for']}\n{s}"
        # the finding that explains the damage: an error or warning of the truth's layer, or (a unit that is
        # still usable, e.g. weights saved alone) a finding of that layer whose cap is what the unit is good for
        layer = [f for f in u["findings"] if f["layer"] == want["layer"]
                 and (f["severity"] in ("error", "warning") or f["caps"] == want["usable_for"] != "resume")]
        assert layer, f"{unit}: no {want['layer']}-layer finding explains usable_for {want['usable_for']}\n{s}"
