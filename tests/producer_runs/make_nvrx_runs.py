"""Writes tests/producer_runs/nvrx_*: NVRx's own LocalCheckpointManager on two gloo ranks (CPU), three saves.

Not run by the tests (nvidia-resiliency-ext is not in the project's environment).  Made with nvidia-resiliency-ext
0.4.1 and torch 2.13.0+cpu in a throwaway venv (``python3 -m venv /tmp/nvrx && /tmp/nvrx/bin/pip install
torch==2.13.0 nvidia-resiliency-ext numpy``), as ``/tmp/nvrx/bin/python tests/producer_runs/make_nvrx_runs.py``.

* ``nvrx_clean``: iterations 10, 20, 30 saved; ``_cleanup`` leaves iteration 30 on each rank.
* ``nvrx_killed``: rank 0 dies in its save of iteration 30 after ``torch.save`` returned and before ``_save``'s
  ``rename`` (``Path.rename`` replaced by ``os._exit``): ``iter_0000030_0_local.dirty.pt`` stays, rank 1 finished
  ``iter_0000030_1_local.pt``, and iteration 20 was not cleaned up.  NVRx's own ``find_latest`` on that folder
  (two ranks again) answers 20; this script checks that.

``BasicTensorAwareStateDict.__init__`` asserts CUDA tensors; ``save`` copies every tensor to the CPU before
``torch.save`` anyway, so the holder is built empty and given the CPU state dict: the pickle is the one a GPU run
writes.
"""

import os
import pathlib
import shutil
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from nvidia_resiliency_ext.checkpointing.local.basic_state_dict import BasicTensorAwareStateDict
from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager

HERE = pathlib.Path(__file__).resolve().parent


def _train(rank, root, kill, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mgr = LocalCheckpointManager(root, session_id="run1")
    for it in (10, 20, 30):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        sd = BasicTensorAwareStateDict({})
        sd.state_dict = {"model": model.state_dict(), "optimizer": opt.state_dict(), "iteration": it}
        if kill and it == 30 and rank == 0:
            pathlib.Path.rename = lambda self, target: os._exit(0)  # killed between torch.save and the rename
        mgr.save(sd, it)
    dist.destroy_process_group()


def _latest(rank, root, out, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    it = LocalCheckpointManager(root, session_id="run1").find_latest()
    if rank == 0:
        pathlib.Path(out).write_text(str(it))
    dist.destroy_process_group()


def main():
    for name, kill, want in (("nvrx_clean", False, 30), ("nvrx_killed", True, 20)):
        root = HERE / name
        shutil.rmtree(root, ignore_errors=True)
        try:
            mp.spawn(_train, args=(str(root), kill, 29533), nprocs=2, join=True)
        except Exception:  # rank 1 waits in the barrier for the rank that died
            if not kill:
                raise
        probe = HERE / "find_latest.txt"
        mp.spawn(_latest, args=(str(root), str(probe), 29534), nprocs=2, join=True)
        got = int(probe.read_text())
        probe.unlink()
        assert got == want, (name, got)
        print(name, sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()), "find_latest", got)


if __name__ == "__main__":
    sys.exit(main())
