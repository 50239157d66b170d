"""PreemptionGuard: turn SIGTERM/SIGUSR1 into a flag the training loop checks, with no torn unit."""

from __future__ import annotations

import logging
import signal
import time
from typing import Any, Dict, Optional, Sequence

from .background import wait_background
from .names import Preempted
from .phases import PHASES, in_exit

log = logging.getLogger("ckptaudit.publish")


class PreemptionGuard:
    """Turn preemption signals into a flag the training loop checks, with no torn unit.

    ``with PreemptionGuard() as guard:`` installs handlers for ``signals`` (SIGTERM: what
    Kubernetes and Slurm send first, SIGKILL following after the grace period,
    ``terminationGracePeriodSeconds`` 30 s by default and Slurm ``KillWait`` 30 s; SIGUSR1:
    what ``sbatch --signal=USR1@90`` sends ahead of the time limit).  A signal sets
    ``guard.requested`` (the signal number) and nothing else, so a save in flight finishes
    (``mode="finish"``).  With ``mode="abandon"`` a signal that arrives while a publish in
    this process is still inside the body of its ``with publish(…)`` block raises
    :class:`Preempted` there; the publish removes its temporary files and the exception
    propagates.  A signal that arrives once the body has ended (fsync, hashing, commit:
    finishing is quicker than undoing and leaves a usable unit) is only recorded.  The
    loop then saves or stops::

        with PreemptionGuard() as guard:
            for it in range(start, max_iters):
                train_step()
                if it % save_every == 0 or guard.requested:
                    save(state(), out_dir, it)
                if guard.requested:
                    break

    A background publish (``save(..., background=True)``) is never abandoned: its commit
    runs on a thread the signal does not reach, and leaving the ``with`` block waits for it
    (:func:`~.background.wait_background`), so a job that exits after the block does not
    cut a commit short; the block's grace period must cover that commit.  Its error, if it
    failed unreported, is raised there (logged instead when the block itself raised).

    Handlers are installed on enter and the previous ones restored on exit.  Raises
    ``ValueError`` outside the main thread (Python runs signal handlers only there) or
    for a bad ``mode``.
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGUSR1), mode: str = "finish"):
        if mode not in ("finish", "abandon"):
            raise ValueError(f"mode must be 'finish' or 'abandon', got {mode!r}")
        self.signals, self.mode = tuple(signals), mode
        self.requested: Optional[int] = None
        self.requested_at: Optional[float] = None
        self._previous: Dict[int, Any] = {}

    @property
    def should_stop(self) -> bool:
        return self.requested is not None

    def _handler(self, signum, frame) -> None:
        if self.requested is None:
            self.requested, self.requested_at = signum, time.time()
        # Abandon only while the block body of a publish runs.  Once _Publish.__exit__ has
        # started, the save is finished instead: its cleanup and commit must not be cut short
        # (a Preempted there would leave the temporary file behind).  The frame test covers
        # the signal that is handled on entry to __exit__, before its first statement ran.
        abandon = (self.mode == "abandon" and bool(PHASES) and PHASES[-1] == "writing"
                   and (frame is None or not in_exit(frame.f_code)))
        log.warning("received %s: %s", signal.Signals(signum).name,
                    "abandoning the save in flight" if abandon else "will stop after the current step/save")
        if abandon:
            raise Preempted(signum)

    def __enter__(self) -> "PreemptionGuard":
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            wait_background()
        except Exception as e:  # noqa: BLE001 - raised unless it would mask the block's exception
            if exc_type is None:
                raise
            log.error("background publish failed while leaving the guard: %s: %s", type(e).__name__, e)
        finally:
            for s, h in self._previous.items():
                signal.signal(s, h)
            self._previous.clear()
        return False
