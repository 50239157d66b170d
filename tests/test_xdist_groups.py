"""The README's `-n 2 --dist loadgroup` keeps the tests that share an expensive fixture on one worker.

tests/conftest.py marks each test that uses a module- or session-scoped fixture with an ``xdist_group``;
pytest-xdist sends a group to one worker.  Both halves have broken silently before (this file exists
because of it): the marks must be added before xdist's own ``pytest_collection_modifyitems`` reads them
(``tryfirst``), and pytest-xdist 3.8 writes the group into ``item._nodeid``, which pytest 9.2 stopped
reading (pyproject pins pytest below 9.2).  Either way every shared fixture was built on both workers.
"""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import REPO

SAMPLE = '''
import pytest

@pytest.fixture(scope="module")
def expensive():
    return object()

@pytest.mark.parametrize("i", range(6))
def test_shared(i, expensive):
    pass

@pytest.mark.parametrize("i", range(6))
def test_alone(i):
    pass
'''


def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401  (the grouping under test)\n")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                          "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    ran = re.findall(r"\[(gw\d)\].*PASSED \S*::(test_\w+)\[\d\](@\S+)?", out.stdout)
    assert len(ran) == 12, out.stdout
    shared = {(w, g) for w, name, g in ran if name == "test_shared"}
    assert shared == {(next(iter(shared))[0], "@test_sample.py")}, out.stdout  # one worker, the file's group
    assert all(not g for _, name, g in ran if name == "test_alone")  # ungrouped: handed out one at a time


def test_heaviest_groups_are_handed_out_first():
    """Whole groups go out longest first (generation seconds, else one a test); tests alone keep their order."""
    from .conftest import heaviest_first

    groups = [None, "test_a.py", None, "framework-plain", "test_a.py", "framework-megatron_core", None]
    order = heaviest_first(groups)
    assert [groups[i] for i in order] == ["framework-megatron_core", "framework-plain", "test_a.py", "test_a.py",
                                          None, None, None]
    assert [i for i in order if groups[i] is None] == [0, 2, 6]


def test_every_framework_has_its_group_and_generation_seconds():
    """Each fw_*.py module's fixtures are one group with a generation estimate, so a new framework is not handed
    out last as a group of a few cheap-looking tests."""
    from .conftest import FRAMEWORK_MODULES, GROUP_SECONDS

    assert set(GROUP_SECONDS) == {f"framework-{m}" for m in FRAMEWORK_MODULES.values()}
    assert FRAMEWORK_MODULES["megatron_core_clean"] == "megatron_core"
