"""Lightning: ``trainer.fit(model, ckpt_path=last_good(checkpoint_callback.dirpath))``, and
``Trainer(plugins=[PublishCheckpointIO()])`` to write every save with sidecar and manifest.

``ckpt_path="last"`` loads ``last.ckpt`` (or the newest ``*.ckpt`` by mtime) whatever it holds; a
``last.ckpt`` that is a damaged second copy, or a symlink to a cut save, resumes from nothing usable.
Lightning 2.x's own ``TorchCheckpointIO`` writes through ``cloud_io._atomic_save`` (the whole
``torch.save`` in memory, then fsspec's local transaction: a temp file moved onto the name), with no fsync
and no digest: a power loss can leave a renamed file whose bytes never reached the disk, and a flipped
bit in a tensor is seen by nothing but the zip's CRC32 of its record.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from . import last_good_unit

__all__ = ["last_good", "PublishCheckpointIO"]  # noqa: F822 - PublishCheckpointIO is built by __getattr__


def last_good(dirpath: str | os.PathLike, audit: Optional[str | os.PathLike] = None,
              must_exist: bool = False) -> Optional[str]:
    """The ``.ckpt`` path to pass as ``ckpt_path``: the newest that passes every check and resumes the run
    faithfully; None when ``dirpath`` holds no checkpoint yet.  Raises
    :class:`ckptaudit.safe_load.NoUsableCheckpointError` when it holds checkpoints and none can be resumed
    from."""
    ckpt = last_good_unit(dirpath, audit=audit, must_exist=must_exist)
    return str(ckpt.path) if ckpt is not None else None


def publish_checkpoint(checkpoint: dict, path: str | os.PathLike) -> None:
    """Write Lightning's ``checkpoint`` dict to ``path`` as one file unit of :func:`ckptaudit.publish.publish`
    (temp name, hashed while written, fsynced, ``<name>.sha256`` and ``<name>.manifest.json``, renamed
    into place; its step is ``checkpoint["global_step"]``).  A name saved again (``last.ckpt``) is replaced
    so that its digests never describe the other copy's bytes.  ``latest`` is left alone: ``last.ckpt`` is
    Lightning's pointer.  Raises :class:`ckptaudit.publish.PublishError`."""
    from ..publish import publish

    p = Path(path)
    step = checkpoint.get("global_step", 0)
    # Lightning calls save_checkpoint on global rank 0 alone: one process writes the whole file unit
    with publish(p.parent, int(step) if isinstance(step, int) else 0, name=p.name, folder=False, rank=0,
                 world_size=1, update_latest=False, replace=True) as pub:
        pub.save(checkpoint)


def remove_published(path: str | os.PathLike) -> None:
    """Remove the sidecar and manifest that :func:`publish_checkpoint` wrote beside ``path`` (after Lightning
    removed the checkpoint itself)."""
    for suffix in (".sha256", ".manifest.json"):
        try:
            os.unlink(f"{os.fspath(path)}{suffix}")
        except FileNotFoundError:
            pass


def __getattr__(name: str) -> Any:  # the plugin subclasses Lightning's own, built on first use
    if name == "PublishCheckpointIO":
        cls = _plugin_class()
        globals()["PublishCheckpointIO"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _plugin_class() -> type:
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    class PublishCheckpointIO(TorchCheckpointIO):
        """Lightning ``CheckpointIO`` that publishes every save with :func:`publish_checkpoint` (local paths;
        a remote ``path`` such as ``s3://`` is written by Lightning's own ``TorchCheckpointIO``), removes its
        sidecar and manifest with the checkpoint, and loads as Lightning does.  Cost over Lightning's own
        save: the fsyncs, and the hashing, which overlaps the write."""

        def save_checkpoint(self, checkpoint: dict, path: Any, storage_options: Optional[Any] = None) -> None:
            if storage_options is not None or "://" in str(path):
                return super().save_checkpoint(checkpoint, path, storage_options)
            publish_checkpoint(checkpoint, path)

        def remove_checkpoint(self, path: Any) -> None:
            super().remove_checkpoint(path)
            if "://" not in str(path):
                remove_published(path)

    PublishCheckpointIO.__module__ = __name__
    PublishCheckpointIO.__qualname__ = "PublishCheckpointIO"
    return PublishCheckpointIO
