"""The state layer's finding kinds: optimizer, scheduler, RNG, step counters and values.

Data only: each entry names its ``stage`` (the Snakemake rule whose job runs the detector) and its
``detector`` (``module:function``, where the finding is decided and built).
"""

from __future__ import annotations

from typing import List

from .model import Kind as _k

ENTRIES: List[_k] = [
    _k("weights_only_checkpoint", "state", "info", "warm-start",
       "{path} holds model weights only (no optimizer, scheduler or step): it can start a new run, not "
       "continue this one faithfully.",
       "Warm-start from it (fresh optimizer and schedule).",
       stage="state", detector="ckptaudit.stages.state:_completeness"),
    _k("missing_model_weights", "state", "error", "none",
       "{path} has no model weights that the audit can find (top-level keys: {keys}).",
       "Check the checkpoint's producer; without weights it cannot be resumed or warm-started.",
       stage="state", detector="ckptaudit.components.findings:missing_weights"),
    _k("state_file_unreadable", "state", "error", "warm-start",
       "{path} cannot be read as the JSON training state it should be ({why}): a resume that loads it fails "
       "before the first step, and the step, epoch and best checkpoint it records are unknown.",
       "Resume from an older checkpoint whose {name} is intact, or warm-start from these weights and set the step "
       "by hand from the training log.",
       stage="scan", detector="ckptaudit.layouts.hf:HFTrainer.read_trainer_state"),
    _k("resume_entry_weights_only", "state", "error", "warm-start",
       "{path} is the checkpoint {framework}'s {entry_call} resumes from, and it holds intact weights but no usable "
       "training state ({why}): a job resuming as configured would not get a faithful resume from it{intact_text}. "
       "Its weights are still usable for a warm start.",
       "{next_text}", "{repair_code}", stage="report", detector="ckptaudit.resume_entry:entry_findings"),
    _k("missing_optimizer_state", "state", "warning", "warm-start",
       "{path} has model weights but no optimizer state: resuming re-initialises the AdamW moments (expect a loss "
       "spike); fine for a warm start, not a faithful resume point.",
       "Roll back to a checkpoint with optimizer state to resume; otherwise warm-start from this one.",
       stage="state", detector="ckptaudit.stages.state:_optimizer_completeness"),
    _k("empty_optimizer_state", "state", "error", "warm-start",
       "{path}: the optimizer entry ({optimizer}, which keeps per-parameter state) is present but that state is "
       "empty while the step is {step}: it was saved from a fresh optimizer.",
       "Roll back to a checkpoint with optimizer moments to resume; otherwise warm-start from this one.",
       stage="state", detector="ckptaudit.stages.state:_optimizer_completeness"),
    _k("optimizer_state_incomplete", "state", "warning", "resume",
       "{path}: optimizer state covers {have} of {want} parameters; the others (frozen, or never given a "
       "gradient) restart with fresh moments.",
       "Check that the missing parameters are the frozen or unused ones; otherwise roll back further.",
       stage="state", detector="ckptaudit.stages.state:_optimizer_completeness"),
    _k("missing_scheduler_state", "state", "warning", "resume",
       "{path} has no LR-scheduler state, though the run had a scheduler ({evidence}): a plain resume rebuilds "
       "the schedule from step 0 and re-warms the learning rate.",
       "Rebuild the scheduler as the training code does and fast-forward it to step {step} before training"
       "{repair_text} (the continuation is not bit-exact).",
       "{repair_code}",
       stage="report", detector="ckptaudit.run_findings:missing_components"),
    _k("resume_starts_component_fresh", "state", "warning", "warm-start",
       "{path} has {component} state but no {needs}: {framework}'s resume restores the {component} only when the "
       "{needs} is there too ({source}), so {call} continues from this unit with a fresh {component} and a fresh "
       "{needs}, silently.",
       "Roll back to a checkpoint that has both to resume; otherwise warm-start from this one. The {component} "
       "cannot be put back by code of yours around {call}: the framework decides before it runs.",
       stage="report", detector="ckptaudit.components.restore_rules:broken"),
    _k("registered_count_mismatch", "state", "error", "warm-start",
       "{path} holds {have} file(s) named like {pattern} where the run holds {want} (one per {counted}): "
       "{framework}'s {call} raises RuntimeError when that count differs ({source}).",
       "Roll back to a checkpoint with {want} of them to resume; otherwise warm-start from this one's weights. If "
       "the job that resumes registers {have} object(s) (one was added or removed since), this does not apply.",
       stage="report", detector="ckptaudit.components.restore_rules:count_mismatches"),
    _k("missing_rng_state", "state", "warning", "resume",
       "{path} has no RNG state, though the run saves it ({evidence}): the continuation will not be bit-exact "
       "and the data order may repeat.",
       "Accept a non-bit-exact resume, or roll back to a checkpoint with RNG state.",
       stage="report", detector="ckptaudit.run_findings:missing_components"),
    _k("missing_step", "state", "warning", "resume",
       "{path} records no global step / iteration counter.",
       "Set the step when resuming{name_text}; check it against the training log.",
       "{repair_code}",
       stage="state", detector="ckptaudit.stages.state:_completeness"),
    _k("step_counter_reset", "state", "error", "resume",
       "{path}: {field} = {saved} but {evidence}: the counter was reset (a restart from scratch or a reset "
       "scheduler), so a resume re-warms the learning rate and restarts step counting.",
       "Restore the counters before resuming{scheduler_text}.",
       "{repair_code}",
       stage="state", detector="ckptaudit.components.findings:step_counter_reset"),
    _k("step_name_disagrees", "state", "warning", "resume",
       "{path}: the name says step {name_step} but the contents say {content_step}.",
       "Trust the contents; check the naming in the save code.",
       stage="state", detector="ckptaudit.stages.state:_counter_findings"),
    _k("step_not_increasing", "state", "error", "warm-start",
       "{path}: step {step} is not after the previous unit's step {previous} in save order: the run restarted "
       "from scratch or was overwritten.",
       "Roll back to the newest unit before the restart.",
       stage="report", detector="ckptaudit.run_findings:steps_going_back"),
    _k("unit_written_after_newer", "state", "warning", "resume",
       "{path} (step {step}) was written {minutes} min after {newer} (step {newer_step}): the run restarted from "
       "an earlier point or from scratch and saved over older names, so the furthest progress is in {newer}.",
       "Resume from the furthest unit the verdict names unless the restart was deliberate; check the training "
       "log for why the job went back.",
       stage="report", detector="ckptaudit.run_findings:written_out_of_order"),
    _k("step_gap", "state", "info", "resume",
       "{path}: {gap} steps since the previous unit ({previous}), wider than the usual save interval {interval}.",
       "Check whether checkpoints in between were lost or deleted.",
       stage="report", detector="ckptaudit.run_findings:step_gaps"),
    _k("optimizer_step_mismatch", "state", "warning", "resume",
       "{path}: optimizer per-parameter step is {opt_step} but the global step is {step}.",
       "Check gradient accumulation settings and whether a counter was reset.",
       stage="state", detector="ckptaudit.stages.state:_counter_findings"),
    _k("nan_in_weights", "state", "error", "none",
       "{path}: {n_tensors} weight tensor(s) contain NaN/Inf ({examples}): the run had diverged when this was saved.",
       "Do not resume from it; roll back to the newest checkpoint before the first poisoned one.",
       stage="state", detector="ckptaudit.stages.state:_value_findings"),
    _k("nonfinite_optimizer_state", "state", "error", "warm-start",
       "{path}: optimizer moments contain NaN/Inf ({examples}){weights_text}.",
       "Warm-start from the weights with a fresh optimizer, or roll back further.",
       stage="state", detector="ckptaudit.stages.state:_value_findings"),
    _k("weight_norm_jump", "state", "warning", "resume",
       "{path}: the global weight norm changed by {ratio:.1f}x since {previous} ({examples}).",
       "Check the loss curve around this step; a divergence may have started here.",
       stage="report", detector="ckptaudit.run_findings:norm_jumps"),
]
