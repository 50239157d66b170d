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
       stage="scan", detector="ckptaudit.security:scan"),
    _k("unknown_pickle_global", "security", "warning", "resume",
       "{path}: the pickle in {member} imports {unknown} (module.name), which is neither allowed by "
       "torch.load(weights_only=True) nor a known framework data class: weights_only=True will refuse it, and "
       "weights_only=False would run whatever code that name has where the file is loaded.",
       "Inspect the import; if it is your own trusted type, add it to security.allow_globals in the audit config.",
       stage="scan", detector="ckptaudit.security:scan"),
    _k("non_allowlisted_global_benign", "security", "warning", "resume",
       "{path}: the pickle in {member} imports {benign}, known-benign but rejected by torch.load(weights_only=True) "
       "(the default since torch 2.6).",
       "Allow exactly these types before loading.",
       "torch.serialization.add_safe_globals([{add_safe}])",
       stage="scan", detector="ckptaudit.security:scan"),
    _k("pickle_obfuscation", "security", "error", "none",
       "{path}: the pickle in {member} uses a trick that hides what it imports ({why}).",
       "Never load it; find out where the file came from.",
       stage="scan", detector="ckptaudit.security_tricks:obfuscation"),
]
