"""Wall-clock seconds per key (``fsync_seconds``, ``verify_seconds`` …), for :class:`PublishResult`."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Dict, Iterator


class Clock:
    """Accumulates wall-clock seconds per key (``fsync_seconds``, ``verify_seconds`` …)."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}

    @contextmanager
    def __call__(self, key: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - t0
