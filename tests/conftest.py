import hashlib
import os
from pathlib import Path

import pytest

from tests.frameworks import _torchvision

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


# ------------------------------------------------------------------ running on two workers (pytest-xdist)
# The README's test command runs `-n 2 --dist loadgroup`. A worker is a process with its own session, so a
# test that shares an expensive module- or session-scoped fixture is kept on one worker with the others that
# share it (else each worker would build it). The framework fixtures are one group across the files that
# judge them: a second worker would otherwise wait on their generation lock (tests/test_frameworks.py).
# Tests that share nothing are handed out one at a time.
SHARED_GROUPS = {"fixture_cache": "framework-fixtures"}
CHEAP_SHARED = {"tmp_path_factory", "worker_id", "testrun_uid", "monkeypatch_session"}


def _shared_group(item) -> str | None:
    """The xdist group of a test: the file's name when it uses a shared fixture; None when it shares none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    names = set(info.names_closure)
    for name, group in SHARED_GROUPS.items():
        if name in names:
            return group
    for name in names - CHEAP_SHARED:
        if any(d.scope in ("module", "session", "package") for d in info.name2fixturedefs.get(name) or ()):
            return item.path.name
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _shared_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


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
