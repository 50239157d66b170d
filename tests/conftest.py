import hashlib
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CASES = Path(os.environ.get("CKPTAUDIT_CASES", REPO.parent / "shared" / "cases"))
PAYLOAD = "CKPTAUDIT_PAYLOAD_RAN"


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
