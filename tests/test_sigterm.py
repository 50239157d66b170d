"""Snakemake's SIGTERM handler runs on a thread (ckptaudit/workflow/sigterm.py): a SIGTERM that lands while the
main thread holds the lock the handler takes no longer hangs the process."""

import subprocess
import sys

CHILD = r"""
import os, signal, threading, time
from ckptaudit.workflow.sigterm import hand_sigterm_to_a_thread

lock = threading.Lock()  # as Snakemake's scheduler's
ran = []

def exit_gracefully(*_):  # what Snakemake's handler does first
    with lock:
        ran.append(threading.current_thread().name)

signal.signal(signal.SIGTERM, exit_gracefully)
print(hand_sigterm_to_a_thread(), hand_sigterm_to_a_thread(), flush=True)
with lock:  # the main thread collects finished jobs
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.3)  # the handler runs here, in this thread, between two bytecodes
end = time.monotonic() + 10
while not ran and time.monotonic() < end:
    time.sleep(0.01)
print(ran, flush=True)
"""


def test_sigterm_while_the_main_thread_holds_the_lock_does_not_hang():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["True False", "['sigterm-handler']"]


def test_without_it_the_same_signal_hangs():
    """The hazard is real: the same child with the handler left in the main thread does not end."""
    child = CHILD.replace("print(hand_sigterm_to_a_thread(), hand_sigterm_to_a_thread(), flush=True)", "")
    try:
        subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return
    raise AssertionError("the child ended: the deadlock this module avoids did not happen")
