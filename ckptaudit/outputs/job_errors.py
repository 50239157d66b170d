"""Why a workflow run failed, in one line per failed job: the last meaningful line of each job's own log.

Stage jobs write their stdout and stderr to ``<out>/logs/<rule>/<part>.log``; when one fails,
Snakemake itself says only ``CalledProcessError … check log file(s)``.  The Snakefile's
``onerror:`` handler calls :func:`on_error`, which reads the failed jobs' logs and says, per
job, ``hash p0003: FileNotFoundError: … (log: …)``: printed on stderr for ``snakemake … audit``,
and written to ``<out>/work/failed_jobs.txt``, which ``ckptaudit audit`` reads and prints as
its one error (it sets :data:`CLI_ENV` so the handler does not print twice).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Iterable, List, Tuple

from ..terminal_text import shown

#: set by ``ckptaudit audit``/``drill`` for the workflows they run: the CLI prints summaries and errors itself
CLI_ENV = "CKPTAUDIT_CLI"
FAILED_JOBS = "work/failed_jobs.txt"
#: the exit code of a run stopped by SIGINT (Ctrl-C): 128 + 2, as a shell reports it
EXIT_INTERRUPTED = 130
INTERRUPTED = ("ckptaudit: interrupted (Ctrl-C): the workflow was stopped and wrote no verdict; run the same "
               "command again (unfinished jobs are redone)")


def notice_sigint() -> None:
    """Note a SIGINT (Ctrl-C) during ``snakemake … audit``, so that :func:`on_error` tells it from a failed job.

    Called from the Snakefile's ``onstart``.  Ctrl-C reaches the whole process group: the stage jobs die of it
    and Snakemake cancels the rest, then calls ``onerror`` as for any failed job.  The handler set here notes
    the signal and hands it on to the one it replaces (Python's, which raises the ``KeyboardInterrupt``
    Snakemake's scheduler expects); the signals it saw are kept on the handler itself (``sigint_seen``), which
    :func:`sigint_seen` reads back, so no module holds state.  Not under ``ckptaudit audit``/``drill``
    (:data:`CLI_ENV`), whose own handler does this (:func:`ckptaudit.cli.snakemake._interrupts`), nor off the
    main thread or where SIGINT is ignored (``nohup``)."""
    if os.environ.get(CLI_ENV) or threading.current_thread() is not threading.main_thread():
        return
    prev = signal.getsignal(signal.SIGINT)
    if prev in (signal.SIG_IGN, None):
        return

    def noted(signum, frame):
        noted.sigint_seen.append(signum)
        if callable(prev):
            prev(signum, frame)
        else:
            raise KeyboardInterrupt

    noted.sigint_seen = []
    signal.signal(signal.SIGINT, noted)


def sigint_seen() -> bool:
    """True when the SIGINT handler :func:`notice_sigint` set is in place and has seen a SIGINT."""
    return bool(getattr(signal.getsignal(signal.SIGINT), "sigint_seen", None))


def last_error_line(text: str) -> str:
    """The line that says why: after a traceback, its exception line; otherwise the last non-empty line."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    tb = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")), default=-1)
    if tb >= 0:
        after = [ln for ln in lines[tb + 1:] if not ln.startswith((" ", "\t"))]
        if after:
            return after[-1].strip()
    return lines[-1].strip()


def _read_tail(path: str, limit: int = 64 << 10) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _jobs(failed) -> Iterable[Tuple[str, str, List[str], bool]]:
    """(rule, wildcards text, log paths, member of a group job) of each failed job."""
    for job in failed:
        members = getattr(job, "jobs", None)
        for j in members or [job]:
            rule = getattr(getattr(j, "rule", None), "name", "job")
            wc = " ".join(str(v) for v in dict(getattr(j, "wildcards", None) or {}).values())
            yield rule, wc, [str(p) for p in (getattr(j, "log", None) or [])], bool(members)


def _why(logs: List[str]) -> Tuple[str, str]:
    """(last error line, its log) of the first log that says something."""
    for log in logs:
        why = last_error_line(_read_tail(log))
        for prefix in ("ckptaudit: error: ", "ckptaudit: "):
            why = why[len(prefix):] if why.startswith(prefix) else why
        if why:
            return why, log
    return "", ""


def job_lines(failed) -> List[str]:
    """One line per failed job: ``rule wildcards: last error line of its log (log: path)``.  Of a failed
    group job, only the members whose log ends in an error (all of them when none does)."""
    out, group = [], []
    for rule, wc, logs, in_group in _jobs(failed):
        name = f"{rule} {wc}".strip()
        why, log = _why(logs)
        line = shown(f"{name}: {why} (log: {log})" if why else
                     f"{name}: failed" + (f"; its log {logs[0]} is empty" if logs else " (no log)"))
        (group if in_group else out).append((line, "error" in why.lower() or "exception" in why.lower()))
    erred = [ln for ln, bad in group if bad]
    return [ln for ln, _ in out] + (erred or [ln for ln, _ in group])


def on_error(workflow, out_dir: str) -> List[str]:
    """The ``onerror:`` handler's work: the failed jobs' lines, written to ``out_dir/work/failed_jobs.txt``
    and printed on stderr unless ``ckptaudit`` runs the workflow (:data:`CLI_ENV`).

    After a SIGINT noted by :func:`notice_sigint` the jobs did not fail, they were stopped: it prints
    :data:`INTERRUPTED` instead and raises ``SystemExit(130)``, which ends ``snakemake`` with that code (the
    output folder's lock goes with the process)."""
    if sigint_seen() and not os.environ.get(CLI_ENV):
        print(INTERRUPTED, file=sys.stderr, flush=True)
        raise SystemExit(EXIT_INTERRUPTED)
    failed = getattr(getattr(workflow, "scheduler", None), "failed", None) or []
    lines = job_lines(failed) or [f"a job failed; see the logs under {Path(out_dir) / 'logs'}"]
    try:
        p = Path(out_dir) / FAILED_JOBS
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n".join(lines) + "\n")
    except OSError:
        pass
    if not os.environ.get(CLI_ENV):
        print("ckptaudit: the audit failed:", *(f"  {ln}" for ln in lines), sep="\n", file=sys.stderr, flush=True)
    return lines


def exit_as_ckptaudit() -> None:
    """The last step of the Snakefile's ``onerror:`` handler: exit 3, as ``ckptaudit audit`` and ``ckptaudit
    drill`` do when the workflow fails (Snakemake's own code, 1, means "roll back" to a cron job reading
    ``ckptaudit``'s codes).  Nothing when ``ckptaudit`` runs the workflow: it turns the failure into its own
    one-line error and exit 3."""
    if not os.environ.get(CLI_ENV):
        sys.stderr.flush()
        sys.exit(3)


def read_failed(out_dir: str | Path) -> List[str]:
    """The lines :func:`on_error` wrote for the last failed run in ``out_dir`` ([] when there are none)."""
    try:
        return [ln for ln in (Path(out_dir) / FAILED_JOBS).read_text().splitlines() if ln.strip()]
    except OSError:
        return []
