"""Findings on a unit's components that several detectors decide alike: no model weights, a step counter that
went back.  Below the layouts and the stages, so the DeepSpeed adapter, the state stage, the run's findings and
the verdict's judgement of a cut walk build them one way (each builds its finding here, once)."""

from __future__ import annotations

from ..findings import Finding, make


def missing_weights(path: str, keys: str) -> Finding:
    """``missing_model_weights``: unit ``path`` holds no model weights (``keys``: what it holds instead).
    Decided by the state stage (:func:`ckptaudit.stages.state.analyse_unit`: nothing to resume from, or no
    weights among the components), the DeepSpeed adapter (no ``mp_rank_XX_model_states.pt``, at scan time) and, for a unit the
    static walk gave up on, :func:`ckptaudit.cut_walk.findings` (torch.load found no tensor in it)."""
    return make("missing_model_weights", path=path, keys=keys)


def step_counter_reset(path: str, **values) -> Finding:
    """``step_counter_reset``: a saved step counter (``field``) went back to ``saved`` where the unit's other
    evidence says ``true_step``; ``values`` are the template's fields (``field``, ``saved``, ``evidence``,
    ``true_step``, ``scheduler_text``, ``repair_code``), kept in the detail in the order given.  Decided by
    the state stage (one unit) and :func:`ckptaudit.run_findings.scheduler_resets` (the
    scheduler's ``last_epoch`` read across the run)."""
    return make("step_counter_reset", path=path, **values)
