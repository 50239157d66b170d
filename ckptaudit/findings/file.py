"""The file layer's finding kinds: bytes, formats, hashes, layouts, pointers and the load test.

Data only: each entry names its ``stage`` (the Snakemake rule whose job runs the detector) and its
``detector`` (``module:function``, where the finding is decided and built).
"""

from __future__ import annotations

from typing import List

from .file_digests import ENTRIES as DIGEST_ENTRIES
from .model import Kind as _k

ENTRIES: List[_k] = [
    _k("empty_file", "file", "error", "none",
       "{path} is 0 bytes: the save died right after the file was created, or the quota/disk was full.",
       "Do not load it; roll back to an older checkpoint and check free space/quota before the next save.",
       stage="scan", detector="ckptaudit.formats.sniff:generic_findings"),
    _k("all_zero_file", "file", "error", "none",
       "{path} is {size_bytes} bytes of NUL only: space was allocated but the data never reached the disk "
       "(power loss, NFS client crash, or a preallocated file that was never written).",
       "Treat it as lost; roll back to an older checkpoint and check the storage's write-back/flush behaviour.",
       stage="scan", detector="ckptaudit.formats.sniff:generic_findings"),
    _k("zero_filled_tail", "file", "error", "none",
       "{path}: the last {zero_bytes} bytes (from offset {offset}) are NUL where data should be: the file's "
       "size was committed but its data blocks were not flushed.",
       "Treat it as lost; roll back to an older checkpoint. fsync the file and its folder before publishing.",
       stage="scan", detector="ckptaudit.formats.zeros:tail"),
    _k("zero_filled_head", "file", "error", "none",
       "{path}: the first {zero_bytes} bytes are NUL where the file header should be.",
       "Treat it as lost; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.zeros:head"),
    _k("zero_filled_span", "file", "error", "none",
       "{path}: {zero_bytes} NUL bytes at offset {offset} inside {member} where tensor data should be "
       "(a lost or unflushed block).",
       "Treat it as lost; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.zeros:span"),
    _k("git_lfs_pointer", "file", "error", "none",
       "{path} is a {size_bytes}-byte Git LFS pointer, not the checkpoint: the real object is {lfs_size} bytes "
       "with oid sha256:{lfs_oid}.",
       "Fetch the real object: `git lfs install && git lfs pull --include \"{path}\"` in the repository it came from.",
       stage="scan", detector="ckptaudit.formats.sniff:generic_findings"),
    _k("html_error_page", "file", "error", "none",
       "{path} is an HTML page ({size_bytes} bytes), not a checkpoint: a downloader saved an error, quota or "
       "login page under the checkpoint's name.",
       "Download the file again with an authenticated tool (e.g. `huggingface-cli download`, `gdown --fuzzy`) and "
       "compare its size and SHA-256 with the source.",
       stage="scan", detector="ckptaudit.formats.sniff:generic_findings"),
    _k("text_error_page", "file", "error", "none",
       "{path} is text ({size_bytes} bytes, starts with {head!r}), not a checkpoint: an error response or log "
       "was saved under the checkpoint's name.",
       "Download or copy the file again and compare its size and SHA-256 with the source.",
       stage="scan", detector="ckptaudit.formats.sniff:generic_findings"),
    _k("not_a_torch_save_file", "file", "error", "none",
       "{path} is a plain pickle ({size_bytes} bytes) written with pickle.dump, not torch.save: torch.load "
       "cannot read it and unpickling it would run whatever it names.",
       "Find the real checkpoint; if this file is yours and trusted, convert it with torch.save in a sandbox.",
       stage="scan", detector="ckptaudit.formats.sniff:_pickle_findings"),
    _k("numpy_archive_not_checkpoint", "file", "error", "none",
       "{path} is a NumPy .npy/.npz archive, not a torch checkpoint.",
       "Point the resume at the real checkpoint file; load this one with numpy.load(allow_pickle=False).",
       stage="scan", detector="ckptaudit.formats.sniff:generic_findings"),
    _k("unknown_format", "file", "error", "none",
       "{path} ({size_bytes} bytes) is no checkpoint format the audit knows: it starts with bytes {head_hex}.",
       "Check what wrote this file; if it is a checkpoint in a format ckptaudit does not know, report it.",
       stage="scan", detector="ckptaudit.formats.sniff:generic_findings"),
    _k("truncated_zip_no_central_directory", "file", "error", "none",
       "{path} is a torch.save zip cut short: it is {size_bytes} bytes and has no end-of-central-directory "
       "record{missing_text}. {intact_text}",
       "Treat it as lost (the save was killed or the disk filled); roll back to the rollback point the verdict names.",
       stage="scan", detector="ckptaudit.formats.zip.cut:truncated"),
    _k("zip_member_header_corrupted", "file", "error", "none",
       "{path}: the zip local header of {member} at offset {offset} is damaged ({why}); the central directory "
       "is intact, so the file has the right size but a block in the middle was lost or overwritten.",
       "Treat it as lost; roll back to an older checkpoint and check the storage for bad blocks.",
       stage="scan", detector="ckptaudit.formats.zip.central:member_header_corrupted"),
    _k("zip_missing_record", "file", "error", "none",
       "{path}: the zip archive has no {member} record ({why}).",
       "The archive was re-packed or written by another tool; find the original checkpoint.",
       stage="scan", detector="ckptaudit.formats.zip.central:missing_record"),
    _k("zip_crc_mismatch", "file", "error", "none",
       "{path}: member {member} fails its CRC32 check (stored {expected}, computed {actual}): its bytes "
       "changed after the save{tensor_text}{zeros_text}.",
       "Treat it as corrupt even though torch.load may accept it; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.zip.crc_finding:crc_mismatch"),
    _k("zip_storage_missing", "file", "error", "none",
       "{path}: data.pkl references storage {storage} but the archive has no {member} record.",
       "Treat it as lost; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.zip.storages:check_storages"),
    _k("zip_storage_size_mismatch", "file", "error", "none",
       "{path}: storage {storage} needs {expected} bytes ({dtype} x {numel}) but its record holds {actual}.",
       "Treat it as lost; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.zip.storages:check_storages"),
    _k("truncated_legacy_pickle", "file", "error", "none",
       "{path} is a pre-1.6 (legacy, non-zip) torch.save file cut short at {size_bytes} bytes: {why}.",
       "Treat it as lost; roll back to an older checkpoint. Save with the default zip format from now on.",
       stage="scan", detector="ckptaudit.formats.legacy:_truncated"),
    _k("legacy_magic_mismatch", "file", "error", "none",
       "{path} starts like a legacy torch.save file but its magic number is {found} (expected {expected}).",
       "Treat it as corrupt; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.sniff:legacy_magic_mismatch"),
    _k("checksum_mismatch", "file", "error", "none",
       "{path}: SHA-256 is {actual} but its {source} records {expected}: the bytes changed after they were "
       "written (silent corruption, an interrupted copy, or a later partial overwrite).",
       "Do not use it; roll back to the newest checkpoint whose checksums verify.",
       stage="hash", detector="ckptaudit.stages.hash:_file_row"),
    _k("size_mismatch_vs_manifest", "file", "error", "none",
       "{path} is {actual} bytes but the {source} records {expected} bytes.",
       "Do not use it; roll back to the newest checkpoint whose checksums verify.",
       stage="hash", detector="ckptaudit.stages.hash:_file_row"),
    _k("sidecar_missing", "file", "info", "resume",
       "{path} has no SHA-256 sidecar or manifest entry: silent corruption inside tensor data cannot be ruled out "
       "for members without their own CRC.",
       "Publish checkpoints with sidecars (ckptaudit.publish) or seal this run: `ckptaudit seal RUN_DIR`.",
       stage="hash", detector="ckptaudit.stages.hash:_sidecar_missing"),
    _k("sidecar_malformed", "file", "warning", "resume",
       "{sidecar} is not in sha256sum format ({why}).",
       "Regenerate it with `sha256sum FILE > FILE.sha256` from a copy you trust.",
       stage="hash", detector="ckptaudit.stages.hash:_sidecar_digests"),
    _k("sidecar_unreadable", "file", "warning", "resume",
       "{sidecar} exists but cannot be read ({why}), so {path} is not verified against it.",
       "Replace the sidecar with a regular file: `sha256sum FILE > FILE.sha256` from a copy you trust.",
       stage="hash", detector="ckptaudit.stages.hash:_sidecar_digests"),
    _k("sidecar_names_other_file", "file", "warning", "resume",
       "{sidecar} names {named!r}, not {path!r}.",
       "Regenerate the sidecar for the right file.",
       stage="hash", detector="ckptaudit.stages.hash:_sidecar_digests"),
    _k("header_too_small", "file", "error", "none",
       "{path} is {size_bytes} bytes, less than the 8-byte header-length prefix of a safetensors file.",
       "Treat it as lost; download or copy it again.",
       stage="scan", detector="ckptaudit.formats.safetensors_check:_read_header"),
    _k("header_too_large", "file", "error", "none",
       "{path}: the safetensors header length prefix says {header_len} bytes but the file has only {size_bytes}.",
       "Treat it as lost or as not a safetensors file; download or copy it again.",
       stage="scan", detector="ckptaudit.formats.safetensors_check:_read_header"),
    _k("invalid_header_json", "file", "error", "none",
       "{path}: the safetensors JSON header ({header_len} bytes) does not parse: {why}.",
       "Treat it as lost; download or copy it again.",
       stage="scan", detector="ckptaudit.formats.safetensors_check:_read_header"),
    _k("safetensors_offsets_invalid", "file", "error", "none",
       "{path}: tensor {tensor} has data_offsets {offsets} that {why}.",
       "Treat it as corrupt; download or copy it again.",
       stage="scan", detector="ckptaudit.formats.safetensors_spans:offset_invalid"),
    _k("truncated_in_data", "file", "error", "none",
       "{path}: the safetensors header is intact but the tensor data is cut short: {missing_bytes} of "
       "{expected_bytes} data bytes are missing. {intact_text}",
       "Treat it as lost; download or copy it again and compare sizes.",
       stage="scan", detector="ckptaudit.formats.safetensors_spans:truncated_in_data"),
    _k("safetensors_trailing_bytes", "file", "error", "resume",
       "{path}: {extra_bytes} bytes after the last tensor are not covered by the header; safetensors (0.4+) refuses "
       "such a file ('file not fully covered'), though every tensor is intact.",
       "Cut a copy back to the {expected_bytes} bytes the header covers and load the copy.",
       "cp {path} {path}.fixed && truncate -s {expected_bytes} {path}.fixed",
       stage="scan", detector="ckptaudit.formats.safetensors_check:check_safetensors"),
    _k("index_invalid", "file", "error", "none",
       "{path}: the sharded-checkpoint index does not parse or has no weight_map ({why}).",
       "Download or copy the index again from the source.",
       stage="scan", detector="ckptaudit.layouts.hf:read_index"),
    _k("index_references_missing_shard", "file", "error", "none",
       "{path} maps {n_tensors} tensors to {shard}, which is not in the folder (interrupted download or partial "
       "copy).",
       "Fetch the missing shard(s) {shards} from the source; without them the weights are incomplete.",
       stage="scan", detector="ckptaudit.layouts.hf:check_index"),
    _k("index_tensor_not_in_shard", "file", "error", "none",
       "{path} says {tensor} is in {shard}, but that shard has no such tensor.",
       "The shards and the index come from different saves; fetch them again together.",
       stage="scan", detector="ckptaudit.layouts.hf:check_shard"),
    _k("dcp_metadata_missing", "file", "error", "none",
       "{path} holds torch.distributed.checkpoint data files ({n_files}) but no .metadata: the save never "
       "committed (crash, or an async save that did not finish){tmp_text}.",
       "Treat it as lost; roll back to the rollback point the verdict names. DCP writes .metadata last, so its absence means "
       "the save was incomplete.",
       stage="scan", detector="ckptaudit.layouts.dcp:DCP.scan"),
    _k("dcp_shard_missing", "file", "error", "none",
       "{path}: .metadata names data file {file} ({n_items} storage items, rank {rank}) but it is not there.",
       "The rank that wrote {file} did not finish or the file was removed; roll back to the rollback point the verdict names.",
       stage="scan", detector="ckptaudit.layouts.dcp:check_shards"),
    _k("dcp_shard_too_short", "file", "error", "none",
       "{path}: {file} is {actual} bytes but .metadata needs at least {expected} (item {item}).",
       "The file was cut short; roll back to the rollback point the verdict names.",
       stage="scan", detector="ckptaudit.layouts.dcp:check_shards"),
    _k("dcp_chunk_crc_mismatch", "file", "error", "none",
       "{path}: the bytes of {what} changed after the save: record {member} of its torch.save blob (bytes "
       "{blob_start}..{blob_end} of the file) stores CRC32 {expected}, its data (bytes {data_start}..{data_end}) "
       "gives {actual}; dcp.load and dcp_to_torch_save would raise or load the changed values.",
       "Treat this save as corrupt; roll back to the rollback point the verdict names (an older save).",
       stage="scan", detector="ckptaudit.layouts.dcp_crc:chunk_crc_mismatch"),
    _k("dcp_metadata_unreadable", "file", "error", "none",
       "{path}: .metadata could not be walked ({why}).",
       "Treat it as corrupt; roll back to the rollback point the verdict names.",
       stage="scan", detector="ckptaudit.layouts.dcp:DCP.scan"),
    _k("ds_rank_files_missing", "file", "error", "none",
       "{unit}: DeepSpeed ZeRO files for data-parallel ranks {ranks} are missing (found {found} of {expected}; "
       "the first missing is {path}).",
       "A rank did not finish its save; roll back to the previous complete tag.",
       stage="scan", detector="ckptaudit.layouts.deepspeed:_missing_partitions"),
    _k("latest_pointer_dangling", "file", "error", "none",
       "{pointer} names {target!r}, which does not exist{complete_text}.",
       "Resume from the newest complete checkpoint instead ({suggestion}); rewrite {pointer} atomically to name it.",
       "echo -n {suggestion_text} > {pointer}.tmp && mv {pointer}.tmp {pointer}",
       stage="report", detector="ckptaudit.pointer_judgements:pointer_finding"),
    _k("latest_pointer_incomplete", "file", "error", "none",
       "{pointer} names {target!r}, which exists but is not usable ({why}).",
       "Resume from the newest usable checkpoint instead ({suggestion}); rewrite {pointer} atomically to name it.",
       "echo -n {suggestion_text} > {pointer}.tmp && mv {pointer}.tmp {pointer}",
       stage="report", detector="ckptaudit.pointer_judgements:pointer_to_unit_finding"),
    _k("resume_entry_damaged", "file", "error", "none",
       "{path} is the checkpoint {framework}'s {entry_call} resumes from, and it is "
       "damaged ({why}): a job resuming as configured would {outcome}{intact_text}.",
       "{next_text}", "{repair_code}", stage="report", detector="ckptaudit.resume_entry:entry_findings"),
    _k("latest_pointer_not_newest", "file", "info", "resume",
       "{pointer} names {target!r} but a newer usable checkpoint exists ({suggestion}).",
       "Check whether the newer checkpoint should be resumed from.",
       stage="report", detector="ckptaudit.pointer_judgements:pointer_to_unit_finding"),
    _k("dangling_symlink", "file", "error", "none",
       "{pointer} is a symbolic link to {target!r}, which does not exist.",
       "Point it at the newest usable checkpoint ({suggestion}).",
       "ln -s {suggestion} {pointer}.new && mv -T {pointer}.new {pointer}",
       stage="report", detector="ckptaudit.pointer_judgements:pointer_finding"),
    _k("symlink_target_unusable", "file", "error", "none",
       "{pointer} is a symbolic link to {target!r}, which exists but is not usable ({why}).",
       "Point the link at the newest usable checkpoint ({suggestion}); writing its name into {pointer} would "
       "replace the link with a text file that no loader reads as a checkpoint.",
       "ln -s {suggestion} {pointer}.new && mv -T {pointer}.new {pointer}", stage="report",
       detector="ckptaudit.pointer_judgements:pointer_to_unit_finding"),
    _k("megatron_tracker_invalid", "file", "error", "none",
       "{pointer} does not hold an iteration number or 'release' (it holds {content!r}).",
       "Rewrite it with the newest complete iteration ({suggestion}).",
       stage="report", detector="ckptaudit.producers.megatron:tracker_check"),
    _k("megatron_tracker_behind", "file", "warning", "resume",
       "{pointer} names iteration {iteration} but a newer complete iteration is usable ({suggestion}): Megatron's "
       "load_checkpoint resumes iteration {iteration} and repeats the iterations after it (a job that died between "
       "its save and the tracker write, or a tracker write that failed on a full quota: NeMo Automodel #3390).",
       "Point the tracker at {suggestion} before resuming (run in the run folder), or resume with --ckpt-step.",
       "echo -n {suggestion_text} > {pointer}.tmp && mv {pointer}.tmp {pointer}",
       stage="report", detector="ckptaudit.producers.megatron:tracker_behind"),
    _k("megatron_common_state_missing", "file", "error", "none",
       "{path}: the Megatron-Core save has no common state (neither common.pt nor a common_state item in "
       ".metadata): load_common_state_dict, which dist_checkpointing.load calls first, fails.",
       "Roll back to the previous complete iteration.",
       stage="scan", detector="ckptaudit.layouts.megatron_dist:MegatronDist.scan"),
    _k("mixed_step_shards", "file", "error", "none",
       "{path}: model-parallel shards record different iterations ({iterations}): some ranks' files are stale "
       "copies from an earlier save.",
       "Do not resume from it; roll back to the newest iteration whose shards all agree.",
       stage="scan", detector="ckptaudit.layouts.megatron:Megatron.scan"),
    _k("megatron_rank_missing", "file", "error", "none",
       "{path}: model-parallel rank folders {missing} are missing (found {found}).",
       "A rank did not finish its save; roll back to the previous complete iteration.",
       stage="scan", detector="ckptaudit.layouts.megatron:_missing_ranks"),
    _k("unit_in_progress", "file", "error", "none",
       "{path} is an in-progress save ({why}): it was never published.",
       "Never resume from it; it can be deleted once no training job is writing to it.",
       stage="scan", detector="ckptaudit.layouts.leftovers:in_progress"),
    _k("dead_writer_leftovers", "file", "warning", "resume",
       "{count} leftover(s) of ckptaudit.publish saves whose process is gone on this host ({size}; {examples}): "
       "never a rollback point, but they fill the disk until removed.",
       "The next ckptaudit.publish into the folder removes them (sweep_stale, the default); to remove them now, "
       "run the repair (it removes only temps of dead writers on this host).",
       "ckptaudit prune {run_quoted} --sweep-stale",
       stage="report", detector="ckptaudit.dead_writers:finding"),
    _k("save_spoiled_by_another_rank", "file", "error", "none",
       "{path} is intact alone, but it cannot be resumed: {why}.",
       "Roll back to an older save whose every rank file is intact (the verdict's rollback point); when there is "
       "none (NVRx keeps one iteration), resume from the job's persistent checkpoint.",
       stage="report", detector="ckptaudit.save_groups:findings"),
    _k("unit_changed_during_audit", "file", "error", "none",
       "{path} changed while it was audited: {what} between the inventory and the report (a writer or a "
       "retention job is working on the run), so what was checked is no longer what is there.",
       "Not chosen as a rollback point; audit again once no job is writing, or keep the drill away from units "
       "newer than the last completed save.",
       stage="report", detector="ckptaudit.stages.liveness:changed_finding"),
    _k("not_a_regular_file", "file", "error", "none",
       "{path} is not read: {why}.",
       "Replace it with the real checkpoint file, or remove it from the run folder; the audit never opens it.",
       stage="scan", detector="ckptaudit.layouts.leftovers:irregular"),
    _k("path_too_long", "file", "error", "none",
       "{shown} is not read: {why}; a training job cannot open it by this path either.",
       "Move or rename it to a shorter path (fewer or shorter folder names, e.g. `mv` the deep folder up) and "
       "audit again; until then do not count on it as a rollback point.",
       stage="scan", detector="ckptaudit.layouts.leftovers:irregular"),
    _k("file_unreadable", "file", "error", "none",
       "{path} cannot be opened for reading by this user ({why}): its bytes are unchecked, and a resume "
       "running as the same user fails on it as well.",
       "Check the owner and mode (ls -l {path}); give the user that resumes read permission (chmod u+r, or "
       "chown), then audit again.",
       stage="scan", detector="ckptaudit.layouts.leftovers:irregular"),
    _k("pointer_refused", "file", "error", "none",
       "{pointer} is a symbolic link the audit does not follow ({target!r}): {why}.",
       "Point it at a checkpoint inside the run folder (the newest usable is {suggestion}), or copy the "
       "checkpoint into the run.",
       stage="report", detector="ckptaudit.pointer_judgements:pointer_finding"),
    _k("pickle_too_complex", "file", "warning", "resume",
       "{path}: the pickle is larger than the audit's work budget ({why}): the description was cut, so "
       "components may be missed; {imports}.",
       "Inspect the file's structure with a trusted tool before resuming and load it only with "
       "torch.load(weights_only=True); a real checkpoint's tree is far smaller.",
       stage="scan", detector="ckptaudit.formats.pickles:walk_problem"),
    _k("audit_error", "file", "error", "none",
       "{path}: the {stage} stage could not examine this unit ({error_type}: {error}); the other units were "
       "audited.",
       "Treat the unit as unchecked; the error and the unit are in the stage's log. Report it with the file if "
       "the bytes look sound.",
       stage="any", detector="ckptaudit.stages.liveness:guard"),
    _k("unit_file_missing", "file", "error", "none",
       "{path}: {file} is missing ({why}).",
       "Do not resume from it; roll back to the rollback point the verdict names, or restore the file from a copy.",
       stage="scan", detector="ckptaudit.layouts.hf:HFTrainer.completeness"),
    _k("pickle_unreadable", "file", "error", "none",
       "{path}: the pickle in {member} cannot be walked ({why}).",
       "Treat it as corrupt; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.pickles:unreadable"),
    _k("load_failed", "file", "error", "none",
       "{path}: torch.load(weights_only=True) failed in an isolated process: {why}.",
       "Treat it as unusable; roll back to an older checkpoint. The raw error is in the load table.",
       stage="load", detector="ckptaudit.stages.load.loadtest:_load_row"),
    _k("load_not_checked", "file", "warning", "resume",
       "{path}: not load-tested: its pickle names classes of {packages}, which is not installed where the audit "
       "runs (import failed), so torch.load cannot rebuild them here. The bytes were checked; the load was not.",
       "Install it where the audit runs (`pip install torch==<your torch> {install}`, matching the training "
       "environment's version) and re-run the audit to load-test this file.",
       stage="load", detector="ckptaudit.stages.load.loadtest:_not_checked"),
    _k("load_timeout", "file", "error", "none",
       "{path}: the isolated load test did not finish in {timeout_seconds} s.",
       "Raise load.timeout_seconds if the file is very large and storage slow; otherwise treat it as unusable.",
       stage="load", detector="ckptaudit.stages.load.loadtest:_load_row"),
    _k("load_memory_limit", "file", "error", "none",
       "{path}: the isolated load test exceeded its {memory_limit_bytes}-byte memory limit (beyond the file's own "
       "mapping).",
       "Raise load.memory_limit_mib if the checkpoint is legitimately that large.",
       stage="load", detector="ckptaudit.stages.load.loadtest:_load_row"),
    # ------------------------------------------------ file (formats/zip/central)
    _k("zip_central_directory_corrupted", "file", "error", "none",
       "{path}: the zip central directory or its end records (from offset {offset}) are damaged ({why}), so "
       "the records cannot be located through it.",
       "Treat it as lost; roll back to an older checkpoint and check the storage for bad blocks.",
       stage="scan", detector="ckptaudit.formats.zip.central:cd_corrupted"),
    # ---------------------------------------------------- file (formats/legacy)
    _k("legacy_storage_size_mismatch", "file", "error", "none",
       "{path}: storage {storage} of this legacy torch.save file is prefixed with {found} elements at offset "
       "{offset} but the pickle declares {expected} ({dtype}): the storage records are misaligned or overwritten.",
       "Treat it as corrupt; roll back to an older checkpoint.",
       stage="scan", detector="ckptaudit.formats.legacy:_check_storages"),
    *DIGEST_ENTRIES,  # a manifest's chunk digests and listed files, the previous audit's own digests
    # ------------------------------------- file (Megatron-Core's integrity.json: ckptaudit.formats.integrity_json)
    _k("integrity_mismatch", "file", "error", "none",
       "{path}: SHA-256 is {actual} but {manifest} records {expected}: the file changed after the save sealed it (a "
       "copy from another iteration keeps its size and every CRC-32; silent corruption; a partial overwrite). "
       "Megatron-Core's load with --verify-integrity refuses this iteration (hash mismatch); a load without it "
       "takes these bytes as they are.",
       "Do not resume from it; roll back to the newest iteration whose integrity.json verifies, or restore {path} "
       "from a copy whose SHA-256 is {expected}.",
       stage="hash", detector="ckptaudit.formats.integrity_json:mismatch"),
    _k("integrity_file_missing", "file", "error", "none",
       "{path} is listed in {manifest} (SHA-256 {expected}) but {why}. Megatron-Core's load with --verify-integrity "
       "raises (file missing or unreadable).",
       "Do not resume from it; restore {path} from a copy whose SHA-256 matches, or roll back to the previous "
       "iteration.",
       stage="hash", detector="ckptaudit.formats.integrity_json:missing"),
    _k("integrity_manifest_unusable", "file", "error", "none",
       "{path} is not a usable integrity manifest: {why}. Megatron-Core's load with --verify-integrity raises on it "
       "({raises}) before it reads any tensor, so this iteration does not resume with --verify-integrity; nothing it "
       "records checks the folder's bytes.",
       "If the folder's bytes are proven intact another way (every CRC-32 and check of this audit passes, or they "
       "match a copy), move the manifest aside and seal the run again, which writes a new one (the repair); "
       "otherwise roll back to the previous iteration.",
       "mv {manifest_quoted} {aside_quoted} && ckptaudit seal {run_quoted}",
       stage="hash", detector="ckptaudit.formats.integrity_json:read_unit"),
    _k("integrity_unlisted", "file", "info", "resume",
       "{manifest} does not list {n_files} data file(s) of its folder ({files}): Megatron-Core's verification "
       "ignores files it does not list, so nothing recorded checks their bytes.",
       "A Megatron-Core save lists every file of the folder: find where the file came from. Once the bytes are "
       "proven intact, move the manifest aside and seal the run again (`ckptaudit seal RUN_DIR`) to cover it.",
       stage="hash", detector="ckptaudit.formats.integrity_json:UnitManifest.unlisted_finding"),
    # ------------------------------------- file (object storage: ckptaudit.fs, s3:// runs only)
    _k("incomplete_multipart_upload", "file", "error", "none",
       "{path}: a multipart upload started at {initiated} was never completed (S3 ListMultipartUploads, upload id "
       "{upload_id}): a save that died before CompleteMultipartUpload; its parts are invisible as an object but "
       "are stored and billed.",
       "Do not count on this save; roll back to an older checkpoint. Abort the upload "
       "(`aws s3api abort-multipart-upload`) or set a lifecycle rule AbortIncompleteMultipartUpload.",
       stage="scan", detector="ckptaudit.stages.scan:object_store_findings"),
    _k("suspiciously_small_object", "file", "warning", "resume",
       "{path} is an object of only {size_bytes} bytes under a checkpoint name: an upload that wrote a "
       "placeholder, an error body or a pointer instead of the checkpoint.",
       "Check the object's content and the uploader's log; re-upload it from the training host if it is short.",
       stage="scan", detector="ckptaudit.stages.scan:object_store_findings"),
]
