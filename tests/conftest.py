import hashlib
import os
from pathlib import Path

import pytest

from tests.frameworks import _torchvision
from tests.frameworks.generate import fixture_specs

# timm and ultralytics (the frameworks extra) install torchvision, whose CUDA wheel cannot be imported with the CPU
# torch; torchmetrics imports it when installed, and so does every `import lightning`: import it the fixtures' way
_torchvision.install()

REPO = Path(__file__).resolve().parent.parent
CASES = Path(os.environ.get("CKPTAUDIT_CASES", REPO.parent / "shared" / "cases"))
PAYLOAD = "CKPTAUDIT_PAYLOAD_RAN"
# every verdict any test writes (in this process or an audit it starts) is checked against its JSON Schema
os.environ["CKPTAUDIT_CHECK_VERDICT_SCHEMA"] = "1"


def tree_digest(root: Path) -> dict:
    """{relative path: (size, sha256)} of every file and symlink under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for fn in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = Path(dirpath) / fn
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            else:
                out[rel] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """A real demo run (shorter than the default, same incident)."""
    from ckptaudit.demo import make_demo_run

    d = tmp_path_factory.mktemp("demo") / "run"
    return make_demo_run(d, max_steps=300, save_every=50)


@pytest.fixture(autouse=True)
def no_payload(tmp_path):
    yield
    for where in (Path.cwd(), tmp_path, REPO):
        assert not (where / PAYLOAD).exists(), f"a malicious pickle's payload ran ({where / PAYLOAD})"


@pytest.fixture(autouse=True)
def pandas_importable_after():
    """A test that runs a stage job's ``main()`` in this process leaves ``import pandas`` blocked
    (``ckptaudit.stages.jobs.process.without_pandas``, meant for short-lived job processes); later tests on the worker import torch,
    whose dynamo imports pandas if it can, and fail on the block.  Each test ends with the block removed."""
    import sys

    yield
    from ckptaudit.stages.jobs import process as job_process

    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, job_process._NoPandas)]


# ------------------------------------------------------------------ running on two workers (pytest-xdist)
# The README's test command runs `-n 2 --dist loadgroup`. A worker is a process with its own session, so a
# test that shares an expensive module- or session-scoped fixture is kept on one worker with the others that
# share it (else each worker would build it). The framework fixtures are generated when a test first asks for
# one, each under its own lock (tests/test_frameworks.py), so they are grouped by framework: one worker
# generates and judges Megatron's while the other does DeepSpeed's. Tests that share nothing are handed out
# one at a time.
CHEAP_SHARED = {"tmp_path_factory", "worker_id", "testrun_uid", "monkeypatch_session", "fixture_cache"}
FRAMEWORK_MODULES = {n: s.module.rsplit(".fw_", 1)[1] for n, s in fixture_specs().items()}

#: seconds a group takes besides its tests' own runs, where that is most of it: a framework group generates its
#: fixtures. Each module's sum of its fixtures' generation seconds, `python -m tests.frameworks.generate --out DIR
#: --jobs 2` on 2 cores (2026-12-06, the fixtures' processes forked from a fork server: tests/frameworks/_forked.py).
#: Only the order matters: longest first.
GROUP_SECONDS = {
    "framework-megatron_core": 80, "framework-hf_trainer": 58, "framework-lightning": 48,
    "framework-deepspeed": 41, "framework-torchtitan": 39, "framework-hf_trainer_tf4": 31,
    "framework-accelerate": 26, "framework-ultralytics": 23, "framework-plain": 19, "framework-fsdp_dcp": 15,
    "framework-timm": 13,
}


def _shared_group(item) -> str | None:
    """The xdist group of a test: its framework's group when it judges one framework fixture (a parameter
    ``name``); its file's name when it uses another shared fixture (test_gadgets' audits of several fixtures,
    shared by its tests, included); None when it shares none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    names = set(info.names_closure)
    if "fixture_cache" in names:
        fixture = getattr(getattr(item, "callspec", None), "params", {}).get("name")
        if fixture in FRAMEWORK_MODULES:
            return f"framework-{FRAMEWORK_MODULES[fixture]}"
        return item.path.name
    for name in names - CHEAP_SHARED:
        if any(d.scope in ("module", "session", "package") for d in info.name2fixturedefs.get(name) or ()):
            return item.path.name
    return None


def heaviest_first(groups: list) -> list:
    """Indices of ``groups`` (each test's group, None for a test alone) in the order to hand them out: whole
    groups, longest first (``GROUP_SECONDS``, else one second a test), so the two workers' last tests end
    together instead of one worker starting a long group while the other runs out of work; tests alone, and
    ties, keep their collected order."""
    size: dict = {}
    first: dict = {}
    for i, g in enumerate(groups):
        key = g if g is not None else ("alone", i)
        size[key] = size.get(key, 0) + 1
        first.setdefault(key, i)

    def seconds(key) -> float:
        return GROUP_SECONDS.get(key, 0) + size[key] if isinstance(key, str) else 1

    def key_of(i):
        k = groups[i] if groups[i] is not None else ("alone", i)
        return (-seconds(k), first[k], i)

    return sorted(range(len(groups)), key=key_of)


def pytest_configure(config):
    # The audits under test run in child processes (Snakemake, its jobs, the load server), each importing
    # ckptaudit afresh. An editable install leaves no bytecode, and where PYTHONDONTWRITEBYTECODE is set no
    # import writes any, so every child compiled ~120 modules again (0.29 against 0.18 CPU-s per job's import).
    # Compiling once here, as a regular `pip install` does, costs ~2 s (py_compile writes regardless of the
    # variable); the controller alone does it, before the workers start.
    if not hasattr(config, "workerinput"):
        import compileall

        for folder in ("ckptaudit", "tests"):
            compileall.compile_dir(str(REPO / folder), quiet=2, workers=1)
    # xdist's loadgroup hands groups out by their number of tests unless told not to; the order here (the
    # collection's, after pytest_collection_modifyitems below) weighs generation time too
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config, items):
    groups = []
    for item in items:
        group = _shared_group(item)
        groups.append(group)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items[:] = [items[i] for i in heaviest_first(groups)]


# ------------------------------------------------------------------ no skips in CI
# Under CI=true a test that would skip (a framework, a service, a generated corpus or a shared case missing)
# fails instead: CI has everything installed, so a skip there is something broken, and a skip hides it.
def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    # a skip raised by pytest.skip / skipif / importorskip (an expected-failure mark reports differently)
    if rep.skipped and _in_ci() and call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) and len(rep.longrepr) == 3 else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"CI=true: this test would have skipped ({reason}); under CI a skip is a failure"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and _in_ci():  # a module-level importorskip
        rep.outcome = "failed"
        rep.longrepr = f"CI=true: {collector.nodeid} would have been skipped ({rep.longrepr}); under CI a skip is a failure"


def copy_producer_run(name: str, dest: Path) -> Path:
    """A copy (links kept as links) of the run ``tests/producer_runs/<name>`` that a framework wrote itself."""
    import shutil

    run = dest / name
    shutil.copytree(REPO / "tests" / "producer_runs" / name, run, symlinks=True)
    return run


def unit_rows(v: dict) -> dict:
    """``{unit: (layout, step, usable_for)}`` of a verdict."""
    return {u["unit"]: (u["layout"], u["step"], u["usable_for"]) for u in v["units"]}
