"""The structure layer's finding kinds: keys, shapes, dtypes, parallelism and saved configuration.

Data only: each entry names its ``stage`` (the Snakemake rule whose job runs the detector) and its
``detector`` (``module:function``, where the finding is decided and built).
"""

from __future__ import annotations

from typing import List

from .model import Kind as _k

ENTRIES: List[_k] = [
    _k("key_prefix_mismatch", "structure", "error", "resume",
       "{path}: every key of {component} starts with {prefix!r} (saved from a {wrapper} wrapper), so a strict "
       "load_state_dict reports every key as missing.",
       "Strip the prefix when loading; the weights themselves are intact.",
       "state_dict = {{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}",
       stage="structure", detector="ckptaudit.stages.structure:_wrapper_prefix"),
    _k("resume_key_missing", "structure", "error", "warm-start",
       "{path} is in {framework}'s checkpoint format but lacks {keys}, which {call} reads from every checkpoint it "
       "resumes; lacking {them}, the resume {consequences} ({source}). Its weights are not affected.",
       "Resume from another checkpoint that has {them}, or warm-start from these weights{repair_text}.",
       "{repair_code}",
       stage="state", detector="ckptaudit.components.restore_rules:_missing_keys_finding"),
    _k("size_mismatch", "structure", "error", "none",
       "{path}: {n} tensor(s) differ in shape from the job that will resume: {examples}{vocab_text}.",
       "Resume with the model configuration the checkpoint was saved with, or convert the checkpoint.",
       stage="structure", detector="ckptaudit.stages.structure:analyse_unit"),
    _k("missing_keys", "structure", "error", "none",
       "{path}: {n} key(s) the resuming model expects are missing: {examples}.",
       "Check that the checkpoint belongs to this model and code version.",
       stage="structure", detector="ckptaudit.stages.structure:_against_reference"),
    _k("unexpected_keys", "structure", "warning", "warm-start",
       "{path}: {n} key(s) the resuming model does not have: {examples}.",
       "Check that the checkpoint belongs to this model and code version; strict loading will fail.",
       stage="structure", detector="ckptaudit.stages.structure:_against_reference"),
    _k("dtype_mismatch", "structure", "warning", "resume",
       "{path}: {n} tensor(s) have another dtype than the reference: {examples}.",
       "load_state_dict casts on copy; check the training precision settings.",
       stage="structure", detector="ckptaudit.stages.structure:_against_reference"),
    _k("tied_weight_alias_missing", "structure", "info", "resume",
       "{path}: {alias} is not stored because it shares memory with {kept} (tied weights de-duplicated on save); "
       "a plain load_state_dict(strict=True) reports it missing.",
       "Load with safetensors.torch.load_model(model, path) or call model.tie_weights() after a non-strict load.",
       "safetensors.torch.load_model(model, {path!r})",
       stage="structure", detector="ckptaudit.stages.structure:analyse_unit"),
    _k("optimizer_param_group_size_mismatch", "structure", "error", "warm-start",
       "{path}: the optimizer state was saved for {saved} parameters ({groups}) but the model has {model} "
       "parameters: loading the optimizer fails ('loaded state dict contains a parameter group that doesn't match').",
       "Warm-start: load the weights and build a fresh optimizer, or restore the model definition the optimizer "
       "was saved with.",
       stage="structure", detector="ckptaudit.stages.structure:_optimizer_checks"),
    _k("optimizer_state_shape_mismatch", "structure", "error", "warm-start",
       "{path}: optimizer moments do not match their parameters: {examples}. This loads fine and fails at the "
       "first optimizer.step().",
       "Warm-start with a fresh optimizer, or restore the model definition the optimizer was saved with.",
       stage="structure", detector="ckptaudit.stages.structure:_optimizer_checks"),
    _k("zero_dp_world_size_mismatch", "structure", "error", "warm-start",
       "{path}: ZeRO-{stage} optimizer state is partitioned over {saved} data-parallel ranks; the resuming job "
       "has {target}. DeepSpeed cannot re-partition it on load.",
       "Convert first: DeepSpeed's universal checkpoint (`python -m deepspeed.checkpoint.ds_to_universal "
       "--input_folder {path} --output_folder {path}_universal`, then load with `load_universal`), or "
       "warm-start from consolidated weights (`zero_to_fp32.py`).",
       stage="structure", detector="ckptaudit.producers.deepspeed:parallel_findings"),
    _k("zero_stage_mismatch", "structure", "error", "warm-start",
       "{path}: saved with ZeRO stage {saved}; the resuming job uses stage {target}.",
       "Convert with DeepSpeed's universal checkpoint, or warm-start from `zero_to_fp32.py` weights.",
       stage="structure", detector="ckptaudit.producers.deepspeed:parallel_findings"),
    _k("model_parallel_mismatch", "structure", "error", "warm-start",
       "{path}: saved with {what} = {saved}; the resuming job has {target}.",
       "Reshard the checkpoint with the framework's converter before resuming.",
       stage="structure", detector="ckptaudit.producers.megatron:parallel_findings"),
    _k("model_changed_in_run", "structure", "warning", "resume",
       "{path}: the model structure changed at this unit compared with {previous}: {examples}.",
       "Check that the code change at this step was intended; resume with the matching code.",
       stage="report", detector="ckptaudit.run_findings:structure_changes"),
    _k("model_args_mismatch", "structure", "error", "none",
       "{path}: saved model arguments differ from the job that will resume: {examples}.",
       "Resume with the saved model arguments, or accept that the weights will not fit.",
       stage="configdiff", detector="ckptaudit.stages.configdiff:_model_arg_rows"),
    _k("config_value_differs", "structure", "warning", "resume",
       "{path}: {key} was {saved!r} at save time; the target says {target!r} ({klass}).",
       "Check that the change is intended before resuming.",
       stage="configdiff", detector="ckptaudit.stages.configdiff:_model_arg_rows"),
    _k("torch_version_differs", "structure", "info", "resume",
       "{path}: saved with torch {saved}; resuming with torch {target}.",
       "Usually harmless; check the release notes for serialization changes between those versions.",
       stage="configdiff", detector="ckptaudit.stages.configdiff:_version_rows"),
]
