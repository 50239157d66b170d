"""Classify the imports a pickle asks for into risk tiers, by what they can do; turn them into findings.

Every import found by :func:`ckptaudit.pickle_walk.walk` (including those of
nested pickles and of every stream of the file) falls in one tier; the tables
and their sources are in :mod:`ckptaudit.security.tiers` (allowlists) and :mod:`ckptaudit.security.dangers`:

* ``"weights_only"`` – allowed by ``torch.load(weights_only=True)`` of torch
  2.13 with no extra configuration (encoded as data from
  ``torch/_weights_only_unpickler.py``, checked against the installed torch
  by ``tests/test_security.py``).  No finding.
* ``"dangerous"`` – code execution, file, process, network and import
  machinery, attribute-walking gadgets (``getattr``, ``attrgetter``, dotted
  protocol-4 names that walk through a module attribute), a benign or
  unknown name whose call result is called in turn, a ``defaultdict`` whose
  factory is not a type.  Error, the unit is unusable
  (``malicious_pickle_code_exec``); the walk's tricks (computed
  ``STACK_GLOBAL``, memo rebinding, ``EXT`` codes, nested pickles, hidden
  streams) are errors too (``pickle_obfuscation``).
* ``"benign"`` – data classes of known frameworks, rebuilt from constants
  (``NEWOBJ``/``BUILD`` or ``REDUCE`` of literals), each entry with where and
  in which version it was seen, or listed by the team in
  ``security.allow_globals``.  Warning with the exact
  ``torch.serialization.add_safe_globals([...])`` repair, or info with none
  where the producer's resume accepts them or never unpickles the file
  (:mod:`ckptaudit.security.resume`).  A data class
  called with a computed argument is not data: it becomes unknown.
* ``"unknown"`` – everything else.  A warning (``unknown_pickle_global``)
  naming module and name: ``weights_only=True`` will refuse it.

Dangerous imports cannot be allowlisted through ``extra_allowed`` (torch
itself refuses to allowlist anything from ``sys``, ``os``, ``posix``, ``nt``).

This module imports neither torch nor pickle machinery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import findings
from . import resume as security_resume, tricks as security_tricks
from ..findings import Finding
from ..pickle_walk import WalkResult, normalize_global, walk, walk_streams
from .dangers import DANGEROUS_METHODS, DANGEROUS_MODULES, DANGEROUS_NAMES  # noqa: F401 - re-exported
from .tiers import (
    NUMPY_DTYPES_SRC,
    TORCH_BLOCKED_MODULES,
    WO_SOURCE,
    BENIGN,
    IN_MEMORY_BUFFERS,
    WEIGHTS_ONLY_GLOBALS,
    torch_name,
)
from .usage import judge_usage, numpy_dtype_classes

__all__ = [
    "BENIGN",
    "DANGEROUS_MODULES",
    "DANGEROUS_NAMES",
    "ImportVerdict",
    "WEIGHTS_ONLY_GLOBALS",
    "classify_import",
    "scan",
    "streams",
]



@dataclass
class ImportVerdict:
    """How one imported ``module.name`` is classified, and on what grounds.

    ``category`` is ``weights_only``, ``benign``, ``dangerous`` or
    ``unknown``; ``source`` says where the classification comes from;
    ``add_safe`` (benign only) is the expression to pass to
    ``torch.serialization.add_safe_globals([...])``.
    """

    module: str
    name: str
    category: str
    source: str
    add_safe: str = ""

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


_BUILTIN_TYPES = frozenset({"int", "float", "str", "bytes", "bytearray", "dict", "list", "tuple", "set",
                            "frozenset", "complex", "object", "type", "slice", "range", "bool", "memoryview"})


def _dangerous(module: str, name: str, _depth: int = 0) -> Optional[str]:
    """Why ``module.name`` is in the dangerous tier, or None.

    Besides the tables, a protocol-4 dotted name (resolved attribute by
    attribute, pickle.py ``_getattribute``) is dangerous when it ends in a
    file/process/code method (``pathlib.Path.write_text``), when it walks
    through a module attribute into a dangerous module (``logging.os.system``,
    ``torch.serialization.os.system``), or when it walks through any
    lower-case attribute that is no built-in type (a module, not a class).
    """
    for mod, nm in ((module, name), normalize_global(module, name)):
        full = f"{mod}.{nm}"
        if full in IN_MEMORY_BUFFERS:
            return None  # the _io module's buffers, not its files
        why = _dangerous_in_tables(mod, nm, full)
        if why is not None:
            return why
        steps = nm.split(".")
        if len(steps) >= 2 and _depth <= 4:
            why = _dangerous_dotted(mod, steps, full, _depth)
            if why:
                return why
    return None


def _dangerous_in_tables(mod: str, nm: str, full: str) -> Optional[str]:
    """Why ``mod.nm`` is dangerous by the tables (its name, its class, or a module it lies in); None if not."""
    if full in DANGEROUS_NAMES:
        return DANGEROUS_NAMES[full]
    first = f"{mod}.{nm.split('.', 1)[0]}"  # dotted qualname: Class.method
    if first in DANGEROUS_NAMES:
        return DANGEROUS_NAMES[first]
    parts = mod.split(".")
    for i in range(len(parts), 0, -1):
        src = DANGEROUS_MODULES.get(".".join(parts[:i]))
        if src is not None:
            return src
    return None


def _dangerous_dotted(mod: str, steps: List[str], full: str, depth: int) -> Optional[str]:
    """Why the dotted name ``mod`` + ``steps`` (attribute by attribute) is dangerous, or None."""
    if steps[-1] in DANGEROUS_METHODS:
        return f"dotted name {full} calls the method {steps[-1]!r} (file, process or code operation)"
    for i in range(1, len(steps)):
        inner = _dangerous(".".join(steps[:i]), ".".join(steps[i:]), depth + 1) or \
            _dangerous(f"{mod}.{'.'.join(steps[:i])}", ".".join(steps[i:]), depth + 1)
        if inner is not None:
            return f"dotted name {full} walks attributes into a dangerous name ({inner})"
    if steps[0][:1].islower() and steps[0] not in _BUILTIN_TYPES and mod != "builtins":
        return (f"dotted name {full} walks through the module attribute {mod}.{steps[0]} "
                "(attribute-walking gadget; torch's weights-only unpickler accepts no dotted name)")
    return None


_UNKNOWN_SRC = ("not in torch's weights-only allowlist nor in the tables of known framework data classes: "
                "torch.load(weights_only=True) will refuse it")


def classify_import(module: str, name: str, extra_allowed: Sequence[str] = ()) -> ImportVerdict:
    """Classify one import (names as written in the pickle), by name alone.

    Order: dangerous (cannot be overridden), torch's weights-only default
    allowlist, the team's ``extra_allowed`` (``"pkg.mod.Name"`` strings),
    the table of known framework data classes (``benign``), else unknown.
    :func:`scan` then looks at how each name is used and may move it to
    another tier (a data class called with computed arguments is not data;
    a name whose call result is called again is dangerous).
    """
    src = _dangerous(module, name)
    if src is not None:
        return ImportVerdict(module, name, "dangerous", src)
    full = f"{module}.{name}"
    tname = torch_name(module, name)
    if tname in WEIGHTS_ONLY_GLOBALS and module not in TORCH_BLOCKED_MODULES:
        return ImportVerdict(module, name, "weights_only", WO_SOURCE)
    if full in extra_allowed or tname in extra_allowed:
        return ImportVerdict(module, name, "benign", "security.allow_globals in the audit config",
                             _spelling(module, name))
    b = BENIGN.get(tname) or BENIGN.get(full)
    if b is not None:
        return ImportVerdict(module, name, "benign", b.source, b.add_safe)
    if module == "numpy.dtypes" and name.endswith("DType") and name.isidentifier():
        return ImportVerdict(module, name, "benign", NUMPY_DTYPES_SRC, f"numpy.dtypes.{name}")
    return ImportVerdict(module, name, "unknown", _UNKNOWN_SRC)


def _spelling(module: str, name: str) -> str:
    """Python expression naming ``module.name`` for add_safe_globals.

    torch matches allowlisted objects by ``obj.__module__ + "." + obj.__qualname__``
    against the name in the file after its own Python 2 mapping; when the
    importable Python 3 object lives elsewhere, the ``(obj, "name")`` form is
    needed.  Built-ins are spelled bare, as torch's own error message does.
    """
    target = torch_name(module, name)
    mod, nm = normalize_global(module, name)
    expr = nm if mod == "builtins" else f"{mod}.{nm}"
    if f"{mod}.{nm}" != target:
        return f'({expr}, "{target}")'
    return expr


# -------------------------------------------------------------------- scan


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in sorted(set(names)))


def scan(result: WalkResult, *, path: str, member: str, extra_allowed: Sequence[str] = (),
         loader: str = "auto", resume: Optional["security_resume.ResumeLoad"] = None
         ) -> Tuple[List[ImportVerdict], List[Finding]]:
    """Classify every import of ``result`` (and of its nested pickles); make findings.

    Returns one :class:`ImportVerdict` per distinct import, in order of first
    appearance, and at most one finding per kind for this ``member``:
    ``malicious_pickle_code_exec`` (dangerous), ``unknown_pickle_global``,
    ``non_allowlisted_global_benign`` (with the ``add_safe_globals`` repair) and
    ``pickle_obfuscation`` (the walk's tricks).  Each names every import of
    its category, sorted and quoted.

    ``loader`` says what reads this member: ``"torch.load"`` (weights-only by
    default since torch 2.6, so benign imports need the repair) or
    ``"pickle.load"`` (no allowlist exists, e.g. DCP's
    ``FileSystemReader.read_metadata``: benign imports need nothing and get no
    finding; dangerous and unknown ones are still errors).  ``"auto"`` picks
    ``"pickle.load"`` for a member named ``.metadata`` and ``"torch.load"``
    otherwise.  ``resume`` says how the producer's resume loads the file
    (:func:`ckptaudit.security.resume.resume_load`): benign imports its loader
    accepts, or in a file it never unpickles, are info with no repair.
    """
    if loader == "auto":
        loader = "pickle.load" if member.replace("\\", "/").rsplit("/", 1)[-1] == ".metadata" else "torch.load"
    verdicts = _import_verdicts(result, extra_allowed)
    if resume is not None and resume.allows:
        _allowed_by_resume(verdicts, resume)
    if any(v.category in ("benign", "unknown") for v in verdicts):
        judge_usage(result, verdicts, _UNKNOWN_SRC)
    return verdicts, _scan_findings(result, verdicts, path, member, loader, resume)


def _import_verdicts(result: WalkResult, extra_allowed: Sequence[str]) -> List[ImportVerdict]:
    """One verdict per distinct import of ``result`` and its nested pickles, by name alone, in order of first
    appearance; a name computed while unpickling is unknown."""
    verdicts: List[ImportVerdict] = []
    for g in result.distinct_globals():
        if not g.literal:
            src = ("import by extension-registry code; the name is not in the file" if g.opcode.startswith("EXT")
                   else "name computed while unpickling (STACK_GLOBAL of non-literal operands)")
            verdicts.append(ImportVerdict(g.module, g.name, "unknown", src))
        else:
            verdicts.append(classify_import(g.module, g.name, extra_allowed))
    return verdicts


def _allowed_by_resume(verdicts: List[ImportVerdict], resume) -> None:
    """Unknown names that the producer's resume loader admits by name (``resume.allows``: ultralytics' model
    classes) become benign for this file, in place: judged by what that resume loads, not by the global tables
    (the same class in a file no such resume reads stays unknown)."""
    for v in verdicts:
        if v.category == "unknown" and v.source == _UNKNOWN_SRC and torch_name(v.module, v.name) in resume.allows:
            v.category, v.source = "benign", f"admitted by the resume's own loader ({resume.loader})"
            v.add_safe = _spelling(v.module, v.name)


def _scan_findings(result: WalkResult, verdicts: List[ImportVerdict], path: str, member: str, loader: str,
                   resume) -> List[Finding]:
    """At most one finding per tier of ``verdicts`` (see :func:`scan`), and the walk's tricks."""
    by_cat: Dict[str, List[ImportVerdict]] = {}
    for v in verdicts:
        by_cat.setdefault(v.category, []).append(v)
    out: List[Finding] = []
    if "dangerous" in by_cat:
        names = [v.qualname for v in by_cat["dangerous"]]
        out.append(findings.make("malicious_pickle_code_exec", path=path, member=member,
                                 dangerous=_quoted(names), imports=sorted(set(names))))
    if "unknown" in by_cat:
        out.append(_unknown_finding([v.qualname for v in by_cat["unknown"]], path, member, loader, resume))
    if "benign" in by_cat and loader == "torch.load":
        benign = [(v.qualname, torch_name(v.module, v.name), v.add_safe) for v in by_cat["benign"]]
        dtypes = numpy_dtype_classes(result) if any(
            normalize_global(v.module, v.name) == ("numpy", "dtype") for v in by_cat["benign"]) else []
        out.extend(security_resume.benign_findings(benign, dtypes, path=path, member=member, resume=resume))
    tricks = result.all_tricks()
    if tricks:
        why = "; ".join(tricks[:5]) + (f"; and {len(tricks) - 5} more" if len(tricks) > 5 else "")
        out.append(security_tricks.obfuscation(path, member, why, tricks=tricks))
    return out


