"""The security layer's finding kinds: what the pickles import and how they hide it.

Data only: each entry names its ``stage`` (the Snakemake rule whose job runs the detector) and its
``detector`` (``module:function``, where the finding is decided and built).
"""

from __future__ import annotations

from typing import List

from .model import Kind as _k

ENTRIES: List[_k] = [
    _k("malicious_pickle_code_exec", "security", "error", "none",
       "{path}: the pickle in {member} imports {dangerous}, which can run commands when unpickled: opening it "
       "with torch.load(weights_only=False) or pickle.load would execute code.",
       "Never load it outside a disposable sandbox; find out where the file came from and replace it.",
       stage="scan", detector="ckptaudit.security:_scan_findings"),
    _k("path_outside_run", "security", "error", "none",
       "{path} names {named!r}, which resolves to {target}, outside the run folder: {reads}. The audit does "
       "not open it.",
       "Copy what it names into the run folder (or point it at a checkpoint inside the run) and audit again; "
       "if the link is unexpected, find out who wrote it before any job resumes from this run.",
       stage="scan", detector="ckptaudit.confine:path_outside_run"),
    _k("whole_module_pickle", "security", "info", "resume",
       "{path} pickles whole modules ({classes}), as torch.save(model) does: torch.load(weights_only=True) "
       "refuses it by design, not because it is damaged (its bytes passed the CRC32 and pickle checks); loading it "
       "takes torch.load(..., weights_only=False), which imports these classes and runs their code.",
       "Resume with torch.load(path, weights_only=False) only where this file and the code of {top} are trusted "
       "(your own training code, its installed packages); to stop depending on that code, save "
       "model.state_dict() from now on, or convert this file once where it is trusted (the repair).",
       "import torch\n"
       "obj = torch.load(\"{path}\", weights_only=False)  # a trusted file and code only\n"
       "as_dict = obj if isinstance(obj, dict) else {{\"model\": obj}}\n"
       "torch.save({{k: (v.state_dict() if isinstance(v, torch.nn.Module) else v) for k, v in as_dict.items()}}, "
       "\"{path}.state_dict.pt\")",
       stage="load", detector="ckptaudit.stages.load.whole_modules:refusal"),
    _k("unrestricted_load_imports_unknown", "security", "error", "none",
       "{path}: the pickle in {member} imports {unknown} (module.name), which no allowlist knows, and the "
       "resume loads this file with {loader}: loading it would import and call these names, running whatever "
       "code they have where the job resumes.",
       "Do not resume from this unit until you know where the file came from and what these names do; if they "
       "are your own trusted types, add them to security.allow_globals in the audit config.",
       stage="scan", detector="ckptaudit.security:_unknown_finding"),
    _k("dcp_bytes_item_not_scanned", "security", "warning", "resume",
       "{path}: {n} non-tensor item(s) ({examples}) were not walked: the audit reads at most {max_items} items "
       "and {max_mib} MiB of them per unit. dcp.load unpickles each with torch.load(weights_only=False), so "
       "what they import is unknown here.",
       "Check these items' pickles before resuming (torch.distributed.checkpoint's load_bytes runs whatever they "
       "import), or save such values as tensors.",
       stage="scan", detector="ckptaudit.layouts.dcp_bytes:scan_bytes_items"),
    _k("unknown_pickle_global", "security", "warning", "resume",
       "{path}: the pickle in {member} imports {unknown} (module.name), which is neither allowed by "
       "torch.load(weights_only=True) nor a known framework data class: weights_only=True will refuse it, and "
       "weights_only=False would run whatever code that name has where the file is loaded.",
       "Inspect the import; if it is your own trusted type, add it to security.allow_globals in the audit config.",
       stage="scan", detector="ckptaudit.security:_unknown_finding"),
    _k("torchscript_pickle_global", "security", "warning", "resume",
       "{path}: the TorchScript pickle {member} names {names} (module.name). torch.jit.load (and torch.load, "
       "which hands TorchScript archives to it) reads it with TorchScript's C++ unpickler, which imports no "
       "Python global: a name that is neither one of its torch types nor a TorchScript class of the archive's "
       "code/ makes the load fail (\"Unknown type name\"), and no code runs. A tool that opens this record with "
       "Python's pickle would import and call these names{py_note}.",
       "Load it only with torch.jit.load; find out where the archive came from and why its pickle names "
       "these, and never unpickle the record with Python's pickle.",
       stage="scan", detector="ckptaudit.security.torchscript:scan"),
    _k("non_allowlisted_global_benign", "security", "warning", "resume",
       "{path}: the pickle in {member} imports {benign}, known-benign but rejected by torch.load(weights_only=True) "
       "(the default since torch 2.6): loading it needs exactly {allow} allowed.",
       "Allow exactly these types before loading.",
       "torch.serialization.add_safe_globals([{add_safe}])",
       stage="scan", detector="ckptaudit.security.resume:benign_findings"),
    _k("pickle_global_allowed_by_resume", "security", "info", "resume",
       "{path}: the pickle in {member} needs {benign}, known-benign types that torch.load(weights_only=True) "
       "refuses by default; the resume's own loader ({loader}) {how}, so a resume loads the file as saved.",
       "Nothing to do for a resume; only a load of this file outside the framework needs these types allowed "
       "(torch.serialization.add_safe_globals).",
       stage="scan", detector="ckptaudit.security.resume:benign_findings"),
    _k("pickle_global_not_loaded_on_resume", "security", "info", "resume",
       "{path}: the pickle in {member} needs {benign}, known-benign types that torch.load(weights_only=True) "
       "refuses by default; the resume never unpickles this file ({loader}), so it does not affect a resume.",
       "Nothing to do for a resume; only reading this file yourself needs these types allowed "
       "(torch.serialization.add_safe_globals).",
       stage="scan", detector="ckptaudit.security.resume:benign_findings"),
    _k("pickle_obfuscation", "security", "error", "none",
       "{path}: the pickle in {member} uses a trick that hides what it imports ({why}).",
       "Never load it; find out where the file came from.",
       stage="scan", detector="ckptaudit.security.tricks:obfuscation"),
]
