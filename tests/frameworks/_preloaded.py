"""Imported first by the fork server of :mod:`._forked`: torchvision's CPU shim, then torch, as every fixture
child did at its start (``_dist.main``, ``_util._main``)."""

from . import _torchvision

_torchvision.install()

import torch  # noqa: E402,F401 - the point of this module
