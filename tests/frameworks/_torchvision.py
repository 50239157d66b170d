"""Importing torchvision with the CPU torch of these fixtures, for frameworks that import it (timm, ultralytics).

The torchvision wheel on the package index (0.28 for torch 2.13) is built against the CUDA torch: with the CPU
torch, ``import torchvision`` dies in ``torchvision/_meta_registrations.py`` while registering fake kernels for its
C++ operators (``RuntimeError: operator torchvision::nms does not exist``).  Neither framework's checkpointing uses
those operators (timm's ``CheckpointSaver`` and ultralytics' ``save_model`` are ``torch.save`` of a dict), so
:func:`import_torchvision` imports it with ``torch.library.register_fake`` and ``register_autograd`` made no-ops for
operator names that start with ``torchvision::`` (``register_fake`` used as a decorator hands the function back
unchanged), and restores both afterwards (the recipe of ``shared/formats/torchvision-on-cpu-torch.md``).  The
checkpoint bytes the frameworks then write are their own.

:func:`install` puts that import in place of the plain one for the whole process, without importing anything
itself.  It is needed beyond timm and ultralytics: once torchvision is installed (their dependency, so the
``frameworks`` extra brings it), torchmetrics imports it, and ``import lightning`` imports torchmetrics.  So the
test session (tests/conftest.py), the fork server the fixtures' processes start from (``_preloaded``) and every
fresh interpreter they start (generate.py's ``_child``, ``_util._main``, ``_dist.main``) install it first; the timm and ultralytics modules call it at their top as well.

Where a framework calls ``torchvision.ops.nms`` (ultralytics' validation, ``ultralytics/utils/nms.py``
``non_max_suppression``), :func:`use_nms` puts a pure-torch NMS in its place: ultralytics' own ``TorchNMS.nms``,
the one it uses when torchvision is not imported.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import sys

PREFIX = "torchvision::"


def _op_name(op) -> str:
    """The qualified name of a ``torch.library`` operator argument (a string in torchvision's own calls)."""
    return op if isinstance(op, str) else str(getattr(op, "_name", "") or op)


@contextlib.contextmanager
def _no_torchvision_kernels():
    """``torch.library.register_fake``/``register_autograd`` do nothing for ``torchvision::`` operators inside."""
    import torch.library

    real_fake, real_autograd = torch.library.register_fake, torch.library.register_autograd

    def register_fake(op, fn=None, *args, **kwargs):
        if _op_name(op).startswith(PREFIX):
            return fn if fn is not None else (lambda f: f)
        return real_fake(op, fn, *args, **kwargs)

    def register_autograd(op, *args, **kwargs):
        if _op_name(op).startswith(PREFIX):
            return None
        return real_autograd(op, *args, **kwargs)

    torch.library.register_fake, torch.library.register_autograd = register_fake, register_autograd
    try:
        yield
    finally:
        torch.library.register_fake, torch.library.register_autograd = real_fake, real_autograd


def import_torchvision():
    """``import torchvision`` that works with the CPU torch (see the module doc); the module, imported once."""
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    with _no_torchvision_kernels():
        import torchvision
    return torchvision


class _Finder(importlib.abc.MetaPathFinder):
    """Finds ``torchvision`` as the path finder does, and executes it under :func:`_no_torchvision_kernels`."""

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


class _Loader(importlib.abc.Loader):
    """A package loader whose ``exec_module`` runs with torchvision's kernel registrations suppressed."""

    def __init__(self, real):
        self.real = real

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        with _no_torchvision_kernels():
            self.real.exec_module(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self.real, name)


def install() -> None:
    """Make every later ``import torchvision`` of this process go through :func:`_no_torchvision_kernels` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def use_nms(nms) -> None:
    """Make ``torchvision.ops.nms`` the pure-torch ``nms(boxes, scores, iou_threshold) -> kept indices``."""
    import_torchvision()
    import torchvision.ops

    torchvision.ops.nms = nms
