"""Keys a framework's resume reads from every checkpoint (ckptaudit/components/restore_rules.py:missing_keys).

A Lightning ``.ckpt`` that has every weight and all training state but not ``pytorch-lightning_version`` was
called resumable, and Lightning's ``trainer.fit(ckpt_path=...)`` raises ``KeyError`` on it.  The runs here are
written by Lightning itself (a tiny module, its default ``ModelCheckpoint``), and the truth of each judgement is
what Lightning's own resume does with the file, run in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckptaudit.pipeline import audit_in_process

pytest.importorskip("lightning")

_MODULE = textwrap.dedent("""
    import sys, torch, lightning as L
    from torch import nn

    class M(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 1)

        def training_step(self, b, i):
            x, y = b
            return nn.functional.mse_loss(self.l(x), y)

        def configure_optimizers(self):
            o = torch.optim.AdamW(self.parameters(), 1e-2)
            return [o], [torch.optim.lr_scheduler.StepLR(o, 1)]

    def loader():
        g = torch.Generator().manual_seed(0)
        ds = torch.utils.data.TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))
        return torch.utils.data.DataLoader(ds, batch_size=4)

    def trainer(root, epochs, **kw):
        return L.Trainer(max_epochs=epochs, default_root_dir=root, enable_progress_bar=False, logger=False,
                         enable_model_summary=False, **kw)
""")

_TRAIN = _MODULE + textwrap.dedent("""
    from lightning.pytorch.callbacks import ModelCheckpoint
    root, weights_only = sys.argv[1], sys.argv[2] == "1"
    cb = ModelCheckpoint(dirpath=root + "/checkpoints", save_top_k=-1, save_weights_only=weights_only)
    torch.manual_seed(0)
    trainer(root, 3, callbacks=[cb]).fit(M(), loader())
""")

_RESUME = _MODULE + textwrap.dedent("""
    import json
    root, ckpt = sys.argv[1], sys.argv[2]
    t = trainer(root + "/resume", 4)
    try:
        t.fit(M(), loader(), ckpt_path=ckpt)
        print(json.dumps({"ok": True, "global_step": t.global_step}))
    except Exception as e:
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}))
""")


#: torchvision (installed with the frameworks extra) importable with the CPU torch: lightning imports torchmetrics,
#: which imports torchvision (tests/frameworks/_torchvision.py)
_PRELUDE = "from tests.frameworks import _torchvision; _torchvision.install()\n"
_REPO = Path(__file__).resolve().parent.parent


def _py(code: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run([sys.executable, "-c", _PRELUDE + code, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


def _lightning_resume(run: Path, ckpt: str) -> dict:
    return json.loads(_py(_RESUME, str(run), ckpt, cwd=run).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory) -> Path:
    """A Lightning 2.x run: three epochs of 10 steps, every epoch's checkpoint kept (default save settings)."""
    root = tmp_path_factory.mktemp("lightning")
    _py(_TRAIN, str(root), "0", cwd=root)
    return root


def _strip_version(ckpt: Path) -> None:
    import torch

    d = torch.load(ckpt, map_location="cpu", weights_only=True)
    del d["pytorch-lightning_version"]
    torch.save(d, ckpt)


def test_a_lightning_checkpoint_without_its_version_key_is_no_resume_point(lightning_run, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    src = lightning_run / "checkpoints"
    for n in ("epoch=1-step=20.ckpt", "epoch=2-step=30.ckpt"):
        (run / n).write_bytes((src / n).read_bytes())
    _strip_version(run / "epoch=2-step=30.ckpt")

    truth = _lightning_resume(run, "epoch=2-step=30.ckpt")  # Lightning's own resume is the truth
    assert not truth["ok"] and truth["error"].startswith("KeyError") and "pytorch-lightning_version" in truth["error"]

    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    units = {u["unit"]: u for u in v["units"]}
    newest = units["epoch=2-step=30.ckpt"]
    assert newest["usable_for"] == "warm-start"
    f = next(f for f in newest["findings"] if f["kind"] == "resume_key_missing")
    assert (f["layer"], f["severity"], f["caps"]) == ("structure", "error", "warm-start")
    assert f["detail"]["keys"] == "'pytorch-lightning_version'"
    assert "KeyError" in f["message"] and "utilities/migration/utils.py:164" in f["message"]
    assert (v["recommendation"], v["rollback"]["unit"]) == ("resume", "epoch=1-step=20.ckpt")
    assert units["epoch=1-step=20.ckpt"]["usable_for"] == "resume"
    assert not [f for f in units["epoch=1-step=20.ckpt"]["findings"] if f["kind"] == "resume_key_missing"]

    # the repair, run as printed in the run folder, writes a copy that Lightning resumes from at its step
    _py(f["repair"], cwd=run)
    fixed = run / "epoch=2-step=30.repaired.ckpt"
    assert fixed.is_file() and f"'{fixed.name}'" in f["next_step"]
    again = _lightning_resume(run, fixed.name)
    assert again == {"ok": True, "global_step": 40}, again


def test_a_weights_only_save_is_told_as_one_and_a_plain_ckpt_is_not_lightnings(tmp_path):
    """``ModelCheckpoint(save_weights_only=True)`` leaves optimizer_states and lr_schedulers out on purpose: the
    unit is a warm start for want of optimizer state (missing_optimizer_state), not a broken resume; a ``.ckpt``
    of a custom loop holding none of Lightning's keys is never judged by Lightning's rule."""
    import torch

    root = tmp_path / "wo"
    root.mkdir()
    _py(_TRAIN, str(root), "1", cwd=root)
    run = root / "checkpoints"
    torch.save({"model": {"w": torch.ones(2)}, "optimizer": {"state": {}, "param_groups": []}, "step": 7},
               run / "custom.ckpt")
    v = audit_in_process(run, {}, out_dir=tmp_path / "out")
    kinds = {u["unit"]: {f["kind"] for f in u["findings"]} for u in v["units"]}
    newest = next(u for u in v["units"] if u["unit"] == "epoch=2-step=30.ckpt")
    assert newest["usable_for"] == "warm-start" and "missing_optimizer_state" in kinds[newest["unit"]]
    assert not any("resume_key_missing" in k for k in kinds.values()), kinds
