"""Snakemake's SIGTERM handler run on a thread of its own, not in the main thread the signal interrupts.

Snakemake's scheduler (snakemake 9.27, ``snakemake/scheduling/job_scheduler.py``) answers SIGTERM (``kill PID``,
a cron job's timeout) with ``exit_gracefully``, which takes the scheduler's ``threading.Lock``.  Python runs a
signal handler in the main thread between two bytecodes; when the signal lands while that thread itself holds the
lock (it does whenever it collects finished jobs), the handler waits for a lock only it can release, and the
audit hangs for good.  Jobs that end within milliseconds (the stage job server's: :mod:`ckptaudit.stages.jobs`)
made that window common: a SIGTERMed audit hung in 1 of 12 runs of ``tests/test_rerun.py``'s SIGTERM case.
On a thread, the handler waits until the main thread lets the lock go, then asks the scheduler to finish, as
Snakemake meant.
"""

from __future__ import annotations

import signal
import threading


def hand_sigterm_to_a_thread() -> bool:
    """Replace the current SIGTERM handler (Snakemake's, once its scheduler exists: call from ``onstart``) with
    one that starts a thread running it; returns whether it did.  Nothing is done off the main thread (only it
    may set handlers), for a default or ignored SIGTERM, or when it was done already."""
    if threading.current_thread() is not threading.main_thread():
        return False
    prev = signal.getsignal(signal.SIGTERM)
    if not callable(prev) or getattr(prev, "on_a_thread", False):
        return False

    def on_a_thread(signum, _frame):
        threading.Thread(target=prev, args=(signum, None), name="sigterm-handler", daemon=True).start()

    on_a_thread.on_a_thread = True
    signal.signal(signal.SIGTERM, on_a_thread)
    return True
