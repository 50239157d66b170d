"""What the producer's resume does with a pickle's known-benign imports, and the finding that follows.

A pickle's benign imports (numpy arrays, ``TrainingArguments``…) only matter where a loader with an
allowlist meets them.  The frameworks' resumes load their own files in their own way: each producer's
module (:mod:`ckptaudit.producers`) says, per file role, how its resume unpickles the file
(:class:`~ckptaudit.producers.contract.ResumeLoad`: an allowlist added to torch's, no allowlist at all, or
never unpickled), with the framework source it was read from.

The table is keyed by layout and file role (:mod:`ckptaudit.roles`, structural), so the verdict is the same
with the producer contracts off.  Everything else is read by ``torch.load(weights_only=True)`` with torch's
own allowlist: benign imports there are a warning with the exact ``add_safe_globals`` repair.  Dangerous and
unknown imports are judged in :mod:`ckptaudit.security` whatever the loader.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .. import findings, producers
from ..findings import Finding
from ..producers import ResumeLoad

__all__ = ["ResumeLoad", "benign_findings", "resume_load", "unrestricted_loader"]


def resume_load(layout: str, rel: str) -> Optional[ResumeLoad]:
    """How the resume of a ``layout`` unit loads its file ``rel`` (None: plain torch.load(weights_only=True))."""
    from .. import roles

    producer = producers.for_layout(layout)
    if producer is None or not producer.resume_loads:
        return None
    role = roles.roles_for(layout, [rel]).get(rel, "mixed")
    return producer.resume_loads.get(role)


def unrestricted_loader(loader: str, resume: Optional[ResumeLoad]) -> str:
    """How the resume unpickles this member without any allowlist, in words; "" when its loader is restricted.

    ``pickle.load`` (DCP's ``.metadata``) and a producer's resume that passes ``weights_only=False``
    (a producer's ``resume_loads``: DeepSpeed's ``TorchCheckpointEngine.load``,
    accelerate's ``load_custom_state``) import and call every global the pickle names; there an import on
    no list is an error (``unrestricted_load_imports_unknown``).  Elsewhere ``torch.load(weights_only=True)``
    refuses it, which makes the load fail: a warning (``unknown_pickle_global``)."""
    if resume is not None and resume.never:
        return ""
    if resume is not None and not resume.weights_only:
        return resume.loader
    if loader == "pickle.load":
        return "pickle.load (no allowlist), as torch.distributed.checkpoint reads .metadata"
    return ""


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in sorted(set(names)))


def benign_findings(benign: Sequence[Tuple[str, str, str]], dtype_classes: Sequence[str], *, path: str,
                    member: str, resume: Optional[ResumeLoad]) -> List[Finding]:
    """The finding for a member's benign imports read by ``torch.load``.

    ``benign`` holds ``(name in the file, name as torch matches it, add_safe_globals spelling)`` per import;
    ``dtype_classes`` the ``numpy.dtypes`` classes torch meets when it rebuilds ``numpy.dtype`` objects.  The
    message and the repair list the same names (what must be allowed).  Under a resume that never unpickles
    the file, or whose loader accepts every name, the finding is info with no repair; otherwise a warning
    that names only what the resume's loader does not allow.
    """
    if not benign:
        return []
    need: Dict[str, Tuple[str, str]] = {t: (n, s) for n, t, s in benign}  # torch name -> (file name, spelling)
    need.update({c: (c, c) for c in dtype_classes})
    if resume is not None and resume.never:
        return [findings.make("pickle_global_not_loaded_on_resume", path=path, member=member,
                              benign=_quoted(need), loader=resume.loader, imports=sorted({n for n, _, _ in benign}))]
    if resume is not None and (not resume.weights_only or set(need) <= resume.allows):
        how = "loads without an allowlist" if not resume.weights_only else "allows every one of them"
        return [findings.make("pickle_global_allowed_by_resume", path=path, member=member, benign=_quoted(need),
                              loader=resume.loader, how=how, imports=sorted({n for n, _, _ in benign}))]
    missing = {t: v for t, v in need.items() if resume is None or t not in resume.allows}
    files = sorted({need[t][0] for t in missing if t not in dtype_classes} or {n for n, _, _ in benign})
    return [findings.make("non_allowlisted_global_benign", path=path, member=member, benign=_quoted(files),
                          allow=_quoted(missing), add_safe=", ".join(sorted({s for _, s in missing.values()})),
                          imports=sorted({n for n, _, _ in benign}))]
