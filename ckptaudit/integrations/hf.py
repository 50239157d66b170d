"""Hugging Face Trainer: ``trainer.train(resume_from_checkpoint=last_good(args.output_dir))``, and
``Trainer(..., callbacks=[SealCallback()])`` to seal every save and keep ``latest``.

The Trainer's own ``resume_from_checkpoint=True`` takes ``trainer_utils.get_last_checkpoint(output_dir)``, the
``checkpoint-<N>`` folder with the largest N whatever it holds (a save cut short, a folder without
``scheduler.pt`` whose optimizer the resume then drops: :mod:`ckptaudit.producers.hf_trainer`).  Its
``model.safetensors`` has no checksum of its own: a flipped bit in a tensor is found by nothing unless a
digest was taken when the save ended, which :class:`SealCallback` does.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

from . import last_good_unit

__all__ = ["last_good", "SealCallback"]  # noqa: F822 - SealCallback is built by __getattr__


def last_good(output_dir: str | os.PathLike, audit: Optional[str | os.PathLike] = None,
              must_exist: bool = False) -> Optional[str]:
    """The path of the ``checkpoint-<N>`` folder to pass as ``resume_from_checkpoint``: the newest that passes
    every check and resumes the run faithfully; None when ``output_dir`` holds no checkpoint yet (the
    Trainer then starts fresh).  Raises :class:`ckptaudit.safe_load.NoUsableCheckpointError` when it holds
    checkpoints and none can be resumed from."""
    ckpt = last_good_unit(output_dir, audit=audit, must_exist=must_exist)
    return str(ckpt.path) if ckpt is not None else None


class _Sealer:
    """The work of :class:`SealCallback`, free of transformers: seal ``checkpoint-<step>`` on a thread (one
    at a time, in save order), then move ``latest`` to it.  An error is kept and raised at the next save or
    at the end of training, never swallowed."""

    def __init__(self, background: bool = True):
        self.background = background
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self.sealed: list = []

    def start(self, output_dir: str, step: int) -> None:
        self.wait()
        if not self.background:
            return self._seal(output_dir, step)
        self._thread = threading.Thread(target=self._seal, args=(output_dir, step), name="ckptaudit-seal",
                                        daemon=False)
        self._thread.start()

    def _seal(self, output_dir: str, step: int) -> None:
        from ..publish import seal_folder, update_latest

        unit = f"checkpoint-{step}"
        try:
            seal_folder(output_dir, unit, step, sealed_by="ckptaudit.integrations.hf.SealCallback")
        except FileNotFoundError:  # rotated away by save_total_limit before its seal: nothing to point at
            return
        except BaseException as e:  # noqa: BLE001 - raised in the training thread by wait()
            self._error = e
            return
        update_latest(output_dir, unit, step)
        self.sealed.append(unit)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"ckptaudit could not seal a checkpoint: {type(e).__name__}: {e}") from e


def __getattr__(name: str) -> Any:  # the callback class subclasses transformers' own, built on first use
    if name == "SealCallback":
        cls = _callback_class()
        globals()["SealCallback"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _callback_class() -> type:
    from transformers import TrainerCallback

    class SealCallback(TrainerCallback):
        """After every save of the Trainer (``on_save``: the weights, optimizer, scheduler, RNG and
        ``trainer_state.json`` are written), on the main process: a ``.sha256`` sidecar per file,
        ``COMPLETE`` and a ``ckptaudit.manifest/2`` ``manifest.json`` into ``checkpoint-<N>``
        (:func:`ckptaudit.publish.seal_folder`), then ``output_dir/latest`` moved to it (only forwards).  The
        hashing (one read of the folder, from the page cache) runs on a thread while training goes on
        (``background=False``: in ``on_save``); the next save and the end of training wait for it and raise
        its error.  With several processes, every process waits at a barrier first so that every rank's
        ``rng_state_<rank>.pth`` is in the folder.  A folder rotated away by ``save_total_limit`` before its
        seal is skipped.  The Trainer's own files are never changed."""

        def __init__(self, background: bool = True):
            self.sealer = _Sealer(background)

        def on_save(self, args, state, control, **kwargs):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                dist.barrier()
            if state.is_world_process_zero:
                self.sealer.start(str(args.output_dir), int(state.global_step))
            return control

        def on_train_end(self, args, state, control, **kwargs):
            self.sealer.wait()
            return control

    SealCallback.__module__ = __name__
    SealCallback.__qualname__ = "SealCallback"
    return SealCallback
