"""Restore drill: "it loads" is not "it resumes".

The audit says which unit to roll back to; the drill checks that training can
really *continue* from it, before an incident needs it.  It restores the unit
in a **fresh child process** (``python -m ckptaudit.drill child``: nothing
imported or cached by the parent leaks in) through the team's own restore code,
a *restore hook* named in the config (``drill.hook: "package.module:function"``),
continues training ``drill.steps`` updates, and compares what it sees with what
the run recorded.  CPU first; then each CUDA device of ``drill.devices`` when
``torch.cuda.is_available()`` in the CPU child (skipped with a note otherwise).

The hook contract (:class:`RestoreHook`, :class:`Restored`)::

    def restore_hook(path: str, device: str) -> Restored: ...

``path`` is the unit (a file or folder); ``device`` a torch device string
("cpu", "cuda", "cuda:1").  The hook does what the resuming job does: build the
model, optimizer, scheduler and scaler, load the unit into them **with
torch.load(weights_only=True)**, restore the RNG, and hand back the objects plus
the raw saved state so the drill can compare the two.  ``ckptaudit.demo:restore_hook``
is the reference implementation for the bundled demo trainer.

Checks (one row each in ``drill.parquet``; :data:`CHECKS` says what each compares):
``eligibility``, ``child_process``, ``restore_hook``, ``model_load_strict``,
``optimizer_load_strict``, ``optimizer_moments``, ``global_step``, ``rng_stream``,
``data_sampler``, ``loss_scale``, ``loss_at_restore``, ``continuation_steps``,
``lr_continuity``, ``next_unit_match``, ``device_available``.  A row's status is
``pass``, ``warn`` (the resume works but is not faithful in one respect, e.g. no
RNG state: not bit-exact), ``fail`` or ``skip``.

Exit codes (:func:`exit_code`, for cron and CI): **0** the drill passed (warnings
allowed); **1** the drill found a problem (a check failed, or the hook raised
while restoring the unit); **2** no restorable unit (the verdict has no rollback
point, or the chosen unit is refused); **3** the drill itself failed (verdict
unreadable, hook not importable or not implementing :class:`Restored`, child
timed out, hit its memory limit or died, no device of ``drill.devices`` available).  A failed check wins over an
incomplete drill: 1 before 3.

Security: a unit whose verdict findings include layer ``security`` with
severity ``error``, or whose ``usable_for`` is ``none``, is refused **before**
any child starts.  Inside the child ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` is set
and the loader is wrapped so that an explicit weights-only-off load raises
(:data:`WEIGHTS_ONLY_REFUSAL`) instead of unpickling.

Limits: the child runs with ``RLIMIT_AS`` = ``drill.memory_limit_mib`` (CPU
devices; CUDA maps tens of GiB of address space, so CUDA children get a
resident-set watchdog instead) and is killed (its whole process group) after
``drill.timeout_seconds``.

Importing this package is cheap (no torch, no pyarrow, no click): ``rules/drill.smk``
imports it.  The package: :mod:`.contract` (hook Protocol, checks, exit codes),
:mod:`.settings` (config), :mod:`.select` (which unit), :mod:`.parent` (children,
verdict), :mod:`.outputs` (files, summary), :mod:`.child` with :mod:`.checks_restore`
and :mod:`.checks_continue`, :mod:`.handover` (the hook's optimizer and scheduler as handed over, compared with
the unit's), :mod:`.lr_horizon` (the schedule past the continuation), and ``__main__``
(``python -m ckptaudit.drill``).
"""

from __future__ import annotations

from .checks_restore import as_float, quoted, same_values  # noqa: F401
from .child import Child, guard_torch_load, is_alloc_error, LimitHit, child_main  # noqa: F401
from .contract import (CHECKS, EXIT_FAILED, EXIT_NO_UNIT, EXIT_PASSED, EXIT_PROBLEM,  # noqa: F401
                       INFRA_CHECKS, REQUIRED_MEMBERS, SCHEMA, STATUS_WORDS, WEIGHTS_ONLY_REFUSAL, Restored,
                       RestoreHook, SimpleRestored, check_row, import_hook)
from .outputs import copy_dated, render_html, summary_line, write_outputs  # noqa: F401
from .parent import (child_env, child_row, drill_devices, log_tail, read_verdict, rss_bytes,  # noqa: F401
                     unit_files, run_child, run_drill)
from .select import drill_order, exit_code, refusal, security_errors, select_unit  # noqa: F401
from .settings import (DEFAULTS, drill_config, report_date, rule_config_json, rule_mem_mb,  # noqa: F401
                       rule_runtime_minutes)


def __getattr__(name: str):
    """``COLUMNS``: the drill table's (column, type) pairs, read from :data:`ckptaudit.tables.SCHEMAS` on
    first use, so that importing this package still imports no pyarrow."""
    if name == "COLUMNS":
        from ..tables import SCHEMAS

        return tuple((f.name, str(f.type)) for f in SCHEMAS["drill"])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
