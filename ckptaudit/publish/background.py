"""Background publish: ``save(..., background=True)`` stages the state, returns, and commits on a thread.

One publish in the background at a time per process: the next ``save``/``publish`` (either
kind) and :class:`~.preemption.PreemptionGuard`'s exit wait for it (:func:`wait_background`).
The commit is the blocking publish's own code run on a thread, so the protocol, every
``fsync`` and rename and what a crash at each step leaves are the same
(``docs/publish-protocol.md``).

Why a thread, not a process: the staged copy lives in this process's memory (a process
would need it copied again into shared memory, or a ``fork`` of a process that holds CUDA
contexts and threads, which is unsafe); hashing and ``os.write`` release the GIL, so the
thread competes with training only for the few milliseconds of pickling.  The thread is not
a daemon: a process that returns from ``main`` still finishes the commit before it exits.

A failed background commit is logged when it fails and raised once: by
:meth:`PendingPublish.wait`, or else by the next ``save``/``publish`` or
:func:`wait_background`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from .commit import PublishResult
from .staging import StagingCache, stage

log = logging.getLogger("ckptaudit.publish")

_LOCK = threading.Lock()
_IN_FLIGHT: list = []  # [PendingPublish] while one is running or its error is unreported
_CACHE = StagingCache()


class PendingPublish:
    """A publish committing in the background (what ``save(..., background=True)`` returns).

    ``unit``: the unit's name; ``staged_bytes``: tensor bytes copied to CPU memory;
    ``stage_seconds``: the copy's wall time (most of what ``save`` blocked for)."""

    def __init__(self, unit: str, staged_bytes: int, stage_seconds: float):
        self.unit, self.staged_bytes, self.stage_seconds = unit, staged_bytes, stage_seconds
        self._done = threading.Event()
        self._result: Optional[PublishResult] = None
        self._error: Optional[BaseException] = None
        self._reported = False
        self._thread: Optional[threading.Thread] = None

    def done(self) -> bool:
        """True once the commit has finished (published or failed)."""
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> PublishResult:
        """Block until the commit finishes; return its :class:`PublishResult`.

        Raises what the commit raised (:class:`PublishError`, an ``OSError`` after the
        commit, …), and ``TimeoutError`` if ``timeout`` seconds pass first (the commit goes
        on; call again)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.unit}: background publish still committing after {timeout} s; "
                               "call wait() again, or wait_background()")
        _forget(self)
        if self._error is not None:
            self._reported = True
            raise self._error
        return self._result  # type: ignore[return-value]

    def _run(self, commit: Callable[[], PublishResult]) -> None:
        try:
            self._result = commit()
        except BaseException as e:  # noqa: BLE001 - kept for wait() and the next save; logged now
            self._error = e
            log.error("%s: background publish failed: %s: %s; wait() or the next save raises it",
                      self.unit, type(e).__name__, e)
        finally:
            self._done.set()


def start(unit: str, obj: Any, commit: Callable[[Any], PublishResult]) -> PendingPublish:
    """Wait for the publish in flight (raising its unreported error), stage ``obj`` into CPU
    memory, and run ``commit(staged)`` on a thread; return its :class:`PendingPublish`."""
    wait_background()
    t0 = time.perf_counter()
    staged, nbytes = stage(obj, _CACHE)
    pending = PendingPublish(unit, nbytes, time.perf_counter() - t0)
    pending._thread = threading.Thread(target=pending._run, args=(lambda: commit(staged),),
                                       name=f"ckptaudit-publish-{unit}", daemon=False)
    with _LOCK:
        _IN_FLIGHT.append(pending)
    pending._thread.start()
    return pending


def wait_background() -> Optional[PublishResult]:
    """Wait for this process's background publish, if any; return its result (None if there
    was none).  Raises its error if it failed and neither :meth:`PendingPublish.wait` nor an
    earlier call reported it (once; the next call returns None)."""
    with _LOCK:
        pending = _IN_FLIGHT[0] if _IN_FLIGHT else None
    if pending is None:
        return None
    pending._done.wait()
    _forget(pending)
    if pending._error is not None and not pending._reported:
        pending._reported = True
        raise pending._error
    return pending._result


def release_staging_memory() -> int:
    """Wait for the background publish, then free the CPU copy kept for the next staging;
    returns the bytes freed.  Raises as :func:`wait_background`."""
    wait_background()
    n = _CACHE.nbytes
    _CACHE.release()
    return n


def _forget(pending: PendingPublish) -> None:
    with _LOCK:
        if pending in _IN_FLIGHT:
            _IN_FLIGHT.remove(pending)
