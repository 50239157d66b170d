"""What the producer's resume does with a pickle's known-benign imports, and the finding that follows.

A pickle's benign imports (numpy arrays, ``TrainingArguments``…) only matter where a loader with an
allowlist meets them.  The frameworks' resumes load their own files in their own way, read from their code
(versions as tested, the same sources as :mod:`ckptaudit.producers`):

* transformers 5.24 ``Trainer._load_rng_state``: ``torch.load(rng_file, weights_only=True)`` inside
  ``transformers.trainer_pt_utils.safe_globals()``, which allows ``numpy._core.multiarray._reconstruct``,
  ``numpy.ndarray``, ``numpy.dtype`` and ``type(numpy.dtype(numpy.uint32))``; ``training_args.bin`` is never
  unpickled by the resume; optimizer, scheduler and scaler files get ``weights_only=True`` with nothing added.
  transformers 4.57 is the same except that ``_load_rng_state`` calls ``torch.load(rng_file)`` with no
  ``weights_only``: torch's default decides (True from torch 2.6 on; before 2.6 that load is unrestricted and
  ``safe_globals()`` is a no-op).  The table assumes torch >= 2.6 where the job resumes.
* accelerate 1.15 (1.16 read the same) ``load_accelerator_state``: every file through ``accelerate.utils.load``
  (``weights_only=True`` with ``accelerate.utils.other.TORCH_SAFE_GLOBALS`` added: the same numpy names,
  ``codecs.encode`` and ``numpy.dtypes.UInt32DType``); ``load_custom_state`` passes ``weights_only=False``.
* deepspeed 0.19 ``TorchCheckpointEngine.load``: ``torch.load(weights_only=False)`` (no allowlist at all).

The table is keyed by layout and file role (:mod:`ckptaudit.roles`, structural), so the verdict is the same
with the producer contracts off.  Everything else is read by ``torch.load(weights_only=True)`` with torch's
own allowlist: benign imports there are a warning with the exact ``add_safe_globals`` repair.  Dangerous and
unknown imports are judged in :mod:`ckptaudit.security` whatever the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from . import findings
from .findings import Finding

__all__ = ["ResumeLoad", "RESUME_LOADS", "benign_findings", "resume_load", "unrestricted_loader"]


@dataclass(frozen=True)
class ResumeLoad:
    """How a producer's resume unpickles one file: ``loader`` in words, the names its loader adds to torch's
    weights-only allowlist (``allows``, as torch matches them), or no allowlist at all (``weights_only``
    False), or ``never`` (the resume does not unpickle the file)."""

    loader: str
    allows: FrozenSet[str] = frozenset()
    weights_only: bool = True
    never: bool = False


_NUMPY = frozenset({"numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
                    "numpy.dtypes.UInt32DType"})
_HF_RNG = ResumeLoad("transformers Trainer._load_rng_state: torch.load(weights_only=True) inside "
                     "transformers.trainer_pt_utils.safe_globals()", _NUMPY)
_HF_NEVER = ResumeLoad("transformers' Trainer takes its TrainingArguments from the training script", never=True)
_ACC = ResumeLoad("accelerate load_state: accelerate.utils.load, torch.load(weights_only=True) with "
                  "accelerate.utils.other.TORCH_SAFE_GLOBALS", _NUMPY | {"_codecs.encode"})
_ACC_CUSTOM = ResumeLoad("accelerate load_custom_state: torch.load(weights_only=False)", weights_only=False)
_DS = ResumeLoad("deepspeed TorchCheckpointEngine.load: torch.load(weights_only=False)", weights_only=False)

#: (layout, file role) -> how the producer's resume loads that file
RESUME_LOADS: Dict[Tuple[str, str], ResumeLoad] = {
    ("hf-trainer", "rng"): _HF_RNG,
    ("hf-trainer", "metadata"): _HF_NEVER,
    **{("accelerate", r): _ACC for r in ("weights", "optimizer", "scheduler", "scaler", "rng", "sampler")},
    ("accelerate", "custom"): _ACC_CUSTOM,
    **{("deepspeed", r): _DS for r in ("weights", "optimizer", "mixed")},
}


def resume_load(layout: str, rel: str) -> Optional[ResumeLoad]:
    """How the resume of a ``layout`` unit loads its file ``rel`` (None: plain torch.load(weights_only=True))."""
    from . import roles

    role = roles.roles_for(layout, [rel]).get(rel, "mixed")
    return RESUME_LOADS.get((layout, role))


def unrestricted_loader(loader: str, resume: Optional[ResumeLoad]) -> str:
    """How the resume unpickles this member without any allowlist, in words; "" when its loader is restricted.

    ``pickle.load`` (DCP's ``.metadata``) and a producer's resume that passes ``weights_only=False``
    (:data:`RESUME_LOADS`: DeepSpeed's ``TorchCheckpointEngine.load``,
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