def _unknown_finding(names: List[str], path: str, member: str, loader: str, resume) -> Finding:
    """Imports on no list: ``unrestricted_load_imports_unknown`` when the resume's loader imports and calls
    them (an allowlist decides, not a list of dangers), else ``unknown_pickle_global``."""
    unrestricted = security_resume.unrestricted_loader(loader, resume)
    if unrestricted:
        return findings.make("unrestricted_load_imports_unknown", path=path, member=member,
                             unknown=_quoted(names), imports=sorted(set(names)), loader=unrestricted)
    return findings.make("unknown_pickle_global", path=path, member=member,
                         unknown=_quoted(names), imports=sorted(set(names)))


# ----------------------------------------------------------------- streams


def streams(data: Any, first: Optional[WalkResult] = None, *, expected: int = 1,
            max_streams: int = 64) -> WalkResult:
    """Every pickle stream of ``data`` (bytes of a whole file or member) as one result for :func:`scan`.

    ``first`` is the caller's walk of the first stream (walked here when
    None).  The returned result holds every stream as ``nested`` (so their
    imports and tricks are classified) and adds a trick for each stream after
    the ``expected`` ones that imports anything torch's weights-only loader
    would not accept (a loader that reads on — ``pickle.load`` in a loop,
    legacy ``torch.load`` — runs it), and for a legacy torch layout whose
    magic-number record is not a literal (computed while unpickling).
    """
    first = first if first is not None else walk(data)
    out = walk_streams(data, first, max_streams=max_streams)
    combined = WalkResult(obj=first.obj, nested=out, protocol=first.protocol,
                          n_ops=sum(r.n_ops for r in out), end=out[-1].end)
    for i, r in enumerate(out[expected:], expected):
        names = sorted({str(g) for g in r.all_globals()
                        if not g.literal or torch_name(g.module, g.name) not in WEIGHTS_ONLY_GLOBALS})
        if names:
            combined.tricks.append(f"pickle stream {i + 1} (from byte {out[i - 1].end}) follows a complete pickle "
                                   f"and imports {names}: a loader that reads on runs it")
    if len(out) >= 2 and type(out[1].obj) is int and out[1].obj == 1001 and type(first.obj) is not int:
        combined.tricks.append("the legacy torch magic-number record is computed while unpickling "
                               f"({type(first.obj).__name__}), not the literal 0x1950a86a20f9469cfc6c")
    return combined
