"""The finding catalogue: every kind of problem the audit can report, as data.

A *finding* is one row of diagnosis attached to one checkpoint unit (or to a
pointer such as ``latest``).  Each kind is declared once in :data:`CATALOGUE`
with its layer, its severity, a plain-words message template, the next step a
person should take, an optional exact ``repair`` template, and ``caps`` — the
best use a unit carrying this finding can still be put to:

* ``"resume"``     – the finding does not stop a faithful resume (possibly after
  the ``repair`` is applied);
* ``"warm-start"`` – the weights are usable, the training state is not;
* ``"none"``       – the unit must not be used at all.

The verdict (:mod:`ckptaudit.verdict`) takes the minimum cap over a unit's
findings as its ``usable_for``; nothing else in the code decides usability.

This module imports nothing heavy (no torch, no pandas): the Snakefile and every
rule may import it.
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional

LAYERS = ("file", "structure", "state", "security")
SEVERITIES = ("error", "warning", "info")
USES = ("resume", "warm-start", "none")  # best first
_USE_RANK = {u: i for i, u in enumerate(USES)}


@dataclass(frozen=True)
class Kind:
    """One catalogue entry.  Templates use ``str.format`` fields."""

    kind: str
    layer: str
    severity: str
    caps: str
    message: str
    next_step: str
    repair: str = ""


@dataclass
class Finding:
    """One diagnosis on one unit.

    ``message``, ``next_step`` and ``repair`` are already rendered; ``detail``
    keeps the structured values the templates were filled with (bytes, keys,
    steps) so tables and tests can read them without parsing prose.
    """

    kind: str
    layer: str
    severity: str
    caps: str
    message: str
    next_step: str
    repair: str = ""
    path: str = ""  # file inside the unit the finding is about ("" = whole unit)
    detail: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Finding":
        return cls(**{k: d.get(k, "" if k != "detail" else {}) for k in cls.__dataclass_fields__})


def _k(kind, layer, severity, caps, message, next_step, repair=""):
    return Kind(kind, layer, severity, caps, message, next_step, repair)


_ENTRIES: List[Kind] = [
    # ------------------------------------------------------------------ file
    _k("empty_file", "file", "error", "none",
       "{path} is 0 bytes: the save died right after the file was created, or the quota/disk was full.",
       "Do not load it; roll back to an older checkpoint and check free space/quota before the next save."),
    _k("all_zero_file", "file", "error", "none",
       "{path} is {size_bytes} bytes of NUL only: space was allocated but the data never reached the disk "
       "(power loss, NFS client crash, or a preallocated file that was never written).",
       "Treat it as lost; roll back to an older checkpoint and check the storage's write-back/flush behaviour."),
    _k("zero_filled_tail", "file", "error", "none",
       "{path}: the last {zero_bytes} bytes (from offset {offset}) are NUL where data should be: the file's "
       "size was committed but its data blocks were not flushed.",
       "Treat it as lost; roll back to an older checkpoint. fsync the file and its folder before publishing."),
    _k("zero_filled_head", "file", "error", "none",
       "{path}: the first {zero_bytes} bytes are NUL where the file header should be.",
       "Treat it as lost; roll back to an older checkpoint."),
    _k("zero_filled_span", "file", "error", "none",
       "{path}: {zero_bytes} NUL bytes at offset {offset} inside {member} where tensor data should be "
       "(a lost or unflushed block).",
       "Treat it as lost; roll back to an older checkpoint."),
    _k("git_lfs_pointer", "file", "error", "none",
       "{path} is a {size_bytes}-byte Git LFS pointer, not the checkpoint: the real object is {lfs_size} bytes "
       "with oid sha256:{lfs_oid}.",
       "Fetch the real object: `git lfs install && git lfs pull --include \"{path}\"` in the repository it came from."),
    _k("html_error_page", "file", "error", "none",
       "{path} is an HTML page ({size_bytes} bytes), not a checkpoint: a downloader saved an error, quota or "
       "login page under the checkpoint's name.",
       "Download the file again with an authenticated tool (e.g. `huggingface-cli download`, `gdown --fuzzy`) and "
       "compare its size and SHA-256 with the source."),
    _k("text_error_page", "file", "error", "none",
       "{path} is text ({size_bytes} bytes, starts with {head!r}), not a checkpoint: an error response or log "
       "was saved under the checkpoint's name.",
       "Download or copy the file again and compare its size and SHA-256 with the source."),
    _k("not_a_torch_save_file", "file", "error", "none",
       "{path} is a plain pickle ({size_bytes} bytes) written with pickle.dump, not torch.save: torch.load "
       "cannot read it and unpickling it would run whatever it names.",
       "Find the real checkpoint; if this file is yours and trusted, convert it with torch.save in a sandbox."),
    _k("numpy_archive_not_checkpoint", "file", "error", "none",
       "{path} is a NumPy .npy/.npz archive, not a torch checkpoint.",
       "Point the resume at the real checkpoint file; load this one with numpy.load(allow_pickle=False)."),
    _k("unknown_format", "file", "error", "none",
       "{path} ({size_bytes} bytes) is no checkpoint format the audit knows: it starts with bytes {head_hex}.",
       "Check what wrote this file; if it is a checkpoint in a format ckptaudit does not know, report it."),
    _k("truncated_zip_no_central_directory", "file", "error", "none",
       "{path} is a torch.save zip cut short: it is {size_bytes} bytes and has no end-of-central-directory "
       "record{missing_text}. {intact_text}",
       "Treat it as lost (the save was killed or the disk filled); roll back to the rollback point the verdict names."),
    _k("zip_member_header_corrupted", "file", "error", "none",
       "{path}: the zip local header of {member} at offset {offset} is damaged ({why}); the central directory "
       "is intact, so the file has the right size but a block in the middle was lost or overwritten.",
       "Treat it as lost; roll back to an older checkpoint and check the storage for bad blocks."),
    _k("zip_missing_record", "file", "error", "none",
       "{path}: the zip archive has no {member} record ({why}).",
       "The archive was re-packed or written by another tool; find the original checkpoint."),
    _k("zip_crc_mismatch", "file", "error", "none",
       "{path}: member {member} fails its CRC32 check (stored {expected}, computed {actual}): its bytes "
       "changed after the save{tensor_text}.",
       "Treat it as corrupt even though torch.load may accept it; roll back to an older checkpoint."),
    _k("zip_storage_missing", "file", "error", "none",
       "{path}: data.pkl references storage {storage} but the archive has no {member} record.",
       "Treat it as lost; roll back to an older checkpoint."),
    _k("zip_storage_size_mismatch", "file", "error", "none",
       "{path}: storage {storage} needs {expected} bytes ({dtype} x {numel}) but its record holds {actual}.",
       "Treat it as lost; roll back to an older checkpoint."),
    _k("truncated_legacy_pickle", "file", "error", "none",
       "{path} is a pre-1.6 (legacy, non-zip) torch.save file cut short at {size_bytes} bytes: {why}.",
       "Treat it as lost; roll back to an older checkpoint. Save with the default zip format from now on."),
    _k("legacy_magic_mismatch", "file", "error", "none",
       "{path} starts like a legacy torch.save file but its magic number is {found} (expected {expected}).",
       "Treat it as corrupt; roll back to an older checkpoint."),
    _k("checksum_mismatch", "file", "error", "none",
       "{path}: SHA-256 is {actual} but its {source} records {expected}: the bytes changed after they were "
       "written (silent corruption, an interrupted copy, or a later partial overwrite).",
       "Do not use it; roll back to the newest checkpoint whose checksums verify."),
    _k("size_mismatch_vs_manifest", "file", "error", "none",
       "{path} is {actual} bytes but the {source} records {expected} bytes.",
       "Do not use it; roll back to the newest checkpoint whose checksums verify."),
    _k("sidecar_missing", "file", "info", "resume",
       "{path} has no SHA-256 sidecar or manifest entry: silent corruption inside tensor data cannot be ruled out "
       "for members without their own CRC.",
       "Publish checkpoints with sidecars (ckptaudit.publish) or seal this run: `ckptaudit seal RUN_DIR`."),
    _k("sidecar_malformed", "file", "warning", "resume",
       "{sidecar} is not in sha256sum format ({why}).",
       "Regenerate it with `sha256sum FILE > FILE.sha256` from a copy you trust."),
    _k("sidecar_unreadable", "file", "warning", "resume",
       "{sidecar} exists but cannot be read ({why}), so {path} is not verified against it.",
       "Replace the sidecar with a regular file: `sha256sum FILE > FILE.sha256` from a copy you trust."),
    _k("sidecar_names_other_file", "file", "warning", "resume",
       "{sidecar} names {named!r}, not {path!r}.",
       "Regenerate the sidecar for the right file."),
    _k("header_too_small", "file", "error", "none",
       "{path} is {size_bytes} bytes, less than the 8-byte header-length prefix of a safetensors file.",
       "Treat it as lost; download or copy it again."),
    _k("header_too_large", "file", "error", "none",
       "{path}: the safetensors header length prefix says {header_len} bytes but the file has only {size_bytes}.",
       "Treat it as lost or as not a safetensors file; download or copy it again."),
    _k("invalid_header_json", "file", "error", "none",
       "{path}: the safetensors JSON header ({header_len} bytes) does not parse: {why}.",
       "Treat it as lost; download or copy it again."),
    _k("safetensors_offsets_invalid", "file", "error", "none",
       "{path}: tensor {tensor} has data_offsets {offsets} that {why}.",
       "Treat it as corrupt; download or copy it again."),
    _k("truncated_in_data", "file", "error", "none",
       "{path}: the safetensors header is intact but the tensor data is cut short: {missing_bytes} of "
       "{expected_bytes} data bytes are missing. {intact_text}",
       "Treat it as lost; download or copy it again and compare sizes."),
    _k("safetensors_trailing_bytes", "file", "error", "resume",
       "{path}: {extra_bytes} bytes after the last tensor are not covered by the header; safetensors (0.4+) refuses "
       "such a file ('file not fully covered'), though every tensor is intact.",
       "Cut a copy back to the {expected_bytes} bytes the header covers and load the copy.",
       "cp {path} {path}.fixed && truncate -s {expected_bytes} {path}.fixed"),
    _k("index_invalid", "file", "error", "none",
       "{path}: the sharded-checkpoint index does not parse or has no weight_map ({why}).",
       "Download or copy the index again from the source."),
    _k("index_references_missing_shard", "file", "error", "none",
       "{path} maps {n_tensors} tensors to {shard}, which is not in the folder (interrupted download or partial "
       "copy).",
       "Fetch the missing shard(s) {shards} from the source; without them the weights are incomplete."),
    _k("index_tensor_not_in_shard", "file", "error", "none",
       "{path} says {tensor} is in {shard}, but that shard has no such tensor.",
       "The shards and the index come from different saves; fetch them again together."),
    _k("dcp_metadata_missing", "file", "error", "none",
       "{path} holds torch.distributed.checkpoint data files ({n_files}) but no .metadata: the save never "
       "committed (crash, or an async save that did not finish){tmp_text}.",
       "Treat it as lost; roll back to the rollback point the verdict names. DCP writes .metadata last, so its absence means "
       "the save was incomplete."),
    _k("dcp_shard_missing", "file", "error", "none",
       "{path}: .metadata names data file {file} ({n_items} storage items, rank {rank}) but it is not there.",
       "The rank that wrote {file} did not finish or the file was removed; roll back to the rollback point the verdict names."),
    _k("dcp_shard_too_short", "file", "error", "none",
       "{path}: {file} is {actual} bytes but .metadata needs at least {expected} (item {item}).",
       "The file was cut short; roll back to the rollback point the verdict names."),
    _k("dcp_metadata_unreadable", "file", "error", "none",
       "{path}: .metadata could not be walked ({why}).",
       "Treat it as corrupt; roll back to the rollback point the verdict names."),
    _k("ds_rank_files_missing", "file", "error", "none",
       "{unit}: DeepSpeed ZeRO files for data-parallel ranks {ranks} are missing (found {found} of {expected}; "
       "the first missing is {path}).",
       "A rank did not finish its save; roll back to the previous complete tag."),
    _k("latest_pointer_dangling", "file", "error", "none",
       "{pointer} names {target!r}, which does not exist{complete_text}.",
       "Resume from the newest complete checkpoint instead ({suggestion}); rewrite {pointer} atomically to name it.",
       "echo -n {suggestion} > {pointer}.tmp && mv {pointer}.tmp {pointer}"),
    _k("latest_pointer_incomplete", "file", "error", "none",
       "{pointer} names {target!r}, which exists but is not usable ({why}).",
       "Resume from the newest usable checkpoint instead ({suggestion}); rewrite {pointer} atomically to name it.",
       "echo -n {suggestion} > {pointer}.tmp && mv {pointer}.tmp {pointer}"),
    _k("latest_pointer_not_newest", "file", "info", "resume",
       "{pointer} names {target!r} but a newer usable checkpoint exists ({suggestion}).",
       "Check whether the newer checkpoint should be resumed from."),
    _k("dangling_symlink", "file", "error", "none",
       "{pointer} is a symbolic link to {target!r}, which does not exist.",
       "Point it at the newest usable checkpoint ({suggestion}).",
       "ln -s {suggestion} {pointer}.new && mv -T {pointer}.new {pointer}"),
    _k("megatron_tracker_invalid", "file", "error", "none",
       "{pointer} does not hold an iteration number or 'release' (it holds {content!r}).",
       "Rewrite it with the newest complete iteration ({suggestion})."),
    _k("mixed_step_shards", "file", "error", "none",
       "{path}: model-parallel shards record different iterations ({iterations}): some ranks' files are stale "
       "copies from an earlier save.",
       "Do not resume from it; roll back to the newest iteration whose shards all agree."),
    _k("megatron_rank_missing", "file", "error", "none",
       "{path}: model-parallel rank folders {missing} are missing (found {found}).",
       "A rank did not finish its save; roll back to the previous complete iteration."),
    _k("unit_in_progress", "file", "error", "none",
       "{path} is an in-progress save ({why}): it was never published.",
       "Never resume from it; it can be deleted once no training job is writing to it."),
    _k("unit_changed_during_audit", "file", "error", "none",
       "{path} changed while it was audited: {what} between the inventory and the report (a writer or a "
       "retention job is working on the run), so what was checked is no longer what is there.",
       "Not chosen as a rollback point; audit again once no job is writing, or keep the drill away from units "
       "newer than the last completed save."),
    _k("not_a_regular_file", "file", "error", "none",
       "{path} is not read: {why}.",
       "Replace it with the real checkpoint file, or remove it from the run folder; the audit never opens it."),
    _k("file_unreadable", "file", "error", "none",
       "{path} cannot be opened for reading by this user ({why}): its bytes are unchecked, and a resume "
       "running as the same user fails on it as well.",
       "Check the owner and mode (ls -l {path}); give the user that resumes read permission (chmod u+r, or "
       "chown), then audit again."),
    _k("pointer_refused", "file", "error", "none",
       "{pointer} is a symbolic link the audit does not follow ({target!r}): {why}.",
       "Point it at a checkpoint inside the run folder (the newest usable is {suggestion}), or copy the "
       "checkpoint into the run."),
    _k("pickle_too_complex", "file", "warning", "resume",
       "{path}: the pickle is larger than the audit's work budget ({why}): the description was cut, so "
       "components may be missed; {imports}.",
       "Inspect the file's structure with a trusted tool before resuming and load it only with "
       "torch.load(weights_only=True); a real checkpoint's tree is far smaller."),
    _k("audit_error", "file", "error", "none",
       "{path}: the {stage} stage could not examine this unit ({error_type}: {error}); the other units were "
       "audited.",
       "Treat the unit as unchecked; the error and the unit are in the stage's log. Report it with the file if "
       "the bytes look sound."),
    _k("unit_file_missing", "file", "error", "none",
       "{path}: {file} is missing ({why}).",
       "Do not resume from it; roll back to the rollback point the verdict names, or restore the file from a copy."),
    _k("pickle_unreadable", "file", "error", "none",
       "{path}: the pickle in {member} cannot be walked ({why}).",
       "Treat it as corrupt; roll back to an older checkpoint."),
    _k("load_failed", "file", "error", "none",
       "{path}: torch.load(weights_only=True) failed in an isolated process: {why}.",
       "Treat it as unusable; roll back to an older checkpoint. The raw error is in the load table."),
    _k("load_not_checked", "file", "warning", "resume",
       "{path}: not load-tested: its pickle names classes of {packages}, which is not installed where the audit "
       "runs (import failed), so torch.load cannot rebuild them here. The bytes were checked; the load was not.",
       "Install it where the audit runs (`pip install torch==<your torch> {install}`, matching the training "
       "environment's version) and re-run the audit to load-test this file."),
    _k("load_timeout", "file", "error", "none",
       "{path}: the isolated load test did not finish in {timeout_seconds} s.",
       "Raise load.timeout_seconds if the file is very large and storage slow; otherwise treat it as unusable."),
    _k("load_memory_limit", "file", "error", "none",
       "{path}: the isolated load test exceeded its {memory_limit_bytes}-byte address-space limit.",
       "Raise load.memory_limit_mib if the checkpoint is legitimately that large."),
    # ------------------------------------------------------------- structure
    _k("key_prefix_mismatch", "structure", "error", "resume",
       "{path}: every key of {component} starts with {prefix!r} (saved from a {wrapper} wrapper), so a strict "
       "load_state_dict reports every key as missing.",
       "Strip the prefix when loading; the weights themselves are intact.",
       "state_dict = {{k.removeprefix({prefix!r}): v for k, v in state_dict.items()}}"),
    _k("size_mismatch", "structure", "error", "none",
       "{path}: {n} tensor(s) differ in shape from the job that will resume: {examples}{vocab_text}.",
       "Resume with the model configuration the checkpoint was saved with, or convert the checkpoint."),
    _k("missing_keys", "structure", "error", "none",
       "{path}: {n} key(s) the resuming model expects are missing: {examples}.",
       "Check that the checkpoint belongs to this model and code version."),
    _k("unexpected_keys", "structure", "warning", "warm-start",
       "{path}: {n} key(s) the resuming model does not have: {examples}.",
       "Check that the checkpoint belongs to this model and code version; strict loading will fail."),
    _k("dtype_mismatch", "structure", "warning", "resume",
       "{path}: {n} tensor(s) have another dtype than the reference: {examples}.",
       "load_state_dict casts on copy; check the training precision settings."),
    _k("tied_weight_alias_missing", "structure", "info", "resume",
       "{path}: {alias} is not stored because it shares memory with {kept} (tied weights de-duplicated on save); "
       "a plain load_state_dict(strict=True) reports it missing.",
       "Load with safetensors.torch.load_model(model, path) or call model.tie_weights() after a non-strict load.",
       "safetensors.torch.load_model(model, {path!r})"),
    _k("optimizer_param_group_size_mismatch", "structure", "error", "warm-start",
       "{path}: the optimizer state was saved for {saved} parameters ({groups}) but the model has {model} "
       "parameters: loading the optimizer fails ('loaded state dict contains a parameter group that doesn't match').",
       "Warm-start: load the weights and build a fresh optimizer, or restore the model definition the optimizer "
       "was saved with."),
    _k("optimizer_state_shape_mismatch", "structure", "error", "warm-start",
       "{path}: optimizer moments do not match their parameters: {examples}. This loads fine and fails at the "
       "first optimizer.step().",
       "Warm-start with a fresh optimizer, or restore the model definition the optimizer was saved with."),
    _k("zero_dp_world_size_mismatch", "structure", "error", "warm-start",
       "{path}: ZeRO-{stage} optimizer state is partitioned over {saved} data-parallel ranks; the resuming job "
       "has {target}. DeepSpeed cannot re-partition it on load.",
       "Convert first: DeepSpeed's universal checkpoint (`python -m deepspeed.checkpoint.ds_to_universal "
       "--input_folder {path} --output_folder {path}_universal`, then load with `load_universal`), or "
       "warm-start from consolidated weights (`zero_to_fp32.py`)."),
    _k("zero_stage_mismatch", "structure", "error", "warm-start",
       "{path}: saved with ZeRO stage {saved}; the resuming job uses stage {target}.",
       "Convert with DeepSpeed's universal checkpoint, or warm-start from `zero_to_fp32.py` weights."),
    _k("model_parallel_mismatch", "structure", "error", "warm-start",
       "{path}: saved with {what} = {saved}; the resuming job has {target}.",
       "Reshard the checkpoint with the framework's converter before resuming."),
    _k("model_changed_in_run", "structure", "warning", "resume",
       "{path}: the model structure changed at this unit compared with {previous}: {examples}.",
       "Check that the code change at this step was intended; resume with the matching code."),
    _k("model_args_mismatch", "structure", "error", "none",
       "{path}: saved model arguments differ from the job that will resume: {examples}.",
       "Resume with the saved model arguments, or accept that the weights will not fit."),
    _k("config_value_differs", "structure", "warning", "resume",
       "{path}: {key} was {saved!r} at save time; the target says {target!r} ({klass}).",
       "Check that the change is intended before resuming."),
    _k("torch_version_differs", "structure", "info", "resume",
       "{path}: saved with torch {saved}; resuming with torch {target}.",
       "Usually harmless; check the release notes for serialization changes between those versions."),
    # ------------------------------------------------------------------ state
    _k("weights_only_checkpoint", "state", "info", "warm-start",
       "{path} holds model weights only (no optimizer, scheduler or step): it can start a new run, not "
       "continue this one faithfully.",
       "Warm-start from it (fresh optimizer and schedule)."),
    _k("missing_model_weights", "state", "error", "none",
       "{path} has no model weights that the audit can find (top-level keys: {keys}).",
       "Check the checkpoint's producer; without weights it cannot be resumed or warm-started."),
    _k("state_file_unreadable", "state", "error", "warm-start",
       "{path} cannot be read as the JSON training state it should be ({why}): a resume that loads it fails "
       "before the first step, and the step, epoch and best checkpoint it records are unknown.",
       "Resume from an older checkpoint whose {name} is intact, or warm-start from these weights and set the step "
       "by hand from the training log."),
    _k("missing_optimizer_state", "state", "warning", "warm-start",
       "{path} has model weights but no optimizer state: resuming re-initialises the AdamW moments (expect a loss "
       "spike); fine for a warm start, not a faithful resume point.",
       "Roll back to a checkpoint with optimizer state to resume; otherwise warm-start from this one."),
    _k("empty_optimizer_state", "state", "error", "warm-start",
       "{path}: the optimizer entry ({optimizer}, which keeps per-parameter state) is present but that state is "
       "empty while the step is {step}: it was saved from a fresh optimizer.",
       "Roll back to a checkpoint with optimizer moments to resume; otherwise warm-start from this one."),
    _k("optimizer_state_incomplete", "state", "warning", "resume",
       "{path}: optimizer state covers {have} of {want} parameters; the others (frozen, or never given a "
       "gradient) restart with fresh moments.",
       "Check that the missing parameters are the frozen or unused ones; otherwise roll back further."),
    _k("missing_scheduler_state", "state", "warning", "resume",
       "{path} has no LR-scheduler state: a plain resume rebuilds the schedule from step 0 and re-warms the "
       "learning rate.",
       "Rebuild the scheduler and fast-forward it to the saved step before training (the continuation is not "
       "bit-exact).",
       "scheduler = make_scheduler(optimizer, last_epoch={step} - 1)  # or call scheduler.step() {step} times"),
    _k("missing_rng_state", "state", "warning", "resume",
       "{path} has no RNG state: the continuation will not be bit-exact and the data order may repeat.",
       "Accept a non-bit-exact resume, or roll back to a checkpoint with RNG state."),
    _k("missing_step", "state", "warning", "resume",
       "{path} records no global step / iteration counter.",
       "Set the step when resuming{name_text}; check it against the training log.",
       "{repair_code}"),
    _k("step_counter_reset", "state", "error", "resume",
       "{path}: {field} = {saved} but {evidence}: the counter was reset (a restart from scratch or a reset "
       "scheduler), so a resume re-warms the learning rate and restarts step counting.",
       "Restore the counters before resuming{scheduler_text}.",
       "{repair_code}"),
    _k("step_name_disagrees", "state", "warning", "resume",
       "{path}: the name says step {name_step} but the contents say {content_step}.",
       "Trust the contents; check the naming in the save code."),
    _k("step_not_increasing", "state", "error", "warm-start",
       "{path}: step {step} is not after the previous unit's step {previous} in save order: the run restarted "
       "from scratch or was overwritten.",
       "Roll back to the newest unit before the restart."),
    _k("unit_written_after_newer", "state", "warning", "resume",
       "{path} (step {step}) was written {minutes} min after {newer} (step {newer_step}): the run restarted from "
       "an earlier point or from scratch and saved over older names, so the furthest progress is in {newer}.",
       "Resume from the furthest unit the verdict names unless the restart was deliberate; check the training "
       "log for why the job went back."),
    _k("step_gap", "state", "info", "resume",
       "{path}: {gap} steps since the previous unit ({previous}), wider than the usual save interval {interval}.",
       "Check whether checkpoints in between were lost or deleted."),
    _k("optimizer_step_mismatch", "state", "warning", "resume",
       "{path}: optimizer per-parameter step is {opt_step} but the global step is {step}.",
       "Check gradient accumulation settings and whether a counter was reset."),
    _k("nan_in_weights", "state", "error", "none",
       "{path}: {n_tensors} weight tensor(s) contain NaN/Inf ({examples}): the run had diverged when this was saved.",
       "Do not resume from it; roll back to the newest checkpoint before the first poisoned one."),
    _k("nonfinite_optimizer_state", "state", "error", "warm-start",
       "{path}: optimizer moments contain NaN/Inf ({examples}){weights_text}.",
       "Warm-start from the weights with a fresh optimizer, or roll back further."),
    _k("weight_norm_jump", "state", "warning", "resume",
       "{path}: the global weight norm changed by {ratio:.1f}x since {previous} ({examples}).",
       "Check the loss curve around this step; a divergence may have started here."),
    # --------------------------------------------------------------- security
    _k("malicious_pickle_code_exec", "security", "error", "none",
       "{path}: the pickle in {member} imports {dangerous}, which can run commands when unpickled: opening it "
       "with torch.load(weights_only=False) or pickle.load would execute code.",
       "Never load it outside a disposable sandbox; find out where the file came from and replace it."),
    _k("unknown_pickle_global", "security", "warning", "resume",
       "{path}: the pickle in {member} imports {unknown} (module.name), which is neither allowed by "
       "torch.load(weights_only=True) nor a known framework data class: weights_only=True will refuse it, and "
       "weights_only=False would run whatever code that name has where the file is loaded.",
       "Inspect the import; if it is your own trusted type, add it to security.allow_globals in the audit config."),
    _k("non_allowlisted_global_benign", "security", "warning", "resume",
       "{path}: the pickle in {member} imports {benign}, known-benign but rejected by torch.load(weights_only=True) "
       "(the default since torch 2.6).",
       "Allow exactly these types before loading.",
       "torch.serialization.add_safe_globals([{add_safe}])"),
    _k("pickle_obfuscation", "security", "error", "none",
       "{path}: the pickle in {member} uses a trick that hides what it imports ({why}).",
       "Never load it; find out where the file came from."),
    # --------------------------------------------------- file (formats/torchzip)
    _k("zip_central_directory_corrupted", "file", "error", "none",
       "{path}: the zip central directory or its end records (from offset {offset}) are damaged ({why}), so "
       "the records cannot be located through it.",
       "Treat it as lost; roll back to an older checkpoint and check the storage for bad blocks."),
    # ---------------------------------------------------- file (formats/legacy)
    _k("legacy_storage_size_mismatch", "file", "error", "none",
       "{path}: storage {storage} of this legacy torch.save file is prefixed with {found} elements at offset "
       "{offset} but the pickle declares {expected} ({dtype}): the storage records are misaligned or overwritten.",
       "Treat it as corrupt; roll back to an older checkpoint."),
    # ------------------------------------- file (hashing: ckptaudit.publish manifests)
    _k("chunk_checksum_mismatch", "file", "error", "none",
       "{path}: bytes {start} to {last} ({n_bytes} bytes: chunk(s) {chunks} of {n_chunks}, {chunk_bytes} bytes "
       "each) do not match the SHA-256 recorded in the {source}; {where_text}.",
       "Do not use it; roll back to the newest checkpoint whose checksums verify. Only that byte range changed: "
       "an intact copy of the file can be compared or repaired over that range alone."),
    _k("manifest_file_missing", "file", "error", "none",
       "{path} is listed in {manifest} ({size_bytes} bytes, SHA-256 {sha256_hex}) but is not in the unit: it "
       "was deleted, or the unit was copied only in part.",
       "Do not use the unit; restore the file from a copy whose SHA-256 matches, or roll back to the previous "
       "checkpoint."),
    # ------------------------------------- file (object storage: ckptaudit.fs, s3:// runs only)
    _k("incomplete_multipart_upload", "file", "error", "none",
       "{path}: a multipart upload started at {initiated} was never completed (S3 ListMultipartUploads, upload id "
       "{upload_id}): a save that died before CompleteMultipartUpload; its parts are invisible as an object but "
       "are stored and billed.",
       "Do not count on this save; roll back to an older checkpoint. Abort the upload "
       "(`aws s3api abort-multipart-upload`) or set a lifecycle rule AbortIncompleteMultipartUpload."),
    _k("suspiciously_small_object", "file", "warning", "resume",
       "{path} is an object of only {size_bytes} bytes under a checkpoint name: an upload that wrote a "
       "placeholder, an error body or a pointer instead of the checkpoint.",
       "Check the object's content and the uploader's log; re-upload it from the training host if it is short."),
]

CATALOGUE: Dict[str, Kind] = {e.kind: e for e in _ENTRIES}


class _SafeDict(dict):
    def __missing__(self, key):  # unfilled template fields stay visible, never raise
        return "{" + key + "}"


def _render(template: str, values: Dict[str, Any]) -> str:
    if not template:
        return ""
    return string.Formatter().vformat(template, (), _SafeDict(values))


def make(kind: str, path: str = "", **values: Any) -> Finding:
    """Build a :class:`Finding` of a catalogued ``kind``.

    ``values`` fill the kind's templates and are kept in ``detail``.  Raises
    ``KeyError`` for a kind not in :data:`CATALOGUE` (a programming error).
    """
    k = CATALOGUE[kind]
    vals = dict(values)
    vals.setdefault("path", path)
    return Finding(
        kind=k.kind,
        layer=k.layer,
        severity=k.severity,
        caps=k.caps,
        message=_render(k.message, vals),
        next_step=_render(k.next_step, vals),
        repair=_render(k.repair, vals),
        path=path,
        detail={key: _jsonable(v) for key, v in values.items()},
    )


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def usable_for(findings: Iterable[Finding | Dict[str, Any]], start: str = "resume") -> str:
    """The best use left after ``findings``: the minimum of their caps."""
    best = _USE_RANK[start]
    for f in findings:
        caps = f["caps"] if isinstance(f, dict) else f.caps
        best = max(best, _USE_RANK[caps])
    return USES[best]


def worse_use(a: str, b: str) -> str:
    return USES[max(_USE_RANK[a], _USE_RANK[b])]


def catalogue_markdown() -> str:
    """The catalogue as a Markdown table (used to generate docs/findings.md)."""
    lines = [
        "## Finding catalogue",
        "",
        "Generated from `ckptaudit/findings.py` by `ckptaudit findings --update-readme`; a test keeps the",
        "two equal. *Unit still usable for* is the best use left to a unit carrying the finding (the verdict",
        "takes the minimum over a unit's findings). `{fields}` are filled with the unit's values.",
        "",
        "| kind | layer | severity | unit still usable for | what it means | next step |",
        "|---|---|---|---|---|---|",
    ]
    for k in sorted(_ENTRIES, key=lambda e: (LAYERS.index(e.layer), e.kind)):
        msg = k.message.replace("|", "\\|").replace("\n", " ")
        nxt = k.next_step.replace("|", "\\|")
        lines.append(f"| `{k.kind}` | {k.layer} | {k.severity} | {k.caps} | {msg} | {nxt} |")
    return "\n".join(lines) + "\n"


def update_readme(path) -> bool:
    """Rewrite the catalogue between the findings markers of README ``path``; True if it changed."""
    from pathlib import Path

    p = Path(path)
    text = p.read_text()
    start, end = "<!-- findings:start -->", "<!-- findings:end -->"
    i, j = text.index(start) + len(start), text.index(end)
    new = text[:i] + "\n" + catalogue_markdown() + text[j:]
    if new != text:
        p.write_text(new)
        return True
    return False
