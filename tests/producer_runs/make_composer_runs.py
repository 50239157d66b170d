"""Writes tests/producer_runs/composer_*: a tiny MosaicML Composer run on the CPU, saved by its CheckpointSaver.

Not run by the tests (mosaicml is not in the project's environment).  Made with mosaicml 0.32.1 and torch
2.13.0+cpu in a throwaway venv: ``python3 -m venv /tmp/mosaic``; ``pip install`` the CPU torch 2.13.0 wheel,
``numpy "torchmetrics<1.7.5" tqdm pyyaml psutil coolname tabulate==0.9.0 py-cpuinfo packaging importlib-metadata
pillow requests "mosaicml-cli<0.8"``, then ``pip install --no-deps mosaicml==0.32.1 torch_optimizer==0.3.0``
(mosaicml 0.32.1 asks for torch<2.7.1 and torchvision, neither to be had for this torch here), and in
torchmetrics/utilities/imports.py ``_TORCHVISION_AVAILABLE = False``.  torchvision is replaced below by empty
modules: composer only imports it.  Run as ``/tmp/mosaic/bin/python tests/producer_runs/make_composer_runs.py``.

``ComposerClassifier`` over a 2-layer MLP, SGD with momentum, 3 epochs of 10 batches, ``save_interval="1ep"``,
the CheckpointSaver's default names: ``ep{epoch}-ba{batch}-rank{rank}.pt`` and the link ``latest-rank{rank}.pt``.

* ``composer_clean``: ep1-ba10, ep2-ba20, ep3-ba30; ``latest-rank0.pt -> ep3-ba30-rank0.pt``.
* ``composer_killed``: the same run SIGKILLed inside its third save once ep3-ba30-rank0.pt has 4 KiB on disk
  (``_write_checkpoint_file`` torch.saves into the final name; the link moves only after the save returns):
  ``latest-rank0.pt -> ep2-ba20-rank0.pt``.

Composer's own resume, ``Trainer(autoresume=True)`` on a copy, is checked here: clean resumes at batch 30,
killed at batch 20, and clean with ep3-ba30-rank0.pt cut to 9,000 bytes fails (OSError from torch.load).
"""

import importlib.abc
import importlib.machinery
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent


class _Any(type):
    def __getattr__(cls, name):
        return _Any(name, (), {})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any(name, (), {})


class _NoTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``torchvision`` module an empty package whose attributes are placeholder classes."""

    def find_spec(self, name, path, target=None):
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def _trainer(folder, **kw):
    import torch
    from composer import Trainer
    from composer.models import ComposerClassifier
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(80, 8)
    y = (x.sum(1) > 0).long()
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = ComposerClassifier(net, num_classes=2)
    return Trainer(model=model, train_dataloader=DataLoader(TensorDataset(x, y), batch_size=8), max_duration="3ep",
                   save_folder=str(folder), save_interval="1ep", run_name="tiny", device="cpu", progress_bar=False,
                   log_to_console=False, optimizers=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), **kw)


def _kill_inside_third_save(folder):
    import torch

    real_save = torch.save
    target = os.path.join(folder, "ep3-ba30-rank0.pt")

    class Slow:  # the save's bytes reach the disk in pieces, so the kill lands inside it
        def __init__(self, f):
            self.f = f

        def write(self, b):
            n = self.f.write(b)
            self.f.flush()
            time.sleep(0.05)
            return n

        def __getattr__(self, n):
            return getattr(self.f, n)

    def kill():
        while not (os.path.exists(target) and os.path.getsize(target) > 4096):
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGKILL)

    def save(obj, f, *a, **k):
        if getattr(f, "name", "") == target:
            threading.Thread(target=kill, daemon=True).start()
            return real_save(obj, Slow(f), *a, **k)
        return real_save(obj, f, *a, **k)

    torch.save = save


def _resumed_batch(run):
    with tempfile.TemporaryDirectory() as t:
        shutil.copytree(run, Path(t) / "run", symlinks=True)
        try:
            return _trainer(Path(t) / "run" / "checkpoints", autoresume=True).state.timestamp.batch.value
        except Exception as e:
            return type(e).__name__


def main():
    sys.meta_path.insert(0, _NoTorchvision())
    if len(sys.argv) == 3:  # a child: one run
        if sys.argv[2] == "kill":
            _kill_inside_third_save(sys.argv[1])
        _trainer(sys.argv[1]).fit()
        return 0
    for name, how in (("composer_clean", "clean"), ("composer_killed", "kill")):
        shutil.rmtree(HERE / name, ignore_errors=True)
        rc = subprocess.run([sys.executable, __file__, str(HERE / name / "checkpoints"), how]).returncode
        assert rc == (-signal.SIGKILL if how == "kill" else 0), (name, rc)
    assert _resumed_batch(HERE / "composer_clean") == 30
    assert _resumed_batch(HERE / "composer_killed") == 20
    with tempfile.TemporaryDirectory() as t:
        shutil.copytree(HERE / "composer_clean", Path(t) / "cut", symlinks=True)
        os.truncate(Path(t) / "cut" / "checkpoints" / "ep3-ba30-rank0.pt", 9000)
        assert _resumed_batch(Path(t) / "cut") == "OSError"
    for name in ("composer_clean", "composer_killed"):
        ck = HERE / name / "checkpoints"
        print(name, sorted(f"{p.name}{' -> ' + os.readlink(p) if p.is_symlink() else ''}" for p in ck.iterdir()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
